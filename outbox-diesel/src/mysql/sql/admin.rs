//! The admin's statements on MariaDB (`OutboxAdmin` on the store, the
//! audit trail, the relay registry as the admin sees it): the texts of
//! `docs/design/mysql-statements.md` sections 7 and 8, each bound with
//! positional `?` in text order.
//!
//! Reads and chunks that take an `EventFilter` are a fixed head, the
//! filter's conditions (each ` AND …`, built per call) and a fixed tail;
//! their binds follow the text order, so a `LIMIT ?` in the tail is bound
//! after the filter's values.

use super::MysqlSql;
use crate::mysql::store::COLUMNS;

/// How long an admin chunk waits for rows a relay's claim holds, in
/// seconds (`innodb_lock_wait_timeout` of the chunk's locking read).
pub(crate) const ADMIN_LOCK_WAIT_SECS: u32 = 5;

/// How an admin chunk's transaction starts: at `READ COMMITTED` (no gap
/// locks that would block producers' inserts), as the claims do.
pub(crate) const ADMIN_BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; \
     BEGIN; SAVEPOINT outbox_tx";

/// What failure groups are made of: the normalized error written with it,
/// or the raw error.
pub(crate) const ERROR_KEY: &str = "COALESCE(error_group, last_error)";

/// A statement with the filter's conditions between `head` and `tail`.
#[derive(Debug)]
pub(crate) struct FilteredSql {
    /// Up to the filter's conditions.
    pub(crate) head: String,
    /// After them.
    pub(crate) tail: String,
}

/// The admin's statements.
#[derive(Debug)]
pub(crate) struct MysqlAdminSql {
    /// Per unsent or dead status, counts by event type: `event_type`,
    /// `status`, `n`.
    pub(crate) status_by_type: String,
    /// Binds: limit, limit, database name (NULL: the connection's). Row:
    /// `sent`, `skipped` (each counted up to the limit), `estimate`.
    pub(crate) status_done: String,
    /// Binds: after seq, the filter's, limit.
    pub(crate) list: FilteredSql,
    /// Binds: id.
    pub(crate) show: String,
    /// Binds: seq. Rows: `at`, `relay`, `outcome`, `error`.
    pub(crate) attempts: String,
    /// Binds: the filter's. Row: `n`.
    pub(crate) count: FilteredSql,
    /// Row: `last` (NULL: no event).
    pub(crate) last_seq: String,
    /// Binds: type, id, type, id. The first `retry` or `dead` event of the
    /// aggregate.
    pub(crate) head: String,
    /// Binds: the filter's, rows read at most. Rows: `event_type`,
    /// `last_error`, `status`, `n`, `first`, `last`.
    pub(crate) groups: FilteredSql,
    /// Binds: after seq, the filter's, limit. Rows: `seq` of the chunk,
    /// locked, waiting at most [`ADMIN_LOCK_WAIT_SECS`] for rows another
    /// transaction holds.
    pub(crate) chunk_select: FilteredSql,
    /// Binds: seqs (JSON). Replays the dead ones.
    pub(crate) replay_chunk: String,
    /// Binds: seqs (JSON). Skips the retrying and dead ones.
    pub(crate) skip_chunk: String,
    /// Binds: seqs (JSON). Makes the waiting retries due now.
    pub(crate) retry_now_chunk: String,
    /// Binds: seqs (JSON). Rows: `seq` of the held events of their
    /// aggregates that nothing holds back any more, locked (skipping what
    /// others lock).
    pub(crate) release_pick_seqs: String,
    /// Binds: limit. Deletes attempt rows whose event is gone.
    pub(crate) purge_orphan_attempts: String,
    /// Binds: before, after seq, limit. Row: `last` (the chunk's last seq,
    /// whatever its status), `past` (every row of the chunk occurred after
    /// `before`: nothing later was published before it).
    pub(crate) purge_sent_window: String,
    /// Binds: after seq, last seq, before. Rows: `seq` of the chunk's sent
    /// and skipped events done before `before`, locked, skipping locked
    /// ones.
    pub(crate) purge_sent_pick: String,
    /// Binds: seqs (JSON). Deletes them and their attempts.
    pub(crate) purge_sent_delete: String,
    /// Binds: before, limit. Deletes inbox entries received before it.
    pub(crate) purge_inbox_chunk: String,
    /// Binds: before, limit. Deletes dead-letter records settled before it.
    pub(crate) purge_dead_letter_records_chunk: String,
    /// Binds: count, audit id. Adds a chunk's count to its audit row.
    pub(crate) audit_add_count: String,
    /// Rows: every relay by name with `live`.
    pub(crate) relays_list: String,
    /// Binds: paused, name. Matched rows: 1 if the relay exists.
    pub(crate) relays_set_paused: String,
    /// Binds: before. Removes relays not heard of since, unless paused.
    pub(crate) relays_purge_stale: String,
}

