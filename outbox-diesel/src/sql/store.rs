//! The relay store's statements: claims, marks, stats, replays and the
//! delivery order. They depend on
//! [`keep_sent`](crate::PgOutboxStoreBuilder::keep_sent) too, so they are
//! rendered when the store is built.

use outbox_core::{EventStatus, Transition};

use super::literals;
use super::relays::RELAY_LIVE;
use crate::schema::Schema;

/// How a claim's transaction starts. A claim runs the same prepared
/// statement every time, on a table whose statistics may describe a very
/// different backlog (a drained one after a burst, or the reverse); with
/// them PostgreSQL may keep planning it afresh for every execution (measured:
/// 0.3–0.8 ms of planning per claim after a 20,000-event backlog was
/// analyzed, against 0.01 ms) though its generic plan, index scans bounded by
/// the window, is as good or better (execution 0.67 vs 1.1–1.3 ms for a
/// 100-row claim). `SET LOCAL` ends with the transaction.
/// `work_mem` is raised for the same reason: a generic plan built on
/// statistics that count many more `retry`/`dead` rows than exist would
/// otherwise not hash the ordered claim's set of blocked aggregates and
/// rescan it for every window row (measured: 2.7 s per claim); the hash
/// only ever holds the few thousand rows the store lets that claim run
/// with.
/// `jit` is off for the claim and the marks: their estimated cost grows
/// with the table (about 365,000 with a 1,000,000-event backlog, above
/// `jit_above_cost`, and above the inlining and optimizing thresholds past
/// about 200,000), so with the server's default `jit = on` every claim of
/// a large backlog compiled 88–141 functions, 0.1–3 s, for 1–4 ms of
/// execution: the bench's drain of 1,000,000 events fell to a tenth of
/// its 20,000-event rate (W6; 0.76 or better with `jit` off). Index scans
/// bounded by a `LIMIT` never repay a compilation.
pub(crate) const CLAIM_BEGIN: &str = "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; \
     SET LOCAL work_mem = '64MB'; SET LOCAL jit = off";

/// `explain_claim`'s statements for one claim statement: prepared under a
/// session-level name (so that it runs with the generic plan, as the
/// relay's claims do), explained with literal arguments (as a claim of no
/// relay, with a 60 s timeout), and deallocated.
#[derive(Debug)]
pub(crate) struct ExplainSql {
    pub(crate) prepare: String,
    pub(crate) explain: String,
    pub(crate) deallocate: &'static str,
}

impl ExplainSql {
    /// For the unordered claim `claim` of `limit` events.
    pub(crate) fn unordered(claim: &str, limit: i64) -> Self {
        ExplainSql::new(
            claim,
            "int8, text, text",
            &format!("{limit}, '60000', NULL"),
        )
    }

    /// For the ordered claim `claim` of `limit` events in a window of
    /// `window`.
    pub(crate) fn ordered(claim: &str, window: i64, limit: i64) -> Self {
        ExplainSql::new(
            claim,
            "int8, int8, text, text",
            &format!("{window}, {limit}, '60000', NULL"),
        )
    }

    fn new(claim: &str, types: &str, args: &str) -> Self {
        ExplainSql {
            prepare: format!("PREPARE outbox_explain_claim ({types}) AS {claim}"),
            explain: format!(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE outbox_explain_claim ({args})"
            ),
            deallocate: "DEALLOCATE outbox_explain_claim",
        }
    }
}

/// The columns of an outbox row, as the store's `EventRow` reads them.
pub(crate) const COLUMNS: &str = "seq, id, aggregate_type, aggregate_id, aggregate_version, \
    event_type, schema_version, payload::text AS payload, headers::text AS headers, occurred_at, \
    status, attempts, next_attempt_at, last_error, published_at, unroutable_since, suspect_count";

