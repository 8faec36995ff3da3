//! The MariaDB relay store's statements. A PostgreSQL claim is one
//! statement with data-modifying CTEs; MariaDB has none, so a claim is a
//! few statements in one `READ COMMITTED` transaction: the window (a
//! consistent read, no locks), the lock of the rows to take (`FOR UPDATE
//! SKIP LOCKED`) and, when the window has blocked rows, their hold. Arrays
//! are bound as one JSON text read with `JSON_TABLE`, so every text is
//! fixed and stays prepared.
//!
//! The texts are those of `docs/design/mysql-statements.md`, each checked
//! there with two sessions and a stress run of 3–4 relays (its section 9).
//! Two rules keep claims from waiting for (or deadlocking with) each
//! other, since an `UPDATE`/`DELETE` locks every row it reads:
//! - a statement driven by a list of seqs reads the list first and each
//!   row by primary key (`JSON_TABLE(…) AS j STRAIGHT_JOIN … FORCE INDEX
//!   (PRIMARY)`): left to the optimizer, a small table was read through a
//!   status index, locking other claims' rows (a deadlock in one stress
//!   run of eight); a single-table `UPDATE … WHERE seq IN (subquery)`
//!   scans the whole table;
//! - what must lock rows it does not change (the hold's heads, the
//!   release's held rows) is a `SELECT … FOR UPDATE SKIP LOCKED` that picks
//!   the seqs, then an `UPDATE` of those seqs: a subquery inside an
//!   `UPDATE` takes locks that wait.

use outbox_core::admin::ATTEMPTS_KEPT;

use super::super::sql::MysqlSql;

/// The columns of an event row, as the row type reads them.
pub(crate) const COLUMNS: &str = "seq, id, aggregate_type, aggregate_id, aggregate_version, \
    event_type, schema_version, payload, headers, occurred_at, status, attempts, \
    next_attempt_at, last_error, published_at, unroutable_since, suspect_count";

/// A JSON array of seqs, as the table `j (seq)`.
const SEQS: &str = "JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$')) AS j";

/// An earlier event of `row`'s aggregate with `status`, by the aggregate
/// index (one `EXISTS` per status: a `ref` lookup cannot follow an `IN`
/// list), comparing the hash and then the full key.
fn earlier(t: &str, row: &str, status: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM {t} AS b FORCE INDEX (outbox_events_aggregate) \
           WHERE b.status = '{status}' AND b.aggregate_key = {row}.aggregate_key \
           AND b.seq < {row}.seq AND b.aggregate_type = {row}.aggregate_type \
           AND b.aggregate_id = {row}.aggregate_id)"
    )
}

/// Whether relay `?` is paused (one bind).
fn paused(relays: &str) -> String {
    format!("EXISTS (SELECT 1 FROM {relays} WHERE name = ? AND paused)")
}

