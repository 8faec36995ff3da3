//! The admin's statements ([`OutboxAdmin`](outbox_core::admin::OutboxAdmin)
//! on the outbox store): reads, the chunks of its mutations and purges.
//!
//! Reads and chunks that take an
//! [`EventFilter`](outbox_core::admin::EventFilter) are a fixed head, the
//! filter's conditions (each ` AND …`, built per call, with binds numbered
//! after the head's) and a fixed tail.

use outbox_core::{EventStatus, Transition};

use super::store::{replay_set, skip_set};
use super::{COLUMNS, literals};
use crate::schema::Schema;

/// The admin's lock timeout, spelled once for both constants below.
macro_rules! admin_lock_timeout {
    () => {
        "5s"
    };
}

/// How long an admin chunk waits for rows a relay holds.
pub(crate) const ADMIN_LOCK_TIMEOUT: &str = admin_lock_timeout!();

/// How an admin chunk's transaction starts (the same timeout).
pub(crate) const ADMIN_BEGIN: &str = concat!(
    "BEGIN; SET LOCAL lock_timeout = '",
    admin_lock_timeout!(),
    "'"
);

/// What failure groups are made of: the normalized error written with it
/// (migration 5), or the raw error of rows written before (the core
/// normalizes it again when it merges the groups).
pub(crate) const ERROR_KEY: &str = "coalesce(error_group, last_error)";

/// A statement with the filter's conditions between `head` and `tail`.
#[derive(Debug)]
pub(crate) struct FilteredSql {
    /// Up to the filter's conditions.
    pub(crate) head: String,
    /// After them.
    pub(crate) tail: String,
}

/// One chunk of a mutation of the events a filter selects.
#[derive(Debug)]
pub(crate) struct ChunkSql {
    /// The statuses it changes (the filter is restricted to them).
    pub(crate) from: &'static [EventStatus],
    /// The statement.
    pub(crate) sql: FilteredSql,
}

/// The admin's statements.
#[derive(Debug)]
pub(crate) struct AdminSql {
    /// Per status that a report counts by event type (each on its own
    /// partial index): `event_type`, `status`, `n`.
    pub(crate) status_by_type: String,
    /// `sent` and `skipped` rows counted up to `$1`, and the table's
    /// estimated size (`$2`: the schema's name): `sent`, `skipped`,
    /// `estimate`.
    pub(crate) status_done: String,
    /// A page of events: `$1` after this seq, `$2` limit; the filter's
    /// binds from `$3`.
    pub(crate) list: FilteredSql,
    /// The event with id `$1`.
    pub(crate) show: String,
    /// The attempt history of the event with seq `$1`.
    pub(crate) attempts: String,
    /// How many events the filter selects (`n`); its binds from `$1`.
    pub(crate) count: FilteredSql,
    /// The largest seq (`last`).
    pub(crate) last_seq: String,
    /// The first `retry` or `dead` event of aggregate (`$1`, `$2`).
    pub(crate) head: String,
    /// Failure groups' rows (`$1`: rows read at most); the filter's binds
    /// from `$2`.
    pub(crate) groups: FilteredSql,
    /// One chunk of a replay: `$1` after this seq, `$2` limit, `$3` audit
    /// row; the filter's binds from `$4`. Returns `last`, `changed`.
    pub(crate) replay_chunk: ChunkSql,
    /// One chunk of a skip, bound as [`replay_chunk`](Self::replay_chunk).
    pub(crate) skip_chunk: ChunkSql,
    /// One chunk of a retry-now, bound as [`replay_chunk`](Self::replay_chunk).
    pub(crate) retry_now_chunk: ChunkSql,
    /// Deletes up to `$1` attempt rows whose event is gone.
    pub(crate) purge_orphan_attempts: String,
    /// One chunk of the purge of sent and skipped events: `$1` after this
    /// seq, `$2` limit, `$3` published before, `$4` audit row. Returns
    /// `last`, `changed`, `past` (the chunk occurred after `$3`: stop).
    pub(crate) purge_sent_chunk: String,
    /// Deletes up to `$2` inbox entries received before `$1`, counted in
    /// audit row `$3`; returns `n`.
    pub(crate) purge_inbox_chunk: String,
    /// Deletes up to `$2` dead-letter records settled before `$1`.
    pub(crate) purge_dead_letter_records_chunk: String,
}