/// The relay store's statements, rendered once per store.
#[derive(Debug)]
pub(crate) struct StoreSql {
    /// The ordered claim when few events block: probes only aggregates that
    /// have a `retry` or `dead` event (see [`StoreSql::postgres`]).
    pub(crate) claim_ordered: String,
    /// The ordered claim when many events block: probes every window row.
    pub(crate) claim_ordered_probing: String,
    pub(crate) claim_unordered: String,
    pub(crate) mark_sent: String,
    pub(crate) mark_failed: String,
    /// Counts a connection's death against rows (`$1`: seqs, `$2`: reason):
    /// `suspect_count + 1`, `last_error`; nothing else.
    pub(crate) mark_suspect: String,
    /// Holds the given rows (`$1`: seqs) that are still pending.
    pub(crate) hold: String,
    /// Releases every held row (unordered mode).
    pub(crate) release_unordered: String,
    /// Releases the held rows of aggregates where no `retry` or `dead`
    /// event precedes the first held one (left behind by a race, a manual
    /// edit or a relay of an earlier version). Costs a probe per aggregate
    /// with held rows, not per held row.
    pub(crate) release_orphans: String,
    /// Marks one row `dead` with a reason (`$1` seq, `$2` reason).
    pub(crate) kill_malformed: String,
    /// Whether more than `$1` events are `retry` or `dead`.
    pub(crate) many_blocking: String,
    pub(crate) stats: String,
    pub(crate) purge: String,
    pub(crate) replay_id: String,
    pub(crate) replay_aggregate: String,
    pub(crate) replay_all: String,
    pub(crate) skip: String,
    pub(crate) get_order: String,
    pub(crate) set_order: String,
    pub(crate) schema_version: String,
}

