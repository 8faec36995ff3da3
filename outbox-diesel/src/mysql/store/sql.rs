//! The MariaDB relay store's statements. A PostgreSQL claim is one
//! statement with data-modifying CTEs; MariaDB has none, so a claim is a
//! few statements in one `READ COMMITTED` transaction: the window (a
//! consistent read, no locks), the lock of the rows to take (`FOR UPDATE
//! SKIP LOCKED`), and the holds. Arrays are bound as one JSON text read
//! with `JSON_TABLE`, so every text is fixed and stays prepared.

use outbox_core::admin::ATTEMPTS_KEPT;
use outbox_core::{EventStatus, Transition};

use super::super::sql::MysqlSql;

/// The columns of an event row, as the row type reads them.
pub(crate) const COLUMNS: &str = "seq, id, aggregate_type, aggregate_id, aggregate_version, \
    event_type, schema_version, payload, headers, occurred_at, status, attempts, \
    next_attempt_at, last_error, published_at, unroutable_since, suspect_count";

/// `seq IN` the JSON array of seqs bound there. For `SELECT`s only: a
/// single-table `UPDATE` or `DELETE` with an `IN (subquery)` scans (and
/// locks, waiting for other claims' rows) the whole table on MariaDB 10.11;
/// those join [`JSEQS`] instead (a primary-key lookup per seq).
const SEQS: &str =
    "seq IN (SELECT j.seq FROM JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$')) AS j)";

/// The JSON array of seqs bound there, as a table `j (seq)` to join.
const JSEQS: &str = "JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$')) AS j";

/// `'a', 'b'` for `IN` lists.
fn literals(statuses: &[EventStatus]) -> String {
    statuses
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether an earlier event of `row`'s aggregate holds it back (`retry`,
/// `dead`, or, for the window, `held`): seeks `outbox_events_aggregate`
/// by the hash, compares the full key.
fn earlier(t: &str, row: &str, statuses: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM {t} b WHERE b.status IN ({statuses}) \
           AND b.aggregate_key = {row}.aggregate_key AND b.aggregate_type = {row}.aggregate_type \
           AND b.aggregate_id = {row}.aggregate_id AND b.seq < {row}.seq)"
    )
}

