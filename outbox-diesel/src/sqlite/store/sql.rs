//! The SQLite relay store's statements: those of
//! `docs/design/sqlite-statements.md` ("The lease claim", "Marks", "The
//! rest of the store", "Relay registry"), one statement per text, binds
//! renumbered from 1 where the catalogue kept PostgreSQL's unused numbers.
//! Arrays are one JSON text read with `json_each`; times are bound
//! (INTEGER µs since the epoch, UTC), never taken from SQLite's clock.

/// The columns of an event row, as the row type reads them (unqualified:
/// `RETURNING` takes no table names).
pub(crate) const COLUMNS: &str = "seq, id, aggregate_type, aggregate_id, aggregate_version, event_type, \
    schema_version, payload, headers, occurred_at, status, attempts, next_attempt_at, \
    last_error, published_at, unroutable_since, suspect_count";

const REPLAY: &str = "UPDATE outbox_events SET status = 'pending', attempts = 0, \
    suspect_count = min(suspect_count, 1), next_attempt_at = NULL";

#[derive(Debug)]
pub(crate) struct SqliteStoreSql {
    /// Binds: window size, relay (nullable), now. Rows: `paused`,
    /// `window_seq`, `window_aggregate_type`, `window_aggregate_id`,
    /// `blocked`, `locked` (leased by a claim whose lease has not expired);
    /// one row of NULLs but `paused` when empty or paused.
    pub(crate) window: String,
    /// Binds: seqs (JSON), token, lease until, now. Rows: the leased rows
    /// (any order).
    pub(crate) take: String,
    /// Binds: seqs (JSON), now, token. Holds those not leased by another
    /// live claim that have a `retry`/`dead` event before them.
    pub(crate) hold: String,
    /// Binds: limit, relay (nullable), now, token, lease until. Rows: the
    /// leased rows (any order); none when paused.
    pub(crate) claim_unordered: String,
    /// Binds: relay (nullable). Row: `paused`.
    pub(crate) claim_paused: String,
    /// Binds: seq, reason, group.
    pub(crate) kill: String,
    /// Binds: seq, reason, relay, now.
    pub(crate) kill_attempt: String,
    /// Binds: seqs (JSON), token.
    pub(crate) release_lease_seqs: String,
    /// Binds: token.
    pub(crate) release_lease: String,
    /// Binds: seqs (JSON), token. Rows: `seq` of those still leased by it.
    pub(crate) leased: String,
    /// Binds: seqs (JSON), now, token. Rows: `seq` marked.
    pub(crate) mark_sent_keep: String,
    /// Binds: seqs (JSON), token. Deletes their attempts.
    pub(crate) mark_sent_attempts: String,
    /// Binds: seqs (JSON), token. Rows: `seq` deleted.
    pub(crate) mark_sent_delete: String,
    /// Binds: failures (JSON rows `[seq, status, attempts, next_us, error,
    /// unroutable_us, group]`), relay, token, now.
    pub(crate) failed_attempts: String,
    /// Binds: failures (as above), token. Rows: `seq` marked.
    pub(crate) mark_failed: String,
    /// Binds: seqs (JSON), reason, relay, token, now.
    pub(crate) suspect_attempts: String,
    /// Binds: seqs (JSON), reason, group, token. Rows: `seq` counted.
    pub(crate) mark_suspect: String,
    /// Binds: seqs (JSON). Keeps their newest `ATTEMPTS_KEPT` attempts.
    pub(crate) trim: String,
    pub(crate) release_unordered: String,
    pub(crate) release_orphans: String,
    /// Binds: now. Row: as [`StatsRow`](super::row::StatsRow).
    pub(crate) stats: String,
    /// Binds: before, limit.
    pub(crate) purge: String,
    /// Binds: id.
    pub(crate) replay_id: String,
    /// Binds: aggregate type, aggregate id.
    pub(crate) replay_aggregate: String,
    pub(crate) replay_all: String,
    /// Binds: id, now.
    pub(crate) skip: String,
    pub(crate) get_order: String,
    /// Binds: order.
    pub(crate) set_order: String,
    pub(crate) schema_version: String,
    /// Binds: name, host, pid, version, started at, heartbeat ms, now.
    pub(crate) register: String,
    /// Binds: name, in flight, now. Row: `paused` (none: not registered).
    pub(crate) heartbeat: String,
    /// Binds: name.
    pub(crate) deregister: String,
}

