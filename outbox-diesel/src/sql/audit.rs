//! The audit trail (`outbox_audit`), shared by the outbox store's admin
//! verbs and [`PgDeadLetters`](crate::PgDeadLetters).

use crate::schema::Schema;

/// The audit trail's statements.
#[derive(Debug)]
pub(crate) struct AuditSql {
    /// Starts a row (`$1` identity, `$2` action, `$3` target as `jsonb`);
    /// returns its `id`.
    pub(crate) begin: String,
    /// Sets row `$1`'s count to `$2` when that is not NULL, and ends it with
    /// outcome `$3` when that is not NULL.
    pub(crate) record: String,
    /// Up to `$2` rows with an id below `$1`, newest first.
    pub(crate) log: String,
}

impl AuditSql {
    pub(crate) fn postgres(schema: &Schema) -> Self {
        let a = schema.table("outbox_audit");
        AuditSql {
            begin: format!(
                "INSERT INTO {a} (identity, action, target) VALUES ($1, $2, $3) RETURNING id"
            ),
            record: format!(
                "UPDATE {a} SET count = coalesce($2, count), \
                 finished_at = CASE WHEN $3::text IS NULL THEN finished_at ELSE now() END, \
                 outcome = coalesce($3, outcome) WHERE id = $1"
            ),
            log: format!(
                "SELECT id, at, identity, action, target::text AS target, count, finished_at, \
                   outcome FROM {a} \
                 WHERE id < $1 ORDER BY id DESC LIMIT $2"
            ),
        }
    }
}