/// The audit trail's statements, shared by the store's admin and
/// [`MysqlDeadLetters`](crate::mysql::MysqlDeadLetters).
#[derive(Debug)]
pub(crate) struct MysqlAuditSql {
    /// Binds: identity, action, target (JSON text). Row: `id`.
    pub(crate) begin: String,
    /// Binds: count (nullable), outcome (nullable), outcome again, id.
    pub(crate) record: String,
    /// Binds: before id, limit. Newest first.
    pub(crate) log: String,
}

impl MysqlAuditSql {
    pub(crate) fn new(shared: &MysqlSql) -> Self {
        let a = shared.table("outbox_audit");
        MysqlAuditSql {
            begin: format!(
                "INSERT INTO {a} (identity, action, target) VALUES (?, ?, ?) RETURNING id"
            ),
            record: format!(
                "UPDATE {a} SET count = COALESCE(?, count), \
                 finished_at = IF(? IS NULL, finished_at, UTC_TIMESTAMP(6)), \
                 outcome = COALESCE(?, outcome) WHERE id = ?"
            ),
            log: format!(
                "SELECT id, at, identity, action, target, count, finished_at, outcome FROM {a} \
                 WHERE id < ? ORDER BY id DESC LIMIT ?"
            ),
        }
    }
}

/// A JSON array of seqs, as the table `j (seq)`.
const SEQS: &str = "JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$')) AS j";

