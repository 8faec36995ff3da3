//! The SQLite back end's SQL text (`docs/design/sqlite-statements.md`):
//! one statement per text (diesel's `SqliteConnection` runs the first
//! statement of a `sql_query` and ignores the rest), numbered `?NNN`
//! binds, times as INTEGER microseconds since the Unix epoch.
//!
//! One database file is one outbox, so no table is qualified and the text
//! is the same for every outbox: rendered once per process.

mod admin;
mod dead_letters;

use std::sync::{Arc, OnceLock};

pub(crate) use admin::{ChunkSql, ERROR_KEY, SqliteAdminSql};
pub(crate) use dead_letters::SqliteDeadLetterSql;

/// The columns an `INSERT` of events names, in bind order: id (uuid text),
/// aggregate type, aggregate id, aggregate version (nullable `BigInt`),
/// event type, schema version (`Integer`), payload (text), headers (JSON
/// object text), occurred at (`BigInt` µs).
const EVENT_COLUMNS: &str = "id, aggregate_type, aggregate_id, aggregate_version, event_type, \
    schema_version, payload, headers, occurred_at";

#[derive(Debug)]
pub(crate) struct SqliteSql {
    /// One event; binds as [`EVENT_COLUMNS`].
    pub(crate) record_one: String,
    /// Any number of events in one statement; one bind: a JSON array of
    /// rows, one per event in record order, `[id, aggregate_type,
    /// aggregate_id, aggregate_version|null, event_type, schema_version,
    /// payload, headers, occurred_at_us]`, payload and headers as JSON
    /// strings (their text, escaped) so that `->>` returns the exact text.
    /// Seqs follow the array's order (`ORDER BY u.key`); no limit on the
    /// number of events (SQLite's limit on binds does not apply).
    pub(crate) record_many: String,
    /// Records a delivery (binds: consumer, event id, received at µs): 1
    /// row changed means first time, 0 a duplicate.
    pub(crate) inbox_insert: String,
    /// Deletes up to `?2` entries received before `?1` (µs), oldest first.
    pub(crate) inbox_purge: String,
    /// A consumer's dead letter; binds: consumer, queue, exchange, routing
    /// key, event id (nullable text), message id, event type (nullable),
    /// attempts, reason, headers (JSON text), payload, truncated, when (µs).
    pub(crate) dead_letter_insert: String,
}

impl SqliteSql {
    fn render() -> Self {
        SqliteSql {
            record_one: format!(
                "INSERT INTO outbox_events ({EVENT_COLUMNS}) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
            ),
            record_many: format!(
                "INSERT INTO outbox_events ({EVENT_COLUMNS}) \
                 SELECT u.value ->> 0, u.value ->> 1, u.value ->> 2, u.value ->> 3, \
                 u.value ->> 4, u.value ->> 5, u.value ->> 6, u.value ->> 7, u.value ->> 8 \
                 FROM json_each(?1) AS u ORDER BY u.key"
            ),
            inbox_insert: "INSERT INTO inbox_events (consumer, event_id, received_at) \
                           VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING"
                .to_owned(),
            inbox_purge: "DELETE FROM inbox_events WHERE (consumer, event_id) IN ( \
                          SELECT consumer, event_id FROM inbox_events WHERE received_at < ?1 \
                          ORDER BY received_at LIMIT ?2)"
                .to_owned(),
            dead_letter_insert: "INSERT INTO inbox_dead_letters (consumer, queue, exchange, \
                                 routing_key, event_id, message_id, event_type, attempts, reason, \
                                 headers, payload, payload_truncated, dead_lettered_at) \
                                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"
                .to_owned(),
        }
    }

    /// The text, rendered once per process.
    pub(crate) fn shared() -> Arc<Self> {
        static SQL: OnceLock<Arc<SqliteSql>> = OnceLock::new();
        Arc::clone(SQL.get_or_init(|| Arc::new(SqliteSql::render())))
    }
}

/// Microseconds since the Unix epoch: how every time is stored.
pub(crate) fn micros(at: chrono::DateTime<chrono::Utc>) -> i64 {
    at.timestamp_micros()
}

/// A stored time read back, for the admin's reports (the epoch when out of
/// chrono's range: another writer's value).
pub(crate) fn time(micros: i64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_micros(micros).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_are_numbered_in_order() {
        let sql = SqliteSql::shared();
        assert!(sql.record_one.ends_with("?9)"), "{}", sql.record_one);
        assert_eq!(sql.record_many.matches('?').count(), 1);
        assert!(sql.dead_letter_insert.ends_with("?13)"));
        for text in [&sql.record_one, &sql.record_many, &sql.inbox_insert] {
            assert!(!text.contains(';'), "one statement per text: {text}");
        }
    }
}