#[derive(Debug)]
pub(crate) struct MysqlStoreSql {
    /// Binds: relay (nullable), relay, window size, relay, window size,
    /// window size. Rows: `paused`, then the window's `window_seq`,
    /// `window_aggregate_type`, `window_aggregate_id`, `blocked` (one row
    /// of NULLs when empty or paused): the first due events in seq order
    /// (pending by seq, due retries by due time), a consistent read.
    pub(crate) window: String,
    /// Binds: seqs (JSON, seq order), limit. Those rows still due, locked,
    /// at most `limit` in seq order, skipping rows other claims hold.
    pub(crate) lock: String,
    /// Binds: relay, relay, limit, relay, limit, limit. Rows: `paused`,
    /// then pending rows and due retries locked (unordered claims).
    pub(crate) claim_unordered: String,
    /// Binds: seqs (JSON), the same again. Rows: `seq` of each holdable row
    /// among them with a `retry` or `dead` event before it, the row and a
    /// head locked (skipping what others lock).
    pub(crate) hold_lock: String,
    /// Binds: seqs (JSON). Holds them.
    pub(crate) hold_apply: String,
    /// Binds: aggregates (JSON `[[type, id], …]`). Rows: `seq` of their held
    /// events nothing holds back any more, locked (skipping what others
    /// lock): PostgreSQL's trigger, which MariaDB cannot have (a trigger
    /// cannot update its own table).
    pub(crate) release_pick: String,
    /// Rows: `seq` of every held event nothing holds back, locked.
    pub(crate) release_orphans_pick: String,
    /// Binds: seqs (JSON). Releases them.
    pub(crate) release_apply: String,
    /// Releases every held event (unordered outboxes).
    pub(crate) release_unordered: String,
    /// Binds: seqs (JSON). Marks them sent (`keep_sent`).
    pub(crate) mark_sent_keep: String,
    /// Binds: seqs (JSON). Deletes them and their attempt history.
    pub(crate) mark_sent_delete: String,
    /// Binds: failures (JSON array of objects `seq`, `status`, `attempts`,
    /// `next_attempt_at`, `last_error`, `unroutable_since`, `error_group`).
    pub(crate) mark_failed: String,
    /// Binds: relay, failures (as [`mark_failed`](Self::mark_failed)).
    pub(crate) failed_attempts: String,
    /// Binds: seqs (JSON), error, group.
    pub(crate) mark_suspect: String,
    /// Binds: relay, error, seqs (JSON).
    pub(crate) suspect_attempts: String,
    /// Binds: seqs (JSON). Rows: `id` of their attempts past the newest
    /// `ATTEMPTS_KEPT`, a plain read.
    pub(crate) trim_pick: String,
    /// Binds: attempt ids (JSON). Deletes them.
    pub(crate) trim_apply: String,
    /// Binds: error, group, seq. Marks a malformed row dead.
    pub(crate) kill: String,
    /// Binds: relay, error, seq. Its attempt row.
    pub(crate) kill_attempt: String,
    /// Row: `backlog`, `oldest_age`, `dead`, `unroutable`, `blocked`,
    /// `delivery_order`, `relays_live`.
    pub(crate) stats: String,
    /// Binds: status (`sent` or `skipped`: one status, so that the chunk
    /// walks `outbox_events_status_seq` in seq order instead of sorting
    /// every kept row), before, limit.
    pub(crate) purge: String,
    /// Binds: id. Row: `aggregate_type`, `aggregate_id` (none: no such id).
    pub(crate) aggregate_of_id: String,
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
    /// Binds: in flight, name. Found rows: 0 if it is not registered.
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
        let paused_q = paused(&relays);
        let free = |row: &str| {
            format!(
                "NOT {} AND NOT {}",
                earlier(&t, row, "retry"),
                earlier(&t, row, "dead")
            )
        };
        let prow = "t.seq, t.id, t.aggregate_type, t.aggregate_id, t.aggregate_version, \
            t.event_type, t.schema_version, t.payload, t.headers, t.occurred_at, t.status, \
            t.attempts, t.next_attempt_at, t.last_error, t.published_at, t.unroutable_since, \
            t.suspect_count";
        let hold_branch = |status: &str| {
            format!(
                "(SELECT p.seq FROM {SEQS} \
                 STRAIGHT_JOIN {t} AS p FORCE INDEX (PRIMARY) ON p.seq = j.seq \
                 STRAIGHT_JOIN {t} AS x FORCE INDEX (outbox_events_aggregate) \
                   ON x.status = '{status}' AND x.aggregate_key = p.aggregate_key \
                   AND x.seq < p.seq AND x.aggregate_type = p.aggregate_type \
                   AND x.aggregate_id = p.aggregate_id \
                 WHERE p.status IN ('pending', 'retry') \
                 FOR UPDATE SKIP LOCKED)"
            )
        };
        let replay = format!(
            "UPDATE {t} SET status = 'pending', attempts = 0, \
             suspect_count = LEAST(suspect_count, 1), next_attempt_at = NULL \
             WHERE status IN ('dead')"
        );
        let failures = "JSON_TABLE(?, '$[*]' COLUMNS ( \
               seq BIGINT PATH '$.seq', \
               status VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin PATH '$.status', \
               attempts INT PATH '$.attempts', \
               next_attempt_at DATETIME(6) PATH '$.next_attempt_at', \
               last_error LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin \
                 PATH '$.last_error', \
               unroutable_since DATETIME(6) PATH '$.unroutable_since', \
               error_group LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin \
                 PATH '$.error_group')) AS u";
        MysqlStoreSql {
            window: format!(
                "SELECT p.paused, w.seq AS window_seq, w.aggregate_type AS window_aggregate_type, \
                   w.aggregate_id AS window_aggregate_id, w.blocked \
                 FROM (SELECT {paused_q} AS paused) AS p \
                 LEFT JOIN ( \
                   SELECT c.seq, c.aggregate_type, c.aggregate_id, \
                     ({} OR {} OR {}) AS blocked \
                   FROM ( \
                     (SELECT e.seq, e.aggregate_type, e.aggregate_id, e.aggregate_key \
                      FROM (SELECT NOT {paused_q} AS go) AS g \
                      JOIN {t} AS e FORCE INDEX (outbox_events_status_seq) \
                      WHERE g.go AND e.status = 'pending' ORDER BY e.seq LIMIT ?) \
                     UNION ALL \
                     (SELECT e.seq, e.aggregate_type, e.aggregate_id, e.aggregate_key \
                      FROM (SELECT NOT {paused_q} AS go) AS g \
                      JOIN {t} AS e FORCE INDEX (outbox_events_retry_due) \
                      WHERE g.go AND e.status = 'retry' AND e.next_attempt_at <= UTC_TIMESTAMP(6) \
                      ORDER BY e.next_attempt_at LIMIT ?) \
                   ) AS c \
                   ORDER BY c.seq LIMIT ? \
                 ) AS w ON TRUE \
                 ORDER BY w.seq",
                earlier(&t, "c", "retry"),
                earlier(&t, "c", "dead"),
                earlier(&t, "c", "held"),
            ),
            lock: format!(
                "SELECT {prow} FROM {SEQS} \
                 STRAIGHT_JOIN {t} AS t FORCE INDEX (PRIMARY) ON t.seq = j.seq \
                 WHERE t.status = 'pending' \
                   OR (t.status = 'retry' AND t.next_attempt_at <= UTC_TIMESTAMP(6)) \
                 ORDER BY j.seq LIMIT ? \
                 FOR UPDATE SKIP LOCKED"
            ),
            claim_unordered: format!(
                "SELECT p.paused, k.* \
                 FROM (SELECT {paused_q} AS paused) AS p \
                 LEFT JOIN ( \
                   (SELECT {COLUMNS} FROM (SELECT NOT {paused_q} AS go) AS g \
                    JOIN {t} FORCE INDEX (outbox_events_status_seq) \
                    WHERE g.go AND status = 'pending' ORDER BY seq LIMIT ? \
                    FOR UPDATE SKIP LOCKED) \
                   UNION ALL \
                   (SELECT {COLUMNS} FROM (SELECT NOT {paused_q} AS go) AS g \
                    JOIN {t} FORCE INDEX (outbox_events_retry_due) \
                    WHERE g.go AND status = 'retry' AND next_attempt_at <= UTC_TIMESTAMP(6) \
                    ORDER BY next_attempt_at LIMIT ? \
                    FOR UPDATE SKIP LOCKED) \
                 ) AS k ON TRUE \
                 ORDER BY k.seq LIMIT ?"
            ),
            hold_lock: format!("{} UNION {}", hold_branch("retry"), hold_branch("dead")),
            hold_apply: format!(
                "UPDATE {SEQS} STRAIGHT_JOIN {t} AS t FORCE INDEX (PRIMARY) ON t.seq = j.seq \
                 SET t.status = 'held' WHERE t.status IN ('pending', 'retry')"
            ),
            release_pick: format!(
                "SELECT t.seq FROM ( \
                   SELECT DISTINCT j.aggregate_type, j.aggregate_id, \
                     UNHEX(SHA2(CONCAT(j.aggregate_type, CHAR(0), j.aggregate_id), 256)) \
                       AS aggregate_key \
                   FROM JSON_TABLE(?, '$[*]' COLUMNS ( \
                     aggregate_type VARCHAR(255) CHARACTER SET utf8mb4 \
                       COLLATE utf8mb4_nopad_bin PATH '$[0]', \
                     aggregate_id VARCHAR(2048) CHARACTER SET utf8mb4 \
                       COLLATE utf8mb4_nopad_bin PATH '$[1]')) AS j \
                 ) AS a \
                 STRAIGHT_JOIN {t} AS t FORCE INDEX (outbox_events_aggregate) \
                   ON t.status = 'held' AND t.aggregate_key = a.aggregate_key \
                   AND t.aggregate_type = a.aggregate_type AND t.aggregate_id = a.aggregate_id \
                 WHERE {} \
                 ORDER BY t.seq \
                 FOR UPDATE SKIP LOCKED",
                free("t"),
            ),
            release_orphans_pick: format!(
                "SELECT t.seq FROM ( \
                   SELECT h.aggregate_key, MIN(h.seq) AS first \
                   FROM {t} AS h FORCE INDEX (outbox_events_aggregate) \
                   WHERE h.status = 'held' GROUP BY h.aggregate_key \
                 ) AS a \
                 STRAIGHT_JOIN {t} AS t FORCE INDEX (outbox_events_aggregate) \
                   ON t.status = 'held' AND t.aggregate_key = a.aggregate_key \
                 WHERE {} \
                 ORDER BY t.seq \
                 FOR UPDATE SKIP LOCKED",
                free("t"),
            ),
            release_apply: format!(
                "UPDATE {SEQS} STRAIGHT_JOIN {t} AS t FORCE INDEX (PRIMARY) ON t.seq = j.seq \
                 SET t.status = 'pending' WHERE t.status = 'held'"
            ),
            release_unordered: format!("UPDATE {t} SET status = 'pending' WHERE status = 'held'"),
            mark_sent_keep: format!(
                "UPDATE {SEQS} STRAIGHT_JOIN {t} AS t FORCE INDEX (PRIMARY) ON t.seq = j.seq \
                 SET t.status = 'sent', t.published_at = UTC_TIMESTAMP(6), \
                   t.next_attempt_at = NULL \
                 WHERE t.status IN ('pending', 'retry')"
            ),
            mark_sent_delete: format!(
                "DELETE t, a FROM {SEQS} \
                 STRAIGHT_JOIN {t} AS t FORCE INDEX (PRIMARY) ON t.seq = j.seq \
                 LEFT JOIN {at} AS a ON a.event_seq = t.seq \
                 WHERE t.status IN ('pending', 'retry')"
            ),
            mark_failed: format!(
                "UPDATE {failures} \
                 STRAIGHT_JOIN {t} AS t FORCE INDEX (PRIMARY) ON t.seq = u.seq \
                 SET t.status = u.status, t.attempts = u.attempts, \
                   t.next_attempt_at = u.next_attempt_at, t.last_error = u.last_error, \
                   t.unroutable_since = u.unroutable_since, t.error_group = u.error_group \
                 WHERE t.status IN ('pending', 'retry')"
            ),
            failed_attempts: format!(
                "INSERT INTO {at} (event_seq, relay, outcome, error) \
                 SELECT t.seq, ?, IF(t.status = 'dead', 'dead', 'retry'), \
                   COALESCE(t.last_error, '') \
                 FROM {failures} \
                 STRAIGHT_JOIN {t} AS t FORCE INDEX (PRIMARY) \
                   ON t.seq = u.seq AND t.status = u.status \
                 ORDER BY t.seq"
            ),
            mark_suspect: format!(
                "UPDATE {SEQS} STRAIGHT_JOIN {t} AS t FORCE INDEX (PRIMARY) ON t.seq = j.seq \
                 SET t.suspect_count = t.suspect_count + 1, t.last_error = ?, \
                   t.error_group = ?"
            ),
            suspect_attempts: format!(
                "INSERT INTO {at} (event_seq, relay, outcome, error) \
                 SELECT t.seq, ?, 'suspect', ? FROM {SEQS} \
                 STRAIGHT_JOIN {t} AS t FORCE INDEX (PRIMARY) ON t.seq = j.seq \
                 ORDER BY t.seq"
            ),
            trim_pick: format!(
                "SELECT y.id FROM ( \
                   SELECT a.id, \
                     ROW_NUMBER() OVER (PARTITION BY a.event_seq ORDER BY a.id DESC) AS newer \
                   FROM {SEQS} JOIN {at} AS a ON a.event_seq = j.seq \
                 ) AS y WHERE y.newer > {ATTEMPTS_KEPT}"
            ),
            trim_apply: format!(
                "DELETE x FROM JSON_TABLE(?, '$[*]' COLUMNS (id BIGINT PATH '$')) AS j \
                 STRAIGHT_JOIN {at} AS x FORCE INDEX (PRIMARY) ON x.id = j.id"
            ),
            kill: format!(
                "UPDATE {t} SET status = 'dead', last_error = ?, error_group = ? WHERE seq = ?"
            ),
            kill_attempt: format!(
                "INSERT INTO {at} (event_seq, relay, outcome, error) \
                 SELECT seq, ?, 'dead', ? FROM {t} WHERE seq = ?"
            ),
            stats: format!(
                "SELECT \
                   (SELECT COUNT(*) FROM {t} WHERE status = 'pending') \
                   + (SELECT COUNT(*) FROM {t} WHERE status = 'retry') \
                   + (SELECT COUNT(*) FROM {t} WHERE status = 'held') AS backlog, \
                   (SELECT CAST(TIMESTAMPDIFF(MICROSECOND, MIN(o.o), UTC_TIMESTAMP(6)) AS DOUBLE) \
                      / 1000000 FROM ( \
                      (SELECT occurred_at AS o FROM {t} WHERE status = 'pending' \
                       ORDER BY seq LIMIT 1) \
                      UNION ALL (SELECT MIN(occurred_at) FROM {t} WHERE status = 'retry') \
                      UNION ALL (SELECT MIN(occurred_at) FROM {t} WHERE status = 'held') \
                    ) AS o) AS oldest_age, \
                   (SELECT COUNT(*) FROM {t} WHERE status = 'dead') AS dead, \
                   (SELECT COUNT(*) FROM {t} WHERE status = 'retry' \
                      AND unroutable_since IS NOT NULL) AS unroutable, \
                   (SELECT COUNT(*) FROM (SELECT DISTINCT aggregate_key FROM {t} \
                      WHERE status IN ('retry', 'dead')) AS b) AS blocked, \
                   (SELECT delivery_order FROM {settings} LIMIT 1) AS delivery_order, \
                   (SELECT COUNT(*) FROM {relays} WHERE NOT paused AND heartbeat_at > \
                      UTC_TIMESTAMP(6) - INTERVAL (3000 * heartbeat_interval_ms) MICROSECOND) \
                      AS relays_live"
            ),
            purge: format!(
                "DELETE t FROM ( \
                   SELECT seq FROM {t} FORCE INDEX (outbox_events_status_seq) \
                   WHERE status = ? AND COALESCE(published_at, occurred_at) < ? \
                   ORDER BY seq LIMIT ? \
                 ) AS d \
                 STRAIGHT_JOIN {t} AS t FORCE INDEX (PRIMARY) ON t.seq = d.seq \
                 WHERE t.status IN ('sent', 'skipped')"
            ),
            aggregate_of_id: format!("SELECT aggregate_type, aggregate_id FROM {t} WHERE id = ?"),
            replay_id: format!("{replay} AND id = ?"),
            replay_aggregate: format!(
                "{replay} AND aggregate_key = UNHEX(SHA2(CONCAT(?, CHAR(0), ?), 256)) \
                 AND aggregate_type = ? AND aggregate_id = ?"
            ),
            replay_all: replay,
            skip: format!(
                "UPDATE {t} SET status = 'skipped', next_attempt_at = NULL, \
                 finished_at = UTC_TIMESTAMP(6) WHERE id = ? AND status IN ('retry', 'dead')"
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