#[derive(Debug)]
pub(crate) struct MysqlStoreSql {
    /// Binds: window size, window size. Rows `seq`, `aggregate_type`,
    /// `aggregate_id`, `blocked`: the first due, unsent events in seq order
    /// (pending by seq, due retries by their due time), a consistent read.
    pub(crate) window: String,
    /// Binds: seqs (JSON), limit. The rows of those seqs still due, locked,
    /// at most `limit` in seq order, skipping rows other claims hold.
    pub(crate) lock: String,
    /// Binds: limit. Pending rows in seq order, locked (unordered claims).
    pub(crate) lock_pending: String,
    /// Binds: limit. Due retries, locked (unordered claims).
    pub(crate) lock_retries: String,
    /// Binds: seqs (JSON). Locks the holdable rows among them, skipping
    /// rows other claims hold; returns `seq`.
    pub(crate) lock_holdable: String,
    /// Binds: seqs (JSON). Holds those rows if an earlier event of their
    /// aggregate is `retry` or `dead`.
    pub(crate) hold: String,
    /// Binds: seqs (JSON). Releases the held events of those seqs'
    /// aggregates that nothing holds back any more (PostgreSQL's trigger;
    /// MariaDB's triggers cannot update their own table).
    pub(crate) release: String,
    /// Releases every held event that nothing holds back.
    pub(crate) release_orphans: String,
    /// Releases every held event (unordered outboxes).
    pub(crate) release_unordered: String,
    /// Binds: seqs (JSON). Marks them sent (`keep_sent`).
    pub(crate) mark_sent: String,
    /// Binds: seqs (JSON). Deletes them (no `keep_sent`).
    pub(crate) delete_sent: String,
    /// Binds: seqs (JSON). Deletes them after [`mark_sent`](Self::mark_sent)
    /// marked them (a retry's release needs it gone from `retry` first).
    pub(crate) delete_sent_any: String,
    /// Binds: seqs (JSON). Deletes the attempt history of those seqs.
    pub(crate) delete_attempts: String,
    /// Binds: failures (JSON array of objects `seq`, `status`, `attempts`,
    /// `next`, `error`, `unroutable`, `group`).
    pub(crate) mark_failed: String,
    /// Binds: relay, failures (as [`mark_failed`](Self::mark_failed)).
    pub(crate) failed_attempts: String,
    /// Binds: seqs (JSON), error, group.
    pub(crate) mark_suspect: String,
    /// Binds: relay, error, seqs (JSON).
    pub(crate) suspect_attempts: String,
    /// Binds: seqs (JSON). Keeps the last `ATTEMPTS_KEPT` attempts of each.
    pub(crate) trim_attempts: String,
    /// Binds: error, group, seq. Marks a malformed row dead.
    pub(crate) kill: String,
    /// Binds: relay, seq, error. Its attempt row.
    pub(crate) kill_attempt: String,
    /// Row: `backlog`, `oldest_age`, `dead`, `unroutable`, `blocked`,
    /// `delivery_order`, `relays_live`.
    pub(crate) stats: String,
    /// Binds: before, limit.
    pub(crate) purge: String,
    /// Binds: id.
    pub(crate) replay_id: String,
    /// Binds: aggregate type, aggregate id, both again (the hash, then the
    /// full key).
    pub(crate) replay_aggregate: String,
    pub(crate) replay_all: String,
    /// Binds: id.
    pub(crate) skip: String,
    /// Row: `delivery_order`.
    pub(crate) get_order: String,
    /// Binds: order.
    pub(crate) set_order: String,
    /// Row: `version`.
    pub(crate) schema_version: String,
    /// Binds: relay name. Row: `paused` (none: not registered).
    pub(crate) paused: String,
    /// Binds: name, host, pid, version, started at, heartbeat ms.
    pub(crate) register: String,
    /// Binds: in flight, name. Affected rows: 0 if it is not registered.
    pub(crate) heartbeat: String,
    /// Binds: name.
    pub(crate) deregister: String,
}

