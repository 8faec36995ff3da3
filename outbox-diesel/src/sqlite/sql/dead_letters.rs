//! The consumers' dead letters' statements on SQLite
//! (`docs/design/sqlite-statements.md`, "Consumers' dead letters"), read
//! and settled by [`SqliteDeadLetters`](crate::sqlite::SqliteDeadLetters);
//! the insert is the inbox's ([`SqliteSql`](super::SqliteSql)).

use std::sync::{Arc, OnceLock};

/// The columns a dead-letter row is read from.
const COLUMNS: &str = "id, consumer, queue, exchange, routing_key, event_id, message_id, \
                       event_type, attempts, reason, headers, payload, payload_truncated, \
                       dead_lettered_at, replayed_at, purged_at";

#[derive(Debug)]
pub(crate) struct SqliteDeadLetterSql {
    /// Binds: queue (nullable: every queue), after id, settled ones too,
    /// limit. Rows: the records, with payloads and headers.
    pub(crate) list: String,
    /// [`list`](Self::list) without reading payloads and headers (empty).
    pub(crate) list_without_payloads: String,
    /// Binds: id. Row: the record.
    pub(crate) show: String,
    /// Binds: queue (nullable), rows read at most. Rows: `consumer`,
    /// `event_type`, `reason`, `n`, `first`, `last` of the open records.
    pub(crate) groups: String,
    /// Binds: dead-letter ids (JSON array), `[event_id, queue]` pairs (JSON
    /// array), now. Marks replayed the records with those ids and, per
    /// pair, the oldest open record without one.
    pub(crate) mark_replayed: String,
    /// Row: `id`, the largest record id (0 for none).
    pub(crate) watermark: String,
    /// Binds: queues (JSON array), up to id, now.
    pub(crate) mark_purged: String,
}

impl SqliteDeadLetterSql {
    fn render() -> Self {
        let list = |columns: &str| {
            format!(
                "SELECT {columns} FROM inbox_dead_letters \
                 WHERE (?1 IS NULL OR queue = ?1) AND id > ?2 \
                   AND (?3 OR (replayed_at IS NULL AND purged_at IS NULL)) \
                 ORDER BY id LIMIT ?4"
            )
        };
        SqliteDeadLetterSql {
            list: list(COLUMNS),
            list_without_payloads: list(
                &COLUMNS.replace("headers, payload,", "'{}' AS headers, '' AS payload,"),
            ),
            show: format!("SELECT {COLUMNS} FROM inbox_dead_letters WHERE id = ?1"),
            groups: "SELECT consumer, event_type, reason, count(*) AS n, \
                       min(dead_lettered_at) AS first, max(dead_lettered_at) AS last \
                     FROM inbox_dead_letters \
                     WHERE (?1 IS NULL OR queue = ?1) AND replayed_at IS NULL \
                       AND purged_at IS NULL \
                     GROUP BY consumer, event_type, reason LIMIT ?2"
                .to_owned(),
            // `json_type(…) IS NULL` is PostgreSQL's `NOT (headers ? key)`;
            // the id lookup spells the expression as the
            // `inbox_dead_letters_letter_id` index does.
            mark_replayed: "WITH want AS ( \
                              SELECT w.value ->> 0 AS e, w.value ->> 1 AS q, count(*) AS n \
                              FROM json_each(?2) AS w GROUP BY 1, 2 \
                            ), oldest AS ( \
                              SELECT d.id, want.n, \
                                row_number() OVER (PARTITION BY d.event_id, d.queue \
                                  ORDER BY d.id) AS rn \
                              FROM inbox_dead_letters d \
                              JOIN want ON d.event_id = want.e AND d.queue = want.q \
                              WHERE d.replayed_at IS NULL AND d.purged_at IS NULL \
                                AND json_type(d.headers, '$.\"x-outbox-dead-letter-id\"') IS NULL \
                            ) \
                            UPDATE inbox_dead_letters SET replayed_at = ?3 \
                            WHERE replayed_at IS NULL AND purged_at IS NULL AND id IN ( \
                              SELECT id FROM inbox_dead_letters \
                              WHERE headers ->> '$.\"x-outbox-dead-letter-id\"' IN ( \
                                SELECT value FROM json_each(?1)) \
                              UNION ALL \
                              SELECT id FROM oldest WHERE rn <= n)"
                .to_owned(),
            watermark: "SELECT coalesce(max(id), 0) AS id FROM inbox_dead_letters".to_owned(),
            mark_purged: "UPDATE inbox_dead_letters SET purged_at = ?3 \
                          WHERE queue IN (SELECT value FROM json_each(?1)) AND id <= ?2 \
                            AND replayed_at IS NULL AND purged_at IS NULL"
                .to_owned(),
        }
    }

    /// The text, rendered once per process.
    pub(crate) fn shared() -> Arc<Self> {
        static SQL: OnceLock<Arc<SqliteDeadLetterSql>> = OnceLock::new();
        Arc::clone(SQL.get_or_init(|| Arc::new(SqliteDeadLetterSql::render())))
    }
}
