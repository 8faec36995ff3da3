//! The MariaDB back end's SQL text, rendered once per database (like
//! PostgreSQL's `sql` module, in MySQL's dialect: positional `?` binds,
//! each bound once and in order).

use std::sync::{Arc, OnceLock};

pub(crate) mod admin;
pub(crate) mod dead_letters;

use crate::{Error, Result};

/// The columns an `INSERT` of events names, in bind order: id (`CHAR(36)`
/// text), aggregate type, aggregate id, aggregate version (nullable
/// `BIGINT`), event type, schema version (`INT`), payload (text), headers
/// (JSON object text), occurred at (`DATETIME(6)`, UTC).
const EVENT_COLUMNS: &str = "id, aggregate_type, aggregate_id, aggregate_version, event_type, \
    schema_version, payload, headers, occurred_at";

/// The guard of every `INSERT` that must never autocommit: after a
/// deadlock the server has rolled the transaction back while diesel still
/// counts it open, and a plain `INSERT` would commit on its own.
///
/// `@@autocommit = 1` too: in a session with autocommit off, the statement
/// after a deadlock silently starts a new transaction (`@@in_transaction`
/// is 1 again), which a later commit would commit on its own. Such
/// sessions are refused.
pub(crate) const IN_TRANSACTION: &str = "@@in_transaction = 1 AND @@autocommit = 1";

/// Whether the server has a transaction open on the connection (`open`:
/// 1 or 0), for statements that cannot carry [`IN_TRANSACTION`]. Run
/// right before such a statement: a deadlock can only roll the
/// transaction back while a statement of its own waits for a lock, so
/// nothing can end it in between.
pub(crate) const IN_TRANSACTION_PROBE: &str =
    "SELECT CAST(@@in_transaction = 1 AND @@autocommit = 1 AS SIGNED) AS open";

/// The most events one `INSERT` takes ([`MysqlSql::record_many`]): a
/// prepared statement has at most 65,535 placeholders (9 per event).
pub(crate) const RECORD_CHUNK: usize = 1_000;

#[derive(Debug)]
pub(crate) struct MysqlSql {
    /// The database named by the settings; `None`: the connection's own.
    pub(crate) database: Option<String>,
    /// "`db`." or "".
    prefix: String,
    /// One event: `INSERT … SELECT ?, … FROM DUAL WHERE` [`IN_TRANSACTION`].
    pub(crate) record_one: String,
    /// Records a delivery (binds: consumer, event id): 1 row affected means
    /// first time, 2 a duplicate (the driver reports found rows: an
    /// `ON DUPLICATE KEY UPDATE` that changes the row counts 2), 0 that no
    /// transaction is open.
    pub(crate) inbox_insert: String,
    /// Deletes up to `?` (second bind) entries received before `?` (first).
    pub(crate) inbox_purge: String,
    /// A consumer's dead letter; binds: consumer, queue, exchange, routing
    /// key, event id (nullable text), message id, event type (nullable),
    /// attempts, reason, headers (JSON text), payload, truncated, when.
    pub(crate) dead_letter_insert: String,
}

impl MysqlSql {
    pub(crate) fn new(database: Option<&str>) -> Result<Self> {
        if let Some(name) = database
            && (name.is_empty() || name.len() > 64 || name.contains('\0'))
        {
            return Err(Error::Config(format!(
                "database name {name:?} must be 1 to 64 bytes without NUL"
            )));
        }
        Ok(MysqlSql::render(database))
    }

    fn render(database: Option<&str>) -> Self {
        let prefix = database.map_or_else(String::new, |name| format!("{}.", quote(name)));
        let table = |name: &str| format!("{prefix}{name}");
        let events = table("outbox_events");
        let inbox = table("inbox_events");
        MysqlSql {
            record_one: format!(
                "INSERT INTO {events} ({EVENT_COLUMNS}) \
                 SELECT ?, ?, ?, ?, ?, ?, ?, ?, ? FROM DUAL WHERE {IN_TRANSACTION}"
            ),
            inbox_insert: format!(
                "INSERT INTO {inbox} (consumer, event_id) SELECT ?, ? FROM DUAL \
                 WHERE {IN_TRANSACTION} ON DUPLICATE KEY UPDATE duplicates = duplicates + 1"
            ),
            inbox_purge: format!(
                "DELETE FROM {inbox} WHERE received_at < ? ORDER BY received_at LIMIT ?"
            ),
            dead_letter_insert: format!(
                "INSERT INTO {letters} (consumer, queue, exchange, routing_key, event_id, \
                 message_id, event_type, attempts, reason, headers, payload, payload_truncated, \
                 dead_lettered_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                letters = table("inbox_dead_letters"),
            ),
            database: database.map(str::to_owned),
            prefix,
        }
    }

    /// The default database's, rendered once per process.
    pub(crate) fn default_database() -> Arc<Self> {
        static DEFAULT: OnceLock<Arc<MysqlSql>> = OnceLock::new();
        Arc::clone(DEFAULT.get_or_init(|| Arc::new(MysqlSql::render(None))))
    }

    /// `table`, qualified by the database if one is named.
    pub(crate) fn table(&self, table: &str) -> String {
        format!("{}{table}", self.prefix)
    }

    /// `n` (≥ 2) events in one `INSERT … VALUES (…), (…)`, numbered in
    /// order, binds as [`record_one`](Self::record_one) event after event.
    /// Unguarded: the recorder runs [`IN_TRANSACTION_PROBE`] first. (An
    /// `INSERT … SELECT` from a `UNION ALL` of bound rows could carry the
    /// guard, but MariaDB types the derived table's columns from the
    /// statement, not the values, and cut a 1 MiB payload to 10 bytes
    /// without an error.) Its text depends on `n`: not kept prepared.
    pub(crate) fn record_many(&self, n: usize) -> String {
        let row = "(?, ?, ?, ?, ?, ?, ?, ?, ?)";
        format!(
            "INSERT INTO {events} ({EVENT_COLUMNS}) VALUES {rows}",
            events = self.table("outbox_events"),
            rows = vec![row; n].join(", "),
        )
    }
}

/// `` `name` ``: a quoted MySQL identifier.
pub(crate) fn quote(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_database_qualifies_every_table() -> Result<()> {
        let sql = MysqlSql::new(Some("bill`ing"))?;
        for text in [
            &sql.record_one,
            &sql.inbox_insert,
            &sql.inbox_purge,
            &sql.record_many(3),
        ] {
            assert!(text.contains("`bill``ing`."), "{text}");
        }
        let default = MysqlSql::default_database();
        assert!(default.record_one.starts_with("INSERT INTO outbox_events "));
        Ok(())
    }

    #[test]
    fn many_events_bind_nine_values_each() {
        let sql = MysqlSql::default_database().record_many(3);
        assert_eq!(sql.matches('?').count(), 27, "{sql}");
        assert!(!sql.contains("SELECT"), "{sql}");
    }

    #[test]
    fn database_names_are_checked() {
        assert!(MysqlSql::new(Some("")).is_err());
        assert!(MysqlSql::new(Some(&"x".repeat(65))).is_err());
        assert!(MysqlSql::new(Some("a\0b")).is_err());
    }
}
