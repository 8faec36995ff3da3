//! The inbox's statements ([`PgInbox`](crate::PgInbox)).

use crate::schema::Schema;

/// The inbox's statements.
#[derive(Debug)]
pub(crate) struct InboxSql {
    /// Records a delivery (`$1` consumer, `$2` event id); one row
    /// inserted means first time, none a duplicate.
    pub(crate) insert: String,
    /// Deletes up to `$2` entries received before `$1`.
    pub(crate) purge: String,
}

impl InboxSql {
    pub(crate) fn postgres(schema: &Schema) -> Self {
        let t = schema.table("inbox_events");
        InboxSql {
            insert: format!(
                "INSERT INTO {t} (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING"
            ),
            purge: format!(
                "DELETE FROM {t} WHERE ctid IN ( \
                   SELECT ctid FROM {t} WHERE received_at < $1 ORDER BY received_at LIMIT $2)"
            ),
        }
    }
}
