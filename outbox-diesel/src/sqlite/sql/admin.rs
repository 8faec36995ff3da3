//! The admin's statements on SQLite (`docs/design/sqlite-statements.md`,
//! sections "Admin", "Audit trail" and "Relay registry"): reads, the
//! chunks of its mutations, the purges, the audit trail and the relay
//! registry as the admin sees it.
//!
//! Where PostgreSQL runs one statement with data-modifying CTEs (SQLite has
//! none), the store runs the catalogue's "n of m" statements in order in
//! one `BEGIN IMMEDIATE`; the audit count of such a pipeline is
//! [`add_count`](SqliteAdminSql::add_count), run last with the change's row
//! count. Statements that take an
//! [`EventFilter`](outbox_core::admin::EventFilter) are a fixed head, the
//! filter's conditions (each ` AND …`, binds numbered after the head's)
//! and a fixed tail.

use std::sync::{Arc, OnceLock};

use outbox_core::{EventStatus, Transition};

use super::super::store::COLUMNS;

/// A statement with the filter's conditions between `head` and `tail`.
#[derive(Debug)]
pub(crate) struct FilteredSql {
    /// Up to the filter's conditions.
    pub(crate) head: String,
    /// After them.
    pub(crate) tail: String,
}

/// One chunk of a replay, skip or retry-now: the statuses it changes (the
/// filter is restricted to them), the leased check and the change.
#[derive(Debug)]
pub(crate) struct ChunkSql {
    /// The statuses it changes.
    pub(crate) from: &'static [EventStatus],
    /// Binds: seqs (JSON), now. Row: `n`, the rows of the chunk a live
    /// lease holds (a relay is publishing them).
    pub(crate) leased: String,
    /// Binds: seqs (JSON), and now when [`binds_now`](Self::binds_now).
    /// Rows changed: the chunk's count.
    pub(crate) change: String,
    /// Whether [`change`](Self::change) binds now as `?2` (a bind past the
    /// text's highest number fails).
    pub(crate) binds_now: bool,
}

/// The admin's statements.
#[derive(Debug)]
pub(crate) struct SqliteAdminSql {
    /// Rows: `event_type`, `status`, `n`, per status a report counts by
    /// event type.
    pub(crate) status_by_type: String,
    /// Binds: count up to. Row: `sent`, `skipped` (counted up to the bind),
    /// `estimate` (every row, exactly: SQLite keeps no estimate).
    pub(crate) status_done: String,
    /// A page of events: `?1` after this seq, `?2` limit; the filter's
    /// binds from `?3`.
    pub(crate) list: FilteredSql,
    /// Binds: event id. Row: the event.
    pub(crate) show: String,
    /// Binds: seq. Rows: the event's attempts, oldest first.
    pub(crate) attempts: String,
    /// Row: `n`, the events the filter selects; its binds from `?1`.
    pub(crate) count: FilteredSql,
    /// Row: `last`, the largest seq (NULL: empty).
    pub(crate) last_seq: String,
    /// Binds: aggregate type, aggregate id. Row: its first `retry` or
    /// `dead` event.
    pub(crate) head: String,
    /// Failure groups' rows: `?1` rows read at most; the filter's binds
    /// from `?2`.
    pub(crate) groups: FilteredSql,
    /// A chunk's seqs: `?1` after this seq, `?2` limit; the filter's binds
    /// from `?3`. Rows: `seq`.
    pub(crate) chunk: FilteredSql,
    /// The change of a replay chunk.
    pub(crate) replay: ChunkSql,
    /// The change of a skip chunk.
    pub(crate) skip: ChunkSql,
    /// The change of a retry-now chunk.
    pub(crate) retry_now: ChunkSql,
    /// Binds: audit row, count. Adds the count to the row.
    pub(crate) add_count: String,
    /// Binds: limit. Deletes attempt rows whose event is gone.
    pub(crate) purge_orphan_attempts: String,
    /// Binds: after seq, limit, published before. Row: `last` (NULL: no
    /// rows), `past` (every row of the chunk occurred after the cutoff).
    pub(crate) purge_sent_chunk: String,
    /// Binds: after seq, last, published before. Deletes the attempts of
    /// the events [`purge_sent`](Self::purge_sent) deletes.
    pub(crate) purge_sent_attempts: String,
    /// Binds: after seq, last, published before. Rows changed: the
    /// chunk's count.
    pub(crate) purge_sent: String,
    /// Binds: received before, limit. Rows changed: the chunk's count.
    pub(crate) purge_inbox: String,
    /// Binds: settled before, limit.
    pub(crate) purge_dead_letter_records: String,
    /// Binds: identity, action, target (JSON text), now. Row: `id`.
    pub(crate) audit_begin: String,
    /// Binds: id, count (nullable), outcome (nullable), now.
    pub(crate) audit_record: String,
    /// Binds: before id, limit. Rows: the audit rows, newest first.
    pub(crate) audit_log: String,
    /// Binds: now. Rows: every relay by name, with `live`.
    pub(crate) relays: String,
    /// Binds: name, paused. Rows changed: 1 if the relay exists.
    pub(crate) set_paused: String,
    /// Binds: heartbeat before. Removes stale relays but paused ones.
    pub(crate) purge_stale_relays: String,
}