impl StoreSql {
    pub(crate) fn postgres(schema: &Schema, keep_sent: bool) -> Self {
        let t = schema.table("outbox_events");
        let at = schema.table("outbox_attempts");
        let settings = schema.table("outbox_settings");
        let pending = literals(&[EventStatus::Pending]);
        let retry = literals(&[EventStatus::Retry]);
        let dead = literals(&[EventStatus::Dead]);
        let held = literals(&[EventStatus::Held]);
        let heads = literals(&[EventStatus::Retry, EventStatus::Dead]);
        let holdable = literals(Transition::Hold.from());
        // Whether an earlier event of the window row's aggregate holds it
        // back: a dead one, a retry (due or not: a due retry may be outside
        // the window, whose retries are the first due, not the first by
        // seq), or a held one. Two probes, each on a partial index that is
        // empty while nothing fails.
        let probe = format!(
            "(EXISTS ( \
                SELECT 1 FROM {t} b \
                WHERE b.aggregate_type = w0.aggregate_type AND b.aggregate_id = w0.aggregate_id \
                  AND b.seq < w0.seq AND b.status IN ({heads})) \
              OR EXISTS ( \
                SELECT 1 FROM {t} h \
                WHERE h.aggregate_type = w0.aggregate_type AND h.aggregate_id = w0.aggregate_id \
                  AND h.seq < w0.seq AND h.status IN ({held})))"
        );
        // Only aggregates with a `retry` or `dead` event can be held back:
        // a held event always has one before it (the store keeps it so). A
        // hashed set of them, read from the small `outbox_events_blocking`
        // index, spares the probes of every other aggregate's rows.
        let gate = format!(
            "(w0.aggregate_type, w0.aggregate_id) IN ( \
               SELECT aggregate_type, aggregate_id FROM {t} WHERE status IN ({heads}))"
        );
        // The claiming relay's pause (`$3` unordered, `$4` ordered: its
        // name; NULL for a claim of no relay), in the claim's statement so
        // that an operator's pause takes effect at the relay's next claim
        // without a round trip of its own: one primary-key probe of
        // `outbox_relays`, returned in a row the claim yields even when it
        // claims nothing (`pause LEFT JOIN ...`). It gates the scans that
        // pick rows through their `LIMIT`, 0 when paused: a `Limit` of 0
        // runs nothing below it (a paused relay's claim touches 2 buffers),
        // where a gating filter would cost a node per row of the window.
        // Measured cost: see `PgOutboxStore::claim_for`.
        let paused_probe = |param: &str| {
            format!(
                "pause AS (SELECT EXISTS ( \
                   SELECT 1 FROM {relays} WHERE name = {param} AND paused) AS paused)",
                relays = schema.table("outbox_relays"),
            )
        };
        let unless_paused = "LIMIT CASE WHEN (SELECT paused FROM pause) THEN 0 ELSE $1 END";
        // `r` locks the window's due retries by primary key. Its conditions
        // are wrapped in `IS TRUE` so that no partial index can serve them:
        // with statistics taken while `outbox_events_blocking` was nearly
        // empty, the planner would walk every dead event in it (measured:
        // 213 of a claim's buffers with 1,000 dead heads).
        let ordered = |gate: &str| {
            let paused = paused_probe("$4");
            format!(
                "WITH {paused}, w0 AS ( \
                   SELECT c.seq, c.aggregate_type, c.aggregate_id, c.retry FROM ( \
                     (SELECT seq, aggregate_type, aggregate_id, false AS retry FROM {t} \
                      WHERE status IN ({pending}) ORDER BY seq LIMIT $1) \
                     UNION ALL \
                     (SELECT seq, aggregate_type, aggregate_id, true AS retry FROM {t} \
                      WHERE status IN ({retry}) AND next_attempt_at <= now() \
                      ORDER BY next_attempt_at LIMIT $1) \
                   ) c ORDER BY c.seq {unless_paused} \
                 ), w AS ( \
                   SELECT w0.seq, w0.aggregate_type, w0.aggregate_id, w0.retry, \
                     {gate} AND {probe} AS blocked \
                   FROM w0 \
                 ), l AS ( \
                   SELECT {COLUMNS} FROM {t} \
                   WHERE status IN ({pending}) AND seq <= (SELECT max(seq) FROM w) \
                     AND (seq IN (SELECT seq FROM w WHERE NOT blocked)) IS TRUE \
                   ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED \
                 ), r AS ( \
                   SELECT {COLUMNS} FROM {t} \
                   WHERE seq = ANY (ARRAY(SELECT seq FROM w WHERE retry AND NOT blocked)) \
                     AND (status IN ({retry}) AND next_attempt_at <= now()) IS TRUE \
                   ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED \
                 ), h AS ( \
                   UPDATE {t} AS t SET status = {held} \
                   WHERE t.seq IN ( \
                       SELECT p.seq FROM {t} p \
                       WHERE p.seq = ANY (ARRAY(SELECT seq FROM w WHERE blocked)) \
                         AND p.status IN ({holdable}) \
                       FOR UPDATE SKIP LOCKED) \
                     AND EXISTS ( \
                       SELECT 1 FROM {t} x \
                       WHERE x.aggregate_type = t.aggregate_type AND x.aggregate_id = t.aggregate_id \
                         AND x.seq < t.seq AND x.status IN ({heads}) \
                       FOR SHARE SKIP LOCKED) \
                   RETURNING t.seq \
                 ) \
                 SELECT pause.paused, w.seq AS window_seq, \
                   w.aggregate_type AS window_aggregate_type, \
                   w.aggregate_id AS window_aggregate_id, w.blocked, k.*, \
                   set_config('idle_in_transaction_session_timeout', $3, true) AS claim_timeout \
                 FROM pause LEFT JOIN ( \
                   w LEFT JOIN (SELECT * FROM l UNION ALL SELECT * FROM r) k ON k.seq = w.seq \
                 ) ON true \
                 ORDER BY w.seq"
            )
        };
        let release_where = format!(
            "t.status IN ({held}) AND NOT EXISTS ( \
               SELECT 1 FROM {t} b \
               WHERE b.aggregate_type = t.aggregate_type AND b.aggregate_id = t.aggregate_id \
                 AND b.seq < t.seq AND b.status IN ({heads}))"
        );
        StoreSql {
            claim_ordered: ordered(&gate),
            claim_ordered_probing: ordered("true"),
            // Pending rows in seq order and due retries, each by its own
            // partial index; locked rows past the limit are dropped by the
            // store (and stay locked, unused, until the claim ends).
            claim_unordered: format!(
                "WITH {paused}, l AS ( \
                   SELECT {COLUMNS} FROM {t} WHERE status IN ({pending}) \
                   ORDER BY seq {unless_paused} FOR UPDATE SKIP LOCKED \
                 ), r AS ( \
                   SELECT {COLUMNS} FROM {t} \
                   WHERE status IN ({retry}) AND next_attempt_at <= now() \
                   ORDER BY next_attempt_at {unless_paused} FOR UPDATE SKIP LOCKED \
                 ) \
                 SELECT pause.paused, k.*, \
                   set_config('idle_in_transaction_session_timeout', $2, true) AS claim_timeout \
                 FROM pause LEFT JOIN (SELECT * FROM l UNION ALL SELECT * FROM r) k ON true \
                 ORDER BY k.seq LIMIT $1",
                paused = paused_probe("$3"),
            ),
            mark_sent: if keep_sent {
                format!(
                    "UPDATE {t} SET status = '{sent}', published_at = now(), next_attempt_at = NULL \
                     WHERE seq = ANY($1) AND status IN ({from})",
                    sent = Transition::Publish.to().as_str(),
                    from = literals(Transition::Publish.from()),
                )
            } else {
                // With the attempt history of events that had failed (a
                // semi-join on an empty set for the others).
                format!(
                    "WITH d AS ( \
                       DELETE FROM {t} WHERE seq = ANY($1) AND status IN ({from}) \
                       RETURNING seq, last_error \
                     ) DELETE FROM {at} WHERE event_seq IN ( \
                       SELECT seq FROM d WHERE last_error IS NOT NULL)",
                    from = literals(Transition::Publish.from()),
                )
            },
            // Also keeps the attempt in `outbox_attempts` ($7: the relay),
            // trimming the event's history to the last ATTEMPTS_KEPT.
            mark_failed: format!(
                "WITH u AS ( \
                   UPDATE {t} AS t SET status = u.status, attempts = u.attempts, \
                   next_attempt_at = u.next_attempt_at, last_error = u.last_error, \
                   unroutable_since = u.unroutable_since, error_group = u.error_group \
                   FROM UNNEST($1::int8[], $2::text[], $3::int4[], $4::timestamptz[], $5::text[], \
                     $6::timestamptz[], $8::text[]) \
                     AS u(seq, status, attempts, next_attempt_at, last_error, unroutable_since, \
                       error_group) \
                   WHERE t.seq = u.seq AND t.status IN ({from}) \
                   RETURNING t.seq, t.status, t.last_error \
                 ), a AS ( \
                   INSERT INTO {at} (event_seq, relay, outcome, error) \
                   SELECT seq, $7, CASE WHEN status = '{dead_name}' THEN 'dead' ELSE 'retry' END, \
                     coalesce(last_error, '') FROM u \
                 ) {trim}",
                from = literals(Transition::Retry.from()),
                dead_name = EventStatus::Dead.as_str(),
                trim = trim_attempts(&at, "u"),
            ),
            mark_suspect: format!(
                "WITH u AS ( \
                   UPDATE {t} SET suspect_count = suspect_count + 1, last_error = $2, \
                     error_group = $4 \
                   WHERE seq = ANY($1) RETURNING seq \
                 ), a AS ( \
                   INSERT INTO {at} (event_seq, relay, outcome, error) \
                   SELECT seq, $3, 'suspect', $2 FROM u \
                 ) {trim}",
                trim = trim_attempts(&at, "u"),
            ),
            hold: format!(
                "UPDATE {t} SET status = '{to}' WHERE seq IN ( \
                   SELECT seq FROM {t} WHERE seq = ANY($1) AND status IN ({from}) \
                   FOR UPDATE SKIP LOCKED)",
                to = Transition::Hold.to().as_str(),
                from = literals(Transition::Hold.from()),
            ),
            release_orphans: format!(
                "WITH RECURSIVE a AS ( \
                   (SELECT aggregate_type, aggregate_id, seq FROM {t} WHERE status IN ({held}) \
                    ORDER BY aggregate_type, aggregate_id, seq LIMIT 1) \
                   UNION ALL \
                   SELECT n.aggregate_type, n.aggregate_id, n.seq FROM a, LATERAL ( \
                     SELECT aggregate_type, aggregate_id, seq FROM {t} \
                     WHERE status IN ({held}) \
                       AND (aggregate_type, aggregate_id) > (a.aggregate_type, a.aggregate_id) \
                     ORDER BY aggregate_type, aggregate_id, seq LIMIT 1) n \
                 ), orphans AS ( \
                   SELECT a.aggregate_type, a.aggregate_id FROM a WHERE NOT EXISTS ( \
                     SELECT 1 FROM {t} b \
                     WHERE b.aggregate_type = a.aggregate_type AND b.aggregate_id = a.aggregate_id \
                       AND b.seq < a.seq AND b.status IN ({heads})) \
                 ) \
                 UPDATE {t} AS t SET status = '{to}' FROM orphans o \
                 WHERE t.aggregate_type = o.aggregate_type AND t.aggregate_id = o.aggregate_id \
                   AND {release_where}",
                to = Transition::Release.to().as_str(),
            ),
            release_unordered: format!(
                "UPDATE {t} SET status = '{to}' WHERE status IN ({held})",
                to = Transition::Release.to().as_str(),
            ),
            kill_malformed: format!(
                "WITH u AS ( \
                   UPDATE {t} SET status = '{to}', last_error = $2, error_group = $4 \
                   WHERE seq = $1 RETURNING seq \
                 ), a AS ( \
                   INSERT INTO {at} (event_seq, relay, outcome, error) \
                   SELECT seq, $3, 'dead', $2 FROM u \
                 ) {trim}",
                to = Transition::Kill.to().as_str(),
                trim = trim_attempts(&at, "u"),
            ),
            many_blocking: format!(
                "SELECT count(*) > $1 AS many FROM ( \
                   SELECT 1 FROM {t} WHERE status IN ({heads}) LIMIT $1 + 1) b"
            ),
            // Each count and minimum matches one partial index (a list of
            // statuses matching none would scan the table).
            stats: format!(
                "SELECT \
                   (SELECT count(*) FROM {t} WHERE status IN ({pending})) \
                   + (SELECT count(*) FROM {t} WHERE status IN ({retry})) \
                   + (SELECT count(*) FROM {t} WHERE status IN ({held})) AS backlog, \
                   (SELECT extract(epoch FROM now() - min(o))::float8 FROM ( \
                      (SELECT occurred_at AS o FROM {t} WHERE status IN ({pending}) \
                       ORDER BY seq LIMIT 1) \
                      UNION ALL (SELECT min(occurred_at) FROM {t} WHERE status IN ({retry})) \
                      UNION ALL (SELECT min(occurred_at) FROM {t} WHERE status IN ({held})) \
                    ) AS oldest) AS oldest_age, \
                   (SELECT count(*) FROM {t} WHERE status IN ({dead})) AS dead, \
                   (SELECT count(*) FROM {t} WHERE status IN ({retry}) \
                      AND unroutable_since IS NOT NULL) AS unroutable, \
                   (SELECT count(*) FROM (SELECT DISTINCT aggregate_type, aggregate_id FROM {t} \
                      WHERE status IN ({heads})) AS b) AS blocked, \
                   (SELECT delivery_order FROM {settings}) AS delivery_order, \
                   (SELECT count(*) FROM {relays} WHERE {live} AND NOT paused) AS relays_live",
                relays = schema.table("outbox_relays"),
                live = RELAY_LIVE,
            ),
            purge: format!(
                "DELETE FROM {t} WHERE seq IN ( \
                   SELECT seq FROM {t} WHERE status IN ({done}) \
                     AND coalesce(published_at, occurred_at) < $1 ORDER BY seq LIMIT $2)",
                done = literals(&[EventStatus::Sent, EventStatus::Skipped]),
            ),
            replay_id: format!("{} AND id = $1", replay(&t)),
            replay_aggregate: format!(
                "{} AND aggregate_type = $1 AND aggregate_id = $2",
                replay(&t)
            ),
            replay_all: replay(&t),
            skip: format!(
                "UPDATE {t} SET {set} WHERE id = $1 AND status IN ({from})",
                set = skip_set(),
                from = literals(Transition::Skip.from()),
            ),
            get_order: format!("SELECT delivery_order FROM {settings}"),
            set_order: format!("UPDATE {settings} SET delivery_order = $1"),
            schema_version: format!(
                "SELECT coalesce(max(version), 0) AS version FROM {}",
                schema.table("outbox_schema_version")
            ),
        }
    }
}