impl MysqlAdminSql {
    pub(crate) fn new(shared: &MysqlSql) -> Self {
        let t = shared.table("outbox_events");
        let at = shared.table("outbox_attempts");
        let a = shared.table("outbox_audit");
        let i = shared.table("inbox_events");
        let d = shared.table("inbox_dead_letters");
        let r = shared.table("outbox_relays");
        let by_pk = format!("STRAIGHT_JOIN {t} AS t FORCE INDEX (PRIMARY) ON t.seq = j.seq");
        let free = |status: &str| {
            format!(
                "NOT EXISTS (SELECT 1 FROM {t} AS b FORCE INDEX (outbox_events_aggregate) \
                   WHERE b.status = '{status}' AND b.aggregate_key = t.aggregate_key \
                   AND b.seq < t.seq AND b.aggregate_type = t.aggregate_type \
                   AND b.aggregate_id = t.aggregate_id)"
            )
        };
        MysqlAdminSql {
            status_by_type: ["pending", "retry", "held", "dead"]
                .map(|status| {
                    format!(
                        "(SELECT event_type, '{status}' AS status, COUNT(*) AS n FROM {t} \
                         WHERE status = '{status}' GROUP BY event_type)"
                    )
                })
                .join(" UNION ALL "),
            status_done: format!(
                "SELECT \
                   (SELECT COUNT(*) FROM (SELECT 1 FROM {t} WHERE status = 'sent' LIMIT ?) AS s) \
                     AS sent, \
                   (SELECT COUNT(*) FROM (SELECT 1 FROM {t} WHERE status = 'skipped' LIMIT ?) \
                     AS s) AS skipped, \
                   CAST(COALESCE((SELECT TABLE_ROWS FROM information_schema.TABLES \
                     WHERE TABLE_SCHEMA = COALESCE(?, DATABASE()) \
                     AND TABLE_NAME = 'outbox_events'), 0) AS SIGNED) AS estimate"
            ),
            list: FilteredSql {
                head: format!("SELECT {COLUMNS} FROM {t} WHERE seq > ?"),
                tail: " ORDER BY seq LIMIT ?".to_owned(),
            },
            show: format!("SELECT {COLUMNS} FROM {t} WHERE id = ?"),
            attempts: format!(
                "SELECT at, relay, outcome, error FROM {at} WHERE event_seq = ? ORDER BY id"
            ),
            count: FilteredSql {
                head: format!("SELECT COUNT(*) AS n FROM {t} WHERE TRUE"),
                tail: String::new(),
            },
            last_seq: format!("SELECT MAX(seq) AS last FROM {t}"),
            head: format!(
                "SELECT {COLUMNS} FROM {t} WHERE seq = ( \
                   SELECT MIN(seq) FROM {t} WHERE status IN ('retry', 'dead') \
                     AND aggregate_key = UNHEX(SHA2(CONCAT(?, CHAR(0), ?), 256)) \
                     AND aggregate_type = ? AND aggregate_id = ?)"
            ),
            groups: FilteredSql {
                head: format!(
                    "SELECT event_type, {ERROR_KEY} AS last_error, status, COUNT(*) AS n, \
                       MIN(occurred_at) AS first, MAX(occurred_at) AS last \
                     FROM {t} WHERE last_error IS NOT NULL"
                ),
                tail: " GROUP BY 1, 2, 3 LIMIT ?".to_owned(),
            },
            chunk_select: FilteredSql {
                head: format!(
                    "SET STATEMENT innodb_lock_wait_timeout = {ADMIN_LOCK_WAIT_SECS} FOR \
                     SELECT seq FROM {t} WHERE seq > ?"
                ),
                tail: " ORDER BY seq LIMIT ? FOR UPDATE".to_owned(),
            },
            replay_chunk: format!(
                "UPDATE {SEQS} {by_pk} \
                 SET t.status = 'pending', t.attempts = 0, \
                   t.suspect_count = LEAST(t.suspect_count, 1), t.next_attempt_at = NULL \
                 WHERE t.status IN ('dead')"
            ),
            skip_chunk: format!(
                "UPDATE {SEQS} {by_pk} \
                 SET t.status = 'skipped', t.next_attempt_at = NULL, \
                   t.finished_at = UTC_TIMESTAMP(6) \
                 WHERE t.status IN ('retry', 'dead')"
            ),
            retry_now_chunk: format!(
                "UPDATE {SEQS} {by_pk} \
                 SET t.next_attempt_at = UTC_TIMESTAMP(6) \
                 WHERE t.status IN ('retry') AND t.next_attempt_at > UTC_TIMESTAMP(6)"
            ),
            release_pick_seqs: format!(
                "SELECT t.seq FROM ( \
                   SELECT DISTINCT o.aggregate_type, o.aggregate_id, o.aggregate_key \
                   FROM {SEQS} \
                   STRAIGHT_JOIN {t} AS o FORCE INDEX (PRIMARY) ON o.seq = j.seq \
                 ) AS a \
                 STRAIGHT_JOIN {t} AS t FORCE INDEX (outbox_events_aggregate) \
                   ON t.status = 'held' AND t.aggregate_key = a.aggregate_key \
                   AND t.aggregate_type = a.aggregate_type AND t.aggregate_id = a.aggregate_id \
                 WHERE {} AND {} \
                 ORDER BY t.seq \
                 FOR UPDATE SKIP LOCKED",
                free("retry"),
                free("dead"),
            ),
            purge_orphan_attempts: format!(
                "DELETE FROM {at} WHERE NOT EXISTS ( \
                   SELECT 1 FROM {t} AS e WHERE e.seq = {at}.event_seq) \
                 ORDER BY id LIMIT ?"
            ),
            purge_sent_window: format!(
                "SELECT MAX(s.seq) AS last, COALESCE(MIN(s.occurred_at) >= ?, TRUE) AS past \
                 FROM (SELECT seq, occurred_at FROM {t} WHERE seq > ? ORDER BY seq LIMIT ?) AS s"
            ),
            purge_sent_pick: format!(
                "SELECT seq FROM {t} \
                 WHERE seq > ? AND seq <= ? AND status IN ('sent', 'skipped') \
                   AND COALESCE(published_at, finished_at, occurred_at) < ? \
                 FOR UPDATE SKIP LOCKED"
            ),
            purge_sent_delete: format!(
                "DELETE t, a FROM {SEQS} {by_pk} \
                 LEFT JOIN {at} AS a ON a.event_seq = t.seq \
                 WHERE t.status IN ('sent', 'skipped')"
            ),
            purge_inbox_chunk: format!(
                "DELETE FROM {i} WHERE received_at < ? ORDER BY received_at LIMIT ?"
            ),
            purge_dead_letter_records_chunk: format!(
                "DELETE FROM {d} WHERE COALESCE(replayed_at, purged_at) < ? ORDER BY id LIMIT ?"
            ),
            audit_add_count: format!("UPDATE {a} SET count = count + ? WHERE id = ?"),
            relays_list: format!(
                "SELECT name, host, pid, version, started_at, heartbeat_at, in_flight, paused, \
                   (heartbeat_at > UTC_TIMESTAMP(6) \
                     - INTERVAL (3000 * heartbeat_interval_ms) MICROSECOND) AS live \
                 FROM {r} ORDER BY name"
            ),
            relays_set_paused: format!("UPDATE {r} SET paused = ? WHERE name = ?"),
            relays_purge_stale: format!("DELETE FROM {r} WHERE heartbeat_at < ? AND NOT paused"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::dead_letters::MysqlDeadLetterSql;
    use super::*;

    #[test]
    fn a_named_database_qualifies_every_admin_table() -> crate::Result<()> {
        let shared = MysqlSql::new(Some("bill`ing"))?;
        let admin = MysqlAdminSql::new(&shared);
        let audit = MysqlAuditSql::new(&shared);
        let letters = MysqlDeadLetterSql::new(&shared);
        for text in [
            &admin.status_by_type,
            &admin.list.head,
            &admin.head,
            &admin.chunk_select.head,
            &admin.replay_chunk,
            &admin.release_pick_seqs,
            &admin.purge_sent_delete,
            &admin.purge_inbox_chunk,
            &admin.purge_dead_letter_records_chunk,
            &admin.relays_list,
            &audit.begin,
            &audit.log,
            &letters.list,
            &letters.mark_replayed,
            &letters.mark_purged,
        ] {
            assert!(text.contains("`bill``ing`."), "{text}");
        }
        // Every unqualified table name is preceded by the database.
        let unqualified = admin.purge_sent_delete.replace("`bill``ing`.", "");
        assert_eq!(
            unqualified.matches("outbox_").count(),
            admin
                .purge_sent_delete
                .matches("`bill``ing`.outbox_")
                .count()
        );
        Ok(())
    }

    #[test]
    fn a_chunk_waits_a_bounded_time_and_locks_in_seq_order() {
        let admin = MysqlAdminSql::new(&MysqlSql::default_database());
        assert!(
            admin
                .chunk_select
                .head
                .starts_with("SET STATEMENT innodb_lock_wait_timeout = 5 FOR SELECT seq"),
            "{}",
            admin.chunk_select.head
        );
        assert!(
            admin
                .chunk_select
                .tail
                .ends_with("ORDER BY seq LIMIT ? FOR UPDATE")
        );
        assert!(ADMIN_BEGIN.starts_with("SET TRANSACTION ISOLATION LEVEL READ COMMITTED;"));
    }
}
