//! The consumers' dead letters (`inbox_dead_letters`): recorded by the
//! inbox, read and settled by [`PgDeadLetters`](crate::PgDeadLetters).

use crate::schema::Schema;

/// The columns a dead-letter row is read from.
const COLUMNS: &str = "id, consumer, queue, exchange, routing_key, event_id, message_id, \
                       event_type, attempts, reason, headers, payload, payload_truncated, \
                       dead_lettered_at, replayed_at, purged_at";

/// The dead letters' statements.
#[derive(Debug)]
pub(crate) struct DeadLetterSql {
    /// The table, quoted (for `Debug` output).
    pub(crate) table: String,
    /// Records one dead letter (`$1` consumer, `$2` queue, `$3` exchange,
    /// `$4` routing key, `$5` event id, `$6` message id, `$7` event type,
    /// `$8` attempts, `$9` reason, `$10` headers as `jsonb`, `$11` payload,
    /// `$12` payload truncated, `$13` dead-lettered at).
    pub(crate) insert: String,
    /// A page of records (`$1` queue or NULL for all, `$2` after this id,
    /// `$3` settled ones too, `$4` limit), with payloads and headers.
    pub(crate) list: String,
    /// [`list`](Self::list) without reading payloads and headers (empty).
    pub(crate) list_without_payloads: String,
    /// Record `$1`.
    pub(crate) show: String,
    /// Open records grouped by consumer, event type and reason (`$1` queue
    /// or NULL, `$2` rows read at most); columns `consumer`, `event_type`,
    /// `reason`, `n`, `first`, `last`.
    pub(crate) groups: String,
    /// Marks replayed the records with dead-letter ids `$1` and, per
    /// (event id `$2`, queue `$3`) pair, the oldest open record without one.
    pub(crate) mark_replayed: String,
    /// The largest record id (0 for none), as `id`.
    pub(crate) watermark: String,
    /// Marks purged the open records of queues `$1` up to id `$2`.
    pub(crate) mark_purged: String,
}

impl DeadLetterSql {
    pub(crate) fn postgres(schema: &Schema) -> Self {
        let t = schema.table("inbox_dead_letters");
        let list = |columns: &str| {
            format!(
                "SELECT {columns} FROM {t} WHERE ($1::text IS NULL OR queue = $1) AND id > $2 \
                 AND ($3 OR (replayed_at IS NULL AND purged_at IS NULL)) ORDER BY id LIMIT $4"
            )
        };
        DeadLetterSql {
            insert: format!(
                "INSERT INTO {t} (consumer, queue, exchange, routing_key, event_id, message_id, \
                 event_type, attempts, reason, headers, payload, payload_truncated, \
                 dead_lettered_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
            ),
            list: list(COLUMNS),
            list_without_payloads: list(&COLUMNS.replace(
                "headers, payload,",
                "'{}'::jsonb AS headers, '' AS payload,",
            )),
            show: format!("SELECT {COLUMNS} FROM {t} WHERE id = $1"),
            groups: format!(
                "SELECT consumer, event_type, reason, count(*) AS n, \
                 min(dead_lettered_at) AS first, max(dead_lettered_at) AS last FROM {t} \
                 WHERE ($1::text IS NULL OR queue = $1) AND replayed_at IS NULL \
                 AND purged_at IS NULL \
                 GROUP BY consumer, event_type, reason LIMIT $2"
            ),
            mark_replayed: format!(
                "WITH want AS ( \
                   SELECT e, q, count(*) AS n FROM unnest($2::uuid[], $3::text[]) AS w(e, q) \
                   GROUP BY e, q), \
                 oldest AS ( \
                   SELECT d.id, w.n, row_number() OVER (PARTITION BY d.event_id, d.queue \
                     ORDER BY d.id) AS rn \
                   FROM {t} d JOIN want w ON d.event_id = w.e AND d.queue = w.q \
                   WHERE d.replayed_at IS NULL AND d.purged_at IS NULL \
                   AND NOT (d.headers ? 'x-outbox-dead-letter-id')) \
                 UPDATE {t} SET replayed_at = now() \
                 WHERE replayed_at IS NULL AND purged_at IS NULL AND id IN ( \
                   SELECT id FROM {t} WHERE (headers ->> 'x-outbox-dead-letter-id') = ANY($1) \
                   UNION ALL \
                   SELECT id FROM oldest WHERE rn <= n)"
            ),
            watermark: format!("SELECT coalesce(max(id), 0) AS id FROM {t}"),
            mark_purged: format!(
                "UPDATE {t} SET purged_at = now() WHERE queue = ANY($1) AND id <= $2 \
                 AND replayed_at IS NULL AND purged_at IS NULL"
            ),
            table: t,
        }
    }
}