/// The `IN (…)` list of `statuses`.
fn literals(statuses: &[EventStatus]) -> String {
    let quoted: Vec<String> = statuses.iter().map(|s| format!("'{s}'")).collect();
    quoted.join(", ")
}

/// What failure groups are made of: the normalized error written with it,
/// or the raw error of rows written before (the core normalizes it again).
pub(crate) const ERROR_KEY: &str = "coalesce(error_group, last_error)";

impl SqliteAdminSql {
    fn render() -> Self {
        let leased = |from: &'static [EventStatus]| {
            format!(
                "SELECT count(*) AS n FROM outbox_events \
                 WHERE seq IN (SELECT value FROM json_each(?1)) AND status IN ({}) \
                   AND lease_until > ?2",
                literals(from)
            )
        };
        let replay_from = Transition::Replay.from();
        let skip_from = Transition::Skip.from();
        let retry_from: &'static [EventStatus] = &[EventStatus::Retry];
        let failed = literals(&[EventStatus::Retry, EventStatus::Dead, EventStatus::Skipped]);
        let done = literals(&[EventStatus::Sent, EventStatus::Skipped]);
        SqliteAdminSql {
            // Plain members (SQLite refuses parenthesised ones), each on its
            // partial index: a status spelled as the index spells it.
            status_by_type: [
                ("pending", "status = 'pending'"),
                ("retry", "status = 'retry'"),
                ("held", "status = 'held'"),
                ("dead", "status IN ('retry', 'dead') AND status = 'dead'"),
            ]
            .map(|(status, term)| {
                format!(
                    "SELECT event_type, '{status}' AS status, count(*) AS n FROM outbox_events \
                     WHERE {term} GROUP BY event_type"
                )
            })
            .join(" UNION ALL "),
            status_done: "SELECT \
                  (SELECT count(*) FROM (SELECT 1 FROM outbox_events WHERE status = 'sent' \
                    LIMIT ?1)) AS sent, \
                  (SELECT count(*) FROM (SELECT 1 FROM outbox_events WHERE status = 'skipped' \
                    LIMIT ?1)) AS skipped, \
                  (SELECT count(*) FROM outbox_events) AS estimate"
                .to_owned(),
            list: FilteredSql {
                head: format!("SELECT {COLUMNS} FROM outbox_events WHERE seq > ?1"),
                tail: " ORDER BY seq LIMIT ?2".to_owned(),
            },
            show: format!("SELECT {COLUMNS} FROM outbox_events WHERE id = ?1"),
            attempts: "SELECT at, relay, outcome, error FROM outbox_attempts \
                       WHERE event_seq = ?1 ORDER BY id"
                .to_owned(),
            count: FilteredSql {
                head: "SELECT count(*) AS n FROM outbox_events WHERE true".to_owned(),
                tail: String::new(),
            },
            last_seq: "SELECT max(seq) AS last FROM outbox_events".to_owned(),
            head: format!(
                "SELECT {COLUMNS} FROM outbox_events WHERE seq = ( \
                   SELECT min(seq) FROM outbox_events \
                   WHERE status IN ('retry', 'dead') AND aggregate_type = ?1 \
                     AND aggregate_id = ?2)"
            ),
            groups: FilteredSql {
                head: format!(
                    "SELECT event_type, {ERROR_KEY} AS last_error, status, count(*) AS n, \
                       min(occurred_at) AS first, max(occurred_at) AS last \
                     FROM outbox_events WHERE last_error IS NOT NULL"
                ),
                tail: " GROUP BY 1, 2, 3 LIMIT ?1".to_owned(),
            },
            // The fixed status list (a superset of every chunk's) and
            // `INDEXED BY` make SQLite walk the `failed` index, with or
            // without `ANALYZE` statistics.
            chunk: FilteredSql {
                head: format!(
                    "SELECT seq FROM outbox_events INDEXED BY outbox_events_failed \
                     WHERE seq > ?1 AND status IN ({failed})"
                ),
                tail: " ORDER BY seq LIMIT ?2".to_owned(),
            },
            // The schema's trigger releases the events the replayed ones
            // held back (not counted: `changes()` leaves trigger rows out).
            replay: ChunkSql {
                from: replay_from,
                leased: leased(replay_from),
                change: "UPDATE outbox_events SET status = 'pending', attempts = 0, \
                           suspect_count = min(suspect_count, 1), next_attempt_at = NULL \
                         WHERE seq IN (SELECT value FROM json_each(?1)) AND status = 'dead'"
                    .to_owned(),
                binds_now: false,
            },
            skip: ChunkSql {
                from: skip_from,
                leased: leased(skip_from),
                change: format!(
                    "UPDATE outbox_events SET status = 'skipped', next_attempt_at = NULL, \
                       finished_at = ?2 \
                     WHERE seq IN (SELECT value FROM json_each(?1)) AND status IN ({})",
                    literals(skip_from)
                ),
                binds_now: true,
            },
            retry_now: ChunkSql {
                from: retry_from,
                leased: leased(retry_from),
                change: "UPDATE outbox_events SET next_attempt_at = ?2 \
                         WHERE seq IN (SELECT value FROM json_each(?1)) AND status = 'retry' \
                           AND next_attempt_at > ?2"
                    .to_owned(),
                binds_now: true,
            },
            add_count: "UPDATE outbox_audit SET count = count + ?2 WHERE id = ?1".to_owned(),
            purge_orphan_attempts: "DELETE FROM outbox_attempts WHERE id IN ( \
                                      SELECT id FROM outbox_attempts a \
                                      WHERE NOT EXISTS ( \
                                        SELECT 1 FROM outbox_events e WHERE e.seq = a.event_seq) \
                                      LIMIT ?1)"
                .to_owned(),
            // The next `limit` rows by seq, whatever their status (never
            // rescanning from the head). A chunk whose rows all occurred
            // after the cutoff ends the run: nothing later was published
            // before it.
            purge_sent_chunk:
                "SELECT max(seq) AS last, coalesce(min(occurred_at) >= ?3, 1) AS past \
                               FROM (SELECT seq, occurred_at FROM outbox_events WHERE seq > ?1 \
                                 ORDER BY seq LIMIT ?2)"
                    .to_owned(),
            purge_sent_attempts: format!(
                "DELETE FROM outbox_attempts WHERE event_seq IN ( \
                   SELECT seq FROM outbox_events WHERE seq > ?1 AND seq <= ?2 \
                     AND status IN ({done}) \
                     AND coalesce(published_at, finished_at, occurred_at) < ?3)"
            ),
            purge_sent: format!(
                "DELETE FROM outbox_events WHERE seq > ?1 AND seq <= ?2 AND status IN ({done}) \
                   AND coalesce(published_at, finished_at, occurred_at) < ?3"
            ),
            purge_inbox: "DELETE FROM inbox_events WHERE (consumer, event_id) IN ( \
                            SELECT consumer, event_id FROM inbox_events WHERE received_at < ?1 \
                            ORDER BY received_at LIMIT ?2)"
                .to_owned(),
            purge_dead_letter_records: "DELETE FROM inbox_dead_letters WHERE id IN ( \
                                          SELECT id FROM inbox_dead_letters \
                                          WHERE coalesce(replayed_at, purged_at) < ?1 \
                                          ORDER BY id LIMIT ?2)"
                .to_owned(),
            audit_begin: "INSERT INTO outbox_audit (at, identity, action, target) \
                          VALUES (?4, ?1, ?2, ?3) RETURNING id"
                .to_owned(),
            audit_record: "UPDATE outbox_audit SET count = coalesce(?2, count), \
                             finished_at = CASE WHEN ?3 IS NULL THEN finished_at ELSE ?4 END, \
                             outcome = coalesce(?3, outcome) \
                           WHERE id = ?1"
                .to_owned(),
            audit_log: "SELECT id, at, identity, action, target, count, finished_at, outcome \
                        FROM outbox_audit WHERE id < ?1 ORDER BY id DESC LIMIT ?2"
                .to_owned(),
            relays: "SELECT name, host, pid, version, started_at, heartbeat_at, in_flight, \
                       paused, heartbeat_at > ?1 - 3 * heartbeat_interval_ms * 1000 AS live \
                     FROM outbox_relays ORDER BY name"
                .to_owned(),
            set_paused: "UPDATE outbox_relays SET paused = ?2 WHERE name = ?1".to_owned(),
            purge_stale_relays: "DELETE FROM outbox_relays WHERE heartbeat_at < ?1 AND NOT paused"
                .to_owned(),
        }
    }

    /// The text, rendered once per process.
    pub(crate) fn shared() -> Arc<Self> {
        static SQL: OnceLock<Arc<SqliteAdminSql>> = OnceLock::new();
        Arc::clone(SQL.get_or_init(|| Arc::new(SqliteAdminSql::render())))
    }
}

#[cfg(test)]
mod tests {
    use super::SqliteAdminSql;

    #[test]
    fn one_statement_per_text() {
        let sql = SqliteAdminSql::shared();
        for text in [
            &sql.status_by_type,
            &sql.status_done,
            &sql.purge_sent_chunk,
            &sql.skip.change,
            &sql.replay.leased,
            &sql.audit_record,
        ] {
            assert!(!text.contains(';'), "{text}");
        }
        assert!(!sql.replay.change.contains("?2"), "binds the seqs only");
        assert!(sql.skip.change.contains("?2") && sql.retry_now.change.contains("?2"));
    }
}