impl MysqlStoreSql {
    pub(crate) fn new(shared: &MysqlSql) -> Self {
        let t = shared.table("outbox_events");
        let at = shared.table("outbox_attempts");
        let settings = shared.table("outbox_settings");
        let relays = shared.table("outbox_relays");
        let heads = literals(&[EventStatus::Retry, EventStatus::Dead]);
        let waiting = literals(&[EventStatus::Retry, EventStatus::Dead, EventStatus::Held]);
        let due =
            "(status = 'pending' OR (status = 'retry' AND next_attempt_at <= UTC_TIMESTAMP(6)))";
        let held = EventStatus::Held.as_str();
        let pending = EventStatus::Pending.as_str();
        let failures = "JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$.seq', \
            status VARCHAR(16) PATH '$.status', attempts INT PATH '$.attempts', \
            next DATETIME(6) PATH '$.next', error LONGTEXT PATH '$.error', \
            unroutable DATETIME(6) PATH '$.unroutable', grp LONGTEXT PATH '$.group')) AS u";
        let release_where =
            |h: &str| format!("{h}.status = '{held}' AND NOT {}", earlier(&t, h, &heads));
        let replay_set = format!(
            "status = '{}', attempts = 0, suspect_count = LEAST(suspect_count, 1), \
             next_attempt_at = NULL",
            Transition::Replay.to().as_str()
        );
        let replay = format!(
            "UPDATE {t} SET {replay_set} WHERE status IN ({})",
            literals(Transition::Replay.from())
        );
        MysqlStoreSql {
            window: format!(
                "SELECT w.seq, w.aggregate_type, w.aggregate_id, {blocked} AS blocked FROM ( \
                   (SELECT seq, aggregate_key, aggregate_type, aggregate_id FROM {t} \
                    WHERE status = '{pending}' ORDER BY seq LIMIT ?) \
                   UNION ALL \
                   (SELECT seq, aggregate_key, aggregate_type, aggregate_id FROM {t} \
                    WHERE status = 'retry' AND next_attempt_at <= UTC_TIMESTAMP(6) \
                    ORDER BY next_attempt_at LIMIT ?) \
                 ) AS w ORDER BY w.seq",
                blocked = earlier(&t, "w", &waiting),
            ),
            lock: format!(
                "SELECT {COLUMNS} FROM {t} WHERE {SEQS} AND {due} \
                 ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED"
            ),
            lock_pending: format!(
                "SELECT {COLUMNS} FROM {t} WHERE status = '{pending}' \
                 ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED"
            ),
            lock_retries: format!(
                "SELECT {COLUMNS} FROM {t} \
                 WHERE status = 'retry' AND next_attempt_at <= UTC_TIMESTAMP(6) \
                 ORDER BY next_attempt_at LIMIT ? FOR UPDATE SKIP LOCKED"
            ),
            lock_holdable: format!(
                "SELECT seq FROM {t} WHERE {SEQS} AND status IN ({}) FOR UPDATE SKIP LOCKED",
                literals(Transition::Hold.from())
            ),
            hold: format!(
                "UPDATE {t} AS h JOIN {JSEQS} ON h.seq = j.seq SET h.status = '{held}' \
                 WHERE h.status IN ({}) AND {}",
                literals(Transition::Hold.from()),
                earlier(&t, "h", &heads),
            ),
            release: format!(
                "UPDATE {t} AS h JOIN ( \
                   SELECT DISTINCT s.aggregate_key, s.aggregate_type, s.aggregate_id \
                   FROM {t} AS s JOIN {JSEQS} ON s.seq = j.seq \
                 ) AS a ON h.aggregate_key = a.aggregate_key \
                   AND h.aggregate_type = a.aggregate_type AND h.aggregate_id = a.aggregate_id \
                 SET h.status = '{pending}' WHERE {}",
                release_where("h"),
            ),
            release_orphans: format!(
                "UPDATE {t} AS h SET h.status = '{pending}' WHERE {}",
                release_where("h")
            ),
            release_unordered: format!(
                "UPDATE {t} SET status = '{pending}' WHERE status = '{held}'"
            ),
            mark_sent: format!(
                "UPDATE {t} AS t JOIN {JSEQS} ON t.seq = j.seq SET t.status = '{sent}', \
                 t.published_at = UTC_TIMESTAMP(6), t.next_attempt_at = NULL \
                 WHERE t.status IN ({from})",
                sent = Transition::Publish.to().as_str(),
                from = literals(Transition::Publish.from()),
            ),
            delete_sent: format!(
                "DELETE t FROM {t} AS t JOIN {JSEQS} ON t.seq = j.seq WHERE t.status IN ({})",
                literals(Transition::Publish.from())
            ),
            delete_sent_any: format!(
                "DELETE t FROM {t} AS t JOIN {JSEQS} ON t.seq = j.seq WHERE t.status = '{}'",
                Transition::Publish.to().as_str()
            ),
            delete_attempts: format!("DELETE a FROM {at} AS a JOIN {JSEQS} ON a.event_seq = j.seq"),
            mark_failed: format!(
                "UPDATE {t} AS t JOIN {failures} ON t.seq = u.seq \
                 SET t.status = u.status, t.attempts = u.attempts, t.next_attempt_at = u.next, \
                   t.last_error = u.error, t.unroutable_since = u.unroutable, \
                   t.error_group = u.grp \
                 WHERE t.status IN ({})",
                literals(Transition::Retry.from())
            ),
            failed_attempts: format!(
                "INSERT INTO {at} (event_seq, relay, outcome, error) \
                 SELECT u.seq, ?, IF(u.status = 'dead', 'dead', 'retry'), u.error FROM {failures}"
            ),
            mark_suspect: format!(
                "UPDATE {t} AS t JOIN {JSEQS} ON t.seq = j.seq \
                 SET t.suspect_count = t.suspect_count + 1, t.last_error = ?, t.error_group = ?"
            ),
            suspect_attempts: format!(
                "INSERT INTO {at} (event_seq, relay, outcome, error) \
                 SELECT j.seq, ?, 'suspect', ? \
                 FROM JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$')) AS j"
            ),
            trim_attempts: format!(
                "DELETE a FROM {at} AS a JOIN ( \
                   SELECT x.id, ROW_NUMBER() OVER (PARTITION BY x.event_seq ORDER BY x.id DESC) \
                     AS n FROM {at} AS x JOIN {JSEQS} ON x.event_seq = j.seq \
                 ) AS r ON a.id = r.id WHERE r.n > {ATTEMPTS_KEPT}"
            ),
            kill: format!(
                "UPDATE {t} SET status = '{dead}', last_error = ?, error_group = ? WHERE seq = ?",
                dead = Transition::Kill.to().as_str(),
            ),
            kill_attempt: format!(
                "INSERT INTO {at} (event_seq, relay, outcome, error) VALUES (?, ?, 'dead', ?)"
            ),
            stats: format!(
                "SELECT \
                   (SELECT COUNT(*) FROM {t} WHERE status IN ('pending', 'retry', 'held')) AS backlog, \
                   (SELECT CAST(TIMESTAMPDIFF(MICROSECOND, MIN(o), UTC_TIMESTAMP(6)) AS DOUBLE) \
                      / 1000000 FROM ( \
                      (SELECT occurred_at AS o FROM {t} WHERE status = '{pending}' ORDER BY seq LIMIT 1) \
                      UNION ALL (SELECT MIN(occurred_at) FROM {t} WHERE status = 'retry') \
                      UNION ALL (SELECT MIN(occurred_at) FROM {t} WHERE status = '{held}') \
                    ) AS oldest) AS oldest_age, \
                   (SELECT COUNT(*) FROM {t} WHERE status = 'dead') AS dead, \
                   (SELECT COUNT(*) FROM {t} WHERE status = 'retry' \
                      AND unroutable_since IS NOT NULL) AS unroutable, \
                   (SELECT COUNT(*) FROM (SELECT DISTINCT aggregate_key FROM {t} \
                      WHERE status IN ({heads})) AS b) AS blocked, \
                   (SELECT delivery_order FROM {settings} LIMIT 1) AS delivery_order, \
                   (SELECT COUNT(*) FROM {relays} WHERE NOT paused AND heartbeat_at > \
                      UTC_TIMESTAMP(6) - INTERVAL (3000 * heartbeat_interval_ms) MICROSECOND) \
                      AS relays_live"
            ),
            purge: format!(
                "DELETE FROM {t} WHERE status IN ('sent', 'skipped') \
                 AND COALESCE(published_at, occurred_at) < ? ORDER BY seq LIMIT ?"
            ),
            replay_id: format!("{replay} AND id = ?"),
            replay_aggregate: format!(
                "{replay} AND aggregate_key = UNHEX(SHA2(CONCAT(?, CHAR(0), ?), 256)) \
                 AND aggregate_type = ? AND aggregate_id = ?"
            ),
            replay_all: replay,
            skip: format!(
                "UPDATE {t} SET status = '{}', next_attempt_at = NULL, \
                 finished_at = UTC_TIMESTAMP(6) WHERE id = ? AND status IN ({})",
                Transition::Skip.to().as_str(),
                literals(Transition::Skip.from()),
            ),
            get_order: format!("SELECT delivery_order FROM {settings} LIMIT 1"),
            set_order: format!("UPDATE {settings} SET delivery_order = ?"),
            schema_version: format!(
                "SELECT CAST(COALESCE(MAX(version), 0) AS INT) AS version FROM {}",
                shared.table("outbox_schema_version")
            ),
            paused: format!("SELECT paused FROM {relays} WHERE name = ?"),
            register: format!(
                "INSERT INTO {relays} (name, host, pid, version, started_at, heartbeat_at, \
                   heartbeat_interval_ms) VALUES (?, ?, ?, ?, ?, UTC_TIMESTAMP(6), ?) \
                 ON DUPLICATE KEY UPDATE host = VALUES(host), pid = VALUES(pid), \
                   version = VALUES(version), started_at = VALUES(started_at), \
                   heartbeat_at = UTC_TIMESTAMP(6), \
                   heartbeat_interval_ms = VALUES(heartbeat_interval_ms), in_flight = 0"
            ),
            heartbeat: format!(
                "UPDATE {relays} SET heartbeat_at = UTC_TIMESTAMP(6), in_flight = ? WHERE name = ?"
            ),
            deregister: format!("DELETE FROM {relays} WHERE name = ? AND NOT paused"),
        }
    }
}
