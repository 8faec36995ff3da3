//! The consumers' dead letters (`inbox_dead_letters`) on MariaDB, read and
//! settled by [`MysqlDeadLetters`](crate::mysql::MysqlDeadLetters): the
//! texts of `docs/design/mysql-statements.md` section 8.

use super::MysqlSql;

/// The columns a dead-letter row is read from.
const COLUMNS: &str = "id, consumer, queue, exchange, routing_key, event_id, message_id, \
                       event_type, attempts, reason, headers, payload, payload_truncated, \
                       dead_lettered_at, replayed_at, purged_at";

/// The dead letters' statements.
#[derive(Debug)]
pub(crate) struct MysqlDeadLetterSql {
    /// The table (for `Debug` output).
    pub(crate) table: String,
    /// Binds: queue (nullable), queue again, after id, settled ones too,
    /// limit. With payloads and headers.
    pub(crate) list: String,
    /// [`list`](Self::list) without reading payloads and headers.
    pub(crate) list_without_payloads: String,
    /// Binds: id.
    pub(crate) show: String,
    /// Binds: queue (nullable), queue again, rows read at most. Open
    /// records by consumer, event type and reason: `consumer`,
    /// `event_type`, `reason`, `n`, `first`, `last`.
    pub(crate) groups: String,
    /// Binds: dead-letter ids (JSON array), (event id, queue) pairs (JSON
    /// `[[event_id, queue], …]`). Marks replayed the records with those
    /// ids and, per pair, the oldest open record without an id.
    pub(crate) mark_replayed: String,
    /// Row: `id`, the largest record id (0 for none).
    pub(crate) watermark: String,
    /// Binds: queues (JSON array), up to id. Marks their open records
    /// purged.
    pub(crate) mark_purged: String,
}

impl MysqlDeadLetterSql {
    pub(crate) fn new(shared: &MysqlSql) -> Self {
        let t = shared.table("inbox_dead_letters");
        let list = |columns: &str| {
            format!(
                "SELECT {columns} FROM {t} \
                 WHERE (? IS NULL OR queue = ?) AND id > ? \
                   AND (? OR (replayed_at IS NULL AND purged_at IS NULL)) \
                 ORDER BY id LIMIT ?"
            )
        };
        MysqlDeadLetterSql {
            list: list(COLUMNS),
            list_without_payloads: list(
                &COLUMNS.replace("headers, payload,", "'{}' AS headers, '' AS payload,"),
            ),
            show: format!("SELECT {COLUMNS} FROM {t} WHERE id = ?"),
            groups: format!(
                "SELECT consumer, event_type, reason, COUNT(*) AS n, \
                   MIN(dead_lettered_at) AS first, MAX(dead_lettered_at) AS last \
                 FROM {t} \
                 WHERE (? IS NULL OR queue = ?) AND replayed_at IS NULL AND purged_at IS NULL \
                 GROUP BY consumer, event_type, reason LIMIT ?"
            ),
            mark_replayed: format!(
                "UPDATE ( \
                   SELECT x.id \
                   FROM JSON_TABLE(?, '$[*]' COLUMNS ( \
                     letter_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin \
                       PATH '$')) AS l \
                   JOIN {t} AS x ON x.dead_letter_id = l.letter_id \
                   UNION \
                   SELECT o.id FROM ( \
                     SELECT y.id, w.n, \
                       ROW_NUMBER() OVER (PARTITION BY y.event_id, y.queue ORDER BY y.id) AS rn \
                     FROM ( \
                       SELECT w0.e, w0.q, COUNT(*) AS n \
                       FROM JSON_TABLE(?, '$[*]' COLUMNS ( \
                         e CHAR(36) CHARACTER SET ascii COLLATE ascii_bin PATH '$[0]', \
                         q VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin \
                           PATH '$[1]')) AS w0 \
                       GROUP BY w0.e, w0.q \
                     ) AS w \
                     JOIN {t} AS y ON y.queue = w.q AND y.event_id = w.e \
                     WHERE y.replayed_at IS NULL AND y.purged_at IS NULL \
                       AND NOT JSON_EXISTS(y.headers, '$.\"x-outbox-dead-letter-id\"') \
                   ) AS o WHERE o.rn <= o.n \
                 ) AS m \
                 STRAIGHT_JOIN {t} AS d FORCE INDEX (PRIMARY) ON d.id = m.id \
                 SET d.replayed_at = UTC_TIMESTAMP(6) \
                 WHERE d.replayed_at IS NULL AND d.purged_at IS NULL"
            ),
            watermark: format!("SELECT COALESCE(MAX(id), 0) AS id FROM {t}"),
            mark_purged: format!(
                "UPDATE ( \
                   SELECT DISTINCT j.q FROM JSON_TABLE(?, '$[*]' COLUMNS ( \
                     q VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin PATH '$')) \
                     AS j \
                 ) AS qs \
                 STRAIGHT_JOIN {t} AS d ON d.queue = qs.q \
                 SET d.purged_at = UTC_TIMESTAMP(6) \
                 WHERE d.id <= ? AND d.replayed_at IS NULL AND d.purged_at IS NULL"
            ),
            table: t,
        }
    }
}