/// The end of a statement whose CTE `cte` returned the `seq` of events that
/// just got an attempt row: deletes their rows beyond the last
/// [`ATTEMPTS_KEPT`](outbox_core::admin::ATTEMPTS_KEPT) (the new row is not
/// visible to it, so it keeps one fewer of the older ones).
fn trim_attempts(at: &str, cte: &str) -> String {
    let older = outbox_core::admin::ATTEMPTS_KEPT.saturating_sub(1);
    format!(
        "DELETE FROM {at} x WHERE x.event_seq IN (SELECT seq FROM {cte}) AND x.id <= ( \
           SELECT y.id FROM {at} y WHERE y.event_seq = x.event_seq \
           ORDER BY y.id DESC OFFSET {older} LIMIT 1)"
    )
}

/// The `SET` list of a replay: back to pending with attempts reset, the
/// suspect count lowered to 1 (published alone first), `seq` kept.
pub(super) fn replay_set() -> String {
    format!(
        "status = '{}', attempts = 0, suspect_count = LEAST(suspect_count, 1), \
         next_attempt_at = NULL",
        Transition::Replay.to().as_str()
    )
}

/// The `SET` list of a skip: never published; `finished_at` starts its
/// retention.
pub(super) fn skip_set() -> String {
    format!(
        "status = '{}', next_attempt_at = NULL, finished_at = now()",
        Transition::Skip.to().as_str()
    )
}

fn replay(t: &str) -> String {
    format!(
        "UPDATE {t} SET {set} WHERE status IN ({from})",
        set = replay_set(),
        from = literals(Transition::Replay.from()),
    )
}