impl AdminSql {
    pub(crate) fn postgres(schema: &Schema) -> Self {
        let t = schema.table("outbox_events");
        let at = schema.table("outbox_attempts");
        let a = schema.table("outbox_audit");
        let i = schema.table("inbox_events");
        let d = schema.table("inbox_dead_letters");
        let cols = admin_columns();
        // `FOR UPDATE` waits for a row a relay's claim holds (a claim is
        // short and bounded by the claim timeout) instead of skipping it,
        // which would leave it unchanged without a word; `lock_timeout`
        // bounds the wait. After the wait the row's status is checked again.
        let chunk = |set: &str, from: &'static [EventStatus], extra: &str| ChunkSql {
            from,
            sql: FilteredSql {
                head: format!("WITH c AS (SELECT seq FROM {t} WHERE seq > $1"),
                tail: format!(
                    " ORDER BY seq LIMIT $2 FOR UPDATE), \
                 u AS (UPDATE {t} SET {set} WHERE seq IN (SELECT seq FROM c) \
                   AND status IN ({from}){extra} RETURNING seq), \
                 x AS (UPDATE {a} SET count = count + (SELECT count(*) FROM u) WHERE id = $3) \
                 SELECT (SELECT max(seq) FROM c) AS last, (SELECT count(*) FROM u) AS changed",
                    from = literals(from),
                ),
            },
        };
        AdminSql {
            // One query per status, each on its own partial index (a list of
            // statuses would match none and scan the table).
            status_by_type: [
                EventStatus::Pending,
                EventStatus::Retry,
                EventStatus::Held,
                EventStatus::Dead,
            ]
            .map(|status| {
                format!(
                    "(SELECT event_type, '{status}'::text AS status, count(*) AS n FROM {t} \
                     WHERE status = '{status}' GROUP BY event_type)"
                )
            })
            .join(" UNION ALL "),
            status_done: format!(
                "SELECT \
                   (SELECT count(*) FROM (SELECT 1 FROM {t} WHERE status = 'sent' LIMIT $1) s) \
                     AS sent, \
                   (SELECT count(*) FROM (SELECT 1 FROM {t} WHERE status = 'skipped' LIMIT $1) s) \
                     AS skipped, \
                   coalesce((SELECT greatest(c.reltuples, 0)::int8 FROM pg_class c \
                     JOIN pg_namespace n ON n.oid = c.relnamespace \
                     WHERE n.nspname = $2 AND c.relname = 'outbox_events'), 0) AS estimate"
            ),
            list: FilteredSql {
                head: format!("SELECT {cols} FROM {t} WHERE seq > $1"),
                tail: " ORDER BY seq LIMIT $2".to_owned(),
            },
            show: format!("SELECT {cols} FROM {t} WHERE id = $1"),
            attempts: format!(
                "SELECT at, relay, outcome, error FROM {at} WHERE event_seq = $1 ORDER BY id"
            ),
            count: FilteredSql {
                head: format!("SELECT count(*) AS n FROM {t} WHERE true"),
                tail: String::new(),
            },
            // The primary key's last entry: a few pages whatever the table's size.
            last_seq: format!("SELECT max(seq) AS last FROM {t}"),
            // What holds an aggregate back is its first `retry` or `dead`
            // event (a held event always has one before it): one probe of
            // the `blocking` index.
            head: format!(
                "SELECT {cols} FROM {t} WHERE seq = ( \
                   SELECT min(seq) FROM {t} WHERE status IN ({heads}) \
                     AND aggregate_type = $1 AND aggregate_id = $2)",
                heads = literals(&[EventStatus::Retry, EventStatus::Dead]),
            ),
            groups: FilteredSql {
                head: format!(
                    "SELECT event_type, {ERROR_KEY} AS last_error, status, count(*) AS n, \
                       min(occurred_at) AS first, max(occurred_at) AS last \
                     FROM {t} WHERE last_error IS NOT NULL"
                ),
                tail: " GROUP BY 1, 2, 3 LIMIT $1".to_owned(),
            },
            // The table's trigger releases, in the same statement, the
            // events the replayed ones held back.
            replay_chunk: chunk(&replay_set(), Transition::Replay.from(), ""),
            skip_chunk: chunk(&skip_set(), Transition::Skip.from(), ""),
            retry_now_chunk: chunk(
                "next_attempt_at = now()",
                &[EventStatus::Retry],
                " AND next_attempt_at > now()",
            ),
            purge_orphan_attempts: format!(
                "DELETE FROM {at} WHERE id IN ( \
                   SELECT id FROM {at} a \
                   WHERE NOT EXISTS (SELECT 1 FROM {t} e WHERE e.seq = a.event_seq) \
                   LIMIT $1 FOR UPDATE SKIP LOCKED)"
            ),
            // `s`: the next `limit` rows by seq, whatever their status (never
            // rescanning from the head). A chunk whose rows all occurred
            // after `before` ends the run: nothing later was published
            // before it.
            purge_sent_chunk: format!(
                "WITH s AS (SELECT seq, occurred_at FROM {t} WHERE seq > $1 ORDER BY seq LIMIT $2), \
                 d AS (DELETE FROM {t} WHERE seq IN ( \
                     SELECT seq FROM {t} WHERE seq IN (SELECT seq FROM s) AND status IN ({done}) \
                       AND coalesce(published_at, finished_at, occurred_at) < $3 \
                       FOR UPDATE SKIP LOCKED) \
                   RETURNING seq), \
                 x AS (DELETE FROM {at} WHERE event_seq IN (SELECT seq FROM d)), \
                 u AS (UPDATE {a} SET count = count + (SELECT count(*) FROM d) WHERE id = $4) \
                 SELECT (SELECT max(seq) FROM s) AS last, (SELECT count(*) FROM d) AS changed, \
                   coalesce((SELECT min(occurred_at) >= $3 FROM s), true) AS past",
                done = literals(&[EventStatus::Sent, EventStatus::Skipped]),
            ),
            purge_inbox_chunk: format!(
                "WITH d AS (DELETE FROM {i} WHERE (consumer, event_id) IN ( \
                     SELECT consumer, event_id FROM {i} WHERE received_at < $1 \
                     ORDER BY received_at LIMIT $2 FOR UPDATE SKIP LOCKED) RETURNING 1), \
                 u AS (UPDATE {a} SET count = count + (SELECT count(*) FROM d) WHERE id = $3) \
                 SELECT count(*) AS n FROM d"
            ),
            purge_dead_letter_records_chunk: format!(
                "DELETE FROM {d} WHERE id IN ( \
                   SELECT id FROM {d} WHERE coalesce(replayed_at, purged_at) < $1 \
                   ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED)"
            ),
        }
    }
}

/// The columns of an admin read: a row whose headers are not JSON (a
/// malformed row) reads as `null` rather than failing the listing.
fn admin_columns() -> String {
    COLUMNS.replace(
        "headers::text AS headers",
        "coalesce(headers::text, 'null') AS headers",
    )
}