impl SqliteStoreSql {
    pub(crate) fn new() -> Self {
        let kept = outbox_core::admin::ATTEMPTS_KEPT;
        SqliteStoreSql {
            window: "WITH pause AS ( \
                   SELECT EXISTS (SELECT 1 FROM outbox_relays WHERE name = ?2 AND paused) AS paused \
                 ), w AS ( \
                   SELECT seq, aggregate_type, aggregate_id, lease_until FROM ( \
                     SELECT * FROM ( \
                       SELECT seq, aggregate_type, aggregate_id, lease_until \
                       FROM outbox_events INDEXED BY outbox_events_pending \
                       WHERE status = 'pending' ORDER BY seq LIMIT ?1) \
                     UNION ALL \
                     SELECT * FROM ( \
                       SELECT seq, aggregate_type, aggregate_id, lease_until \
                       FROM outbox_events INDEXED BY outbox_events_retry_due \
                       WHERE status = 'retry' AND next_attempt_at <= ?3 \
                       ORDER BY next_attempt_at LIMIT ?1) \
                   ) ORDER BY seq LIMIT CASE WHEN (SELECT paused FROM pause) THEN 0 ELSE ?1 END \
                 ) \
                 SELECT pause.paused, w.seq AS window_seq, \
                   w.aggregate_type AS window_aggregate_type, \
                   w.aggregate_id AS window_aggregate_id, \
                   EXISTS ( \
                     SELECT 1 FROM outbox_events b \
                     WHERE b.aggregate_type = w.aggregate_type \
                       AND b.aggregate_id = w.aggregate_id \
                       AND b.seq < w.seq AND b.status IN ('retry', 'dead')) \
                   OR EXISTS ( \
                     SELECT 1 FROM outbox_events h \
                     WHERE h.aggregate_type = w.aggregate_type \
                       AND h.aggregate_id = w.aggregate_id \
                       AND h.seq < w.seq AND h.status = 'held') AS blocked, \
                   coalesce(w.lease_until > ?3, 0) AS locked \
                 FROM pause LEFT JOIN w ON true \
                 ORDER BY w.seq"
                .to_owned(),
            take: format!(
                "UPDATE outbox_events SET lease_token = ?2, lease_until = ?3 \
                 WHERE seq IN (SELECT value FROM json_each(?1)) \
                   AND status IN ('pending', 'retry') \
                   AND (lease_until IS NULL OR lease_until <= ?4) \
                 RETURNING {COLUMNS}"
            ),
            hold: "UPDATE outbox_events AS t SET status = 'held' \
                   WHERE t.seq IN (SELECT value FROM json_each(?1)) \
                     AND t.status IN ('pending', 'retry') \
                     AND (t.lease_until IS NULL OR t.lease_until <= ?2 OR t.lease_token = ?3) \
                     AND EXISTS ( \
                       SELECT 1 FROM outbox_events x \
                       WHERE x.aggregate_type = t.aggregate_type \
                         AND x.aggregate_id = t.aggregate_id \
                         AND x.seq < t.seq AND x.status IN ('retry', 'dead'))"
                .to_owned(),
            claim_unordered: format!(
                "UPDATE outbox_events SET lease_token = ?4, lease_until = ?5 \
                 WHERE seq IN ( \
                   SELECT seq FROM ( \
                     SELECT * FROM ( \
                       SELECT seq FROM outbox_events INDEXED BY outbox_events_pending \
                       WHERE status = 'pending' AND (lease_until IS NULL OR lease_until <= ?3) \
                       ORDER BY seq LIMIT ?1) \
                     UNION ALL \
                     SELECT * FROM ( \
                       SELECT seq FROM outbox_events INDEXED BY outbox_events_retry_due \
                       WHERE status = 'retry' AND next_attempt_at <= ?3 \
                         AND (lease_until IS NULL OR lease_until <= ?3) \
                       ORDER BY next_attempt_at LIMIT ?1) \
                   ) ORDER BY seq \
                   LIMIT CASE WHEN EXISTS ( \
                     SELECT 1 FROM outbox_relays WHERE name = ?2 AND paused) \
                   THEN 0 ELSE ?1 END) \
                 RETURNING {COLUMNS}"
            ),
            claim_paused: "SELECT EXISTS (SELECT 1 FROM outbox_relays WHERE name = ?1 AND paused) \
                           AS paused"
                .to_owned(),
            kill: "UPDATE outbox_events SET status = 'dead', last_error = ?2, error_group = ?3, \
                   lease_token = NULL, lease_until = NULL WHERE seq = ?1"
                .to_owned(),
            kill_attempt: "INSERT INTO outbox_attempts (event_seq, at, relay, outcome, error) \
                           VALUES (?1, ?4, ?3, 'dead', ?2)"
                .to_owned(),
            release_lease_seqs: "UPDATE outbox_events SET lease_token = NULL, lease_until = NULL \
                                 WHERE seq IN (SELECT value FROM json_each(?1)) \
                                   AND lease_token = ?2"
                .to_owned(),
            release_lease: "UPDATE outbox_events SET lease_token = NULL, lease_until = NULL \
                            WHERE lease_token = ?1"
                .to_owned(),
            leased: "SELECT seq FROM outbox_events \
                     WHERE seq IN (SELECT value FROM json_each(?1)) AND lease_token = ?2"
                .to_owned(),
            mark_sent_keep: "UPDATE outbox_events \
                             SET status = 'sent', published_at = ?2, next_attempt_at = NULL \
                             WHERE seq IN (SELECT value FROM json_each(?1)) \
                               AND status IN ('pending', 'retry') AND lease_token = ?3 \
                             RETURNING seq"
                .to_owned(),
            mark_sent_attempts: "DELETE FROM outbox_attempts WHERE event_seq IN ( \
                                   SELECT seq FROM outbox_events \
                                   WHERE seq IN (SELECT value FROM json_each(?1)) \
                                     AND status IN ('pending', 'retry') AND lease_token = ?2 \
                                     AND last_error IS NOT NULL)"
                .to_owned(),
            mark_sent_delete: "DELETE FROM outbox_events \
                               WHERE seq IN (SELECT value FROM json_each(?1)) \
                                 AND status IN ('pending', 'retry') AND lease_token = ?2 \
                               RETURNING seq"
                .to_owned(),
            failed_attempts: "INSERT INTO outbox_attempts (event_seq, at, relay, outcome, error) \
                              SELECT t.seq, ?4, ?2, \
                                CASE WHEN u.value ->> 1 = 'dead' THEN 'dead' ELSE 'retry' END, \
                                coalesce(u.value ->> 4, '') \
                              FROM json_each(?1) AS u \
                              CROSS JOIN outbox_events AS t ON t.seq = u.value ->> 0 \
                              WHERE t.status IN ('pending', 'retry') AND t.lease_token = ?3 \
                              ORDER BY u.key"
                .to_owned(),
            mark_failed: "UPDATE outbox_events AS t \
                          SET status = u.value ->> 1, attempts = u.value ->> 2, \
                            next_attempt_at = u.value ->> 3, last_error = u.value ->> 4, \
                            unroutable_since = u.value ->> 5, error_group = u.value ->> 6 \
                          FROM json_each(?1) AS u \
                          WHERE t.seq = u.value ->> 0 AND t.status IN ('pending', 'retry') \
                            AND +t.lease_token = ?2 \
                          RETURNING seq"
                .to_owned(),
            suspect_attempts: "INSERT INTO outbox_attempts (event_seq, at, relay, outcome, error) \
                               SELECT seq, ?5, ?3, 'suspect', ?2 FROM outbox_events \
                               WHERE seq IN (SELECT value FROM json_each(?1)) \
                                 AND lease_token = ?4 \
                               ORDER BY seq"
                .to_owned(),
            mark_suspect: "UPDATE outbox_events \
                           SET suspect_count = suspect_count + 1, last_error = ?2, \
                             error_group = ?3 \
                           WHERE seq IN (SELECT value FROM json_each(?1)) AND lease_token = ?4 \
                           RETURNING seq"
                .to_owned(),
            // Runs after the insert, so it sees the new row: OFFSET kept.
            trim: format!(
                "DELETE FROM outbox_attempts \
                 WHERE event_seq IN (SELECT value FROM json_each(?1)) \
                   AND id <= ( \
                     SELECT y.id FROM outbox_attempts AS y \
                     WHERE y.event_seq = outbox_attempts.event_seq \
                     ORDER BY y.id DESC LIMIT 1 OFFSET {kept})"
            ),
            release_unordered: "UPDATE outbox_events SET status = 'pending' WHERE status = 'held'"
                .to_owned(),
            release_orphans: "UPDATE outbox_events AS t SET status = 'pending' \
                              WHERE t.status = 'held' AND NOT EXISTS ( \
                                SELECT 1 FROM outbox_events b \
                                WHERE b.aggregate_type = t.aggregate_type \
                                  AND b.aggregate_id = t.aggregate_id \
                                  AND b.seq < t.seq AND b.status IN ('retry', 'dead'))"
                .to_owned(),
            stats: "SELECT \
                      (SELECT count(*) FROM outbox_events WHERE status = 'pending') \
                      + (SELECT count(*) FROM outbox_events WHERE status = 'retry') \
                      + (SELECT count(*) FROM outbox_events WHERE status = 'held') AS backlog, \
                      (SELECT (?1 - min(o)) / 1000000.0 FROM ( \
                        SELECT (SELECT occurred_at FROM outbox_events WHERE status = 'pending' \
                                ORDER BY seq LIMIT 1) AS o \
                        UNION ALL SELECT min(occurred_at) FROM outbox_events \
                          WHERE status = 'retry' \
                        UNION ALL SELECT min(occurred_at) FROM outbox_events \
                          WHERE status = 'held')) AS oldest_age, \
                      (SELECT count(*) FROM outbox_events \
                        WHERE status IN ('retry', 'dead') AND status = 'dead') AS dead, \
                      (SELECT count(*) FROM outbox_events WHERE status = 'retry' \
                        AND unroutable_since IS NOT NULL) AS unroutable, \
                      (SELECT count(*) FROM (SELECT DISTINCT aggregate_type, aggregate_id \
                        FROM outbox_events WHERE status IN ('retry', 'dead'))) AS blocked, \
                      (SELECT delivery_order FROM outbox_settings) AS delivery_order, \
                      (SELECT count(*) FROM outbox_relays \
                        WHERE heartbeat_at > ?1 - 3 * heartbeat_interval_ms * 1000 \
                          AND NOT paused) AS relays_live"
                .to_owned(),
            purge: "DELETE FROM outbox_events WHERE seq IN ( \
                      SELECT seq FROM outbox_events WHERE status IN ('sent', 'skipped') \
                        AND coalesce(published_at, occurred_at) < ?1 ORDER BY seq LIMIT ?2)"
                .to_owned(),
            replay_id: format!("{REPLAY} WHERE status = 'dead' AND id = ?1"),
            replay_aggregate: format!(
                "{REPLAY} WHERE status IN ('retry', 'dead') AND status = 'dead' \
                 AND aggregate_type = ?1 AND aggregate_id = ?2"
            ),
            replay_all: format!("{REPLAY} WHERE status IN ('retry', 'dead') AND status = 'dead'"),
            skip: "UPDATE outbox_events SET status = 'skipped', next_attempt_at = NULL, \
                   finished_at = ?2 WHERE id = ?1 AND status IN ('retry', 'dead')"
                .to_owned(),
            get_order: "SELECT delivery_order FROM outbox_settings".to_owned(),
            set_order: "UPDATE outbox_settings SET delivery_order = ?1".to_owned(),
            schema_version: "SELECT coalesce(max(version), 0) AS version \
                             FROM outbox_schema_version"
                .to_owned(),
            register: "INSERT INTO outbox_relays (name, host, pid, version, started_at, \
                         heartbeat_at, heartbeat_interval_ms) \
                       VALUES (?1, ?2, ?3, ?4, ?5, ?7, ?6) \
                       ON CONFLICT (name) DO UPDATE SET host = excluded.host, pid = excluded.pid, \
                         version = excluded.version, started_at = excluded.started_at, \
                         heartbeat_at = excluded.heartbeat_at, \
                         heartbeat_interval_ms = excluded.heartbeat_interval_ms, in_flight = 0"
                .to_owned(),
            heartbeat: "UPDATE outbox_relays SET heartbeat_at = ?3, in_flight = ?2 \
                        WHERE name = ?1 RETURNING paused"
                .to_owned(),
            deregister: "DELETE FROM outbox_relays WHERE name = ?1 AND NOT paused".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SqliteStoreSql;

    #[test]
    fn one_statement_per_text() {
        let sql = SqliteStoreSql::new();
        for text in [
            &sql.window,
            &sql.take,
            &sql.hold,
            &sql.mark_failed,
            &sql.stats,
        ] {
            assert!(!text.contains(';'), "{text}");
        }
    }
}
