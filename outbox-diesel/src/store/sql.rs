//! The store's SQL, rendered once per schema.

use outbox_core::{EventStatus, Transition};

use crate::schema::Schema;

/// `'pending', 'retry'` for a list of statuses.
pub(crate) fn literals(statuses: &[EventStatus]) -> String {
    statuses
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The columns of an outbox row, as [`EventRow`](super::row::EventRow) reads them.
pub(crate) const COLUMNS: &str = "seq, id, aggregate_type, aggregate_id, aggregate_version, \
    event_type, schema_version, payload::text AS payload, headers::text AS headers, occurred_at, \
    status, attempts, next_attempt_at, last_error, published_at";

#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) claim_ordered: String,
    pub(crate) claim_unordered: String,
    pub(crate) mark_sent: String,
    pub(crate) mark_failed: String,
    pub(crate) stats: String,
    pub(crate) purge: String,
    pub(crate) replay_id: String,
    pub(crate) replay_aggregate: String,
    pub(crate) replay_all: String,
    pub(crate) skip: String,
    pub(crate) get_order: String,
    pub(crate) set_order: String,
    /// Keep the statements prepared on each connection.
    pub(crate) prepare: bool,
}

impl Sql {
    pub(crate) fn new(schema: &Schema, keep_sent: bool, prepare: bool) -> Self {
        let t = schema.table("outbox_events");
        let settings = schema.table("outbox_settings");
        let unsent = literals(&[EventStatus::Pending, EventStatus::Retry]);
        let claimable = literals(Transition::Publish.from());
        let due = "(next_attempt_at IS NULL OR next_attempt_at <= now())";
        let dead = literals(&[EventStatus::Dead]);
        let retry = literals(&[EventStatus::Retry]);
        Sql {
            // `blocked` probes the blocking index once per window row, but
            // only when some row blocks at all (an InitPlan, run once): most
            // of the time none does, and the probes were about a third of a
            // 100-row claim's server time (pgbench: 1.08–1.19 vs 1.64–1.77 ms).
            claim_ordered: format!(
                "WITH w AS ( \
                   SELECT w.seq, w.aggregate_type, w.aggregate_id, \
                     (SELECT EXISTS ( \
                        SELECT 1 FROM {t} a WHERE a.status IN ({blocking}) \
                          AND (a.status IN ({dead}) OR a.next_attempt_at > now()))) \
                     AND EXISTS ( \
                       SELECT 1 FROM {t} b \
                       WHERE b.aggregate_type = w.aggregate_type \
                         AND b.aggregate_id = w.aggregate_id \
                         AND b.seq < w.seq AND b.status IN ({blocking}) \
                         AND (b.status IN ({dead}) OR b.next_attempt_at > now()) \
                     ) AS blocked \
                   FROM (SELECT seq, aggregate_type, aggregate_id FROM {t} \
                         WHERE status IN ({unsent}) AND {due} ORDER BY seq LIMIT $1) w \
                 ), l AS ( \
                   SELECT {COLUMNS} FROM {t} \
                   WHERE seq IN (SELECT seq FROM w WHERE NOT blocked) \
                     AND status IN ({claimable}) AND {due} \
                   ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED \
                 ) \
                 SELECT w.aggregate_type AS window_aggregate_type, \
                   w.aggregate_id AS window_aggregate_id, w.blocked, l.*, \
                   set_config('idle_in_transaction_session_timeout', $3, true) AS claim_timeout \
                 FROM w LEFT JOIN l ON l.seq = w.seq \
                 ORDER BY w.seq",
                blocking = literals(&[EventStatus::Retry, EventStatus::Dead]),
            ),
            claim_unordered: format!(
                "SELECT {COLUMNS}, \
                 set_config('idle_in_transaction_session_timeout', $2, true) AS claim_timeout \
                 FROM {t} \
                 WHERE status IN ({claimable}) AND {due} \
                 ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED"
            ),
            mark_sent: if keep_sent {
                format!(
                    "UPDATE {t} SET status = '{sent}', published_at = now(), next_attempt_at = NULL \
                     WHERE seq = ANY($1) AND status IN ({from})",
                    sent = Transition::Publish.to().as_str(),
                    from = literals(Transition::Publish.from()),
                )
            } else {
                format!(
                    "DELETE FROM {t} WHERE seq = ANY($1) AND status IN ({from})",
                    from = literals(Transition::Publish.from()),
                )
            },
            mark_failed: format!(
                "UPDATE {t} AS t SET status = u.status, attempts = u.attempts, \
                 next_attempt_at = u.next_attempt_at, last_error = u.last_error \
                 FROM UNNEST($1::int8[], $2::text[], $3::int4[], $4::timestamptz[], $5::text[]) \
                   AS u(seq, status, attempts, next_attempt_at, last_error) \
                 WHERE t.seq = u.seq AND t.status IN ({from})",
                from = literals(Transition::Retry.from()),
            ),
            stats: format!(
                "SELECT \
                   (SELECT count(*) FROM {t} WHERE status IN ({unsent})) AS backlog, \
                   (SELECT extract(epoch FROM now() - occurred_at)::float8 FROM {t} \
                      WHERE status IN ({unsent}) ORDER BY seq LIMIT 1) AS oldest_age, \
                   (SELECT count(*) FROM {t} WHERE status IN ({dead})) AS dead, \
                   (SELECT count(*) FROM (SELECT DISTINCT aggregate_type, aggregate_id FROM {t} \
                      WHERE status IN ({dead}, {retry})) AS b) AS blocked, \
                   (SELECT delivery_order FROM {settings}) AS delivery_order"
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
                "UPDATE {t} SET status = '{to}' WHERE id = $1 AND status IN ({from})",
                to = Transition::Skip.to().as_str(),
                from = literals(Transition::Skip.from()),
            ),
            get_order: format!("SELECT delivery_order FROM {settings}"),
            set_order: format!("UPDATE {settings} SET delivery_order = $1"),
            prepare,
        }
    }
}

fn replay(t: &str) -> String {
    format!(
        "UPDATE {t} SET status = '{to}', attempts = 0, next_attempt_at = NULL \
         WHERE status IN ({from})",
        to = Transition::Replay.to().as_str(),
        from = literals(Transition::Replay.from()),
    )
}
