//! The relay registry (`outbox_relays`): registration, heartbeats and
//! pauses, read by the admin.

use crate::schema::Schema;

/// `live` of a relays row.
pub(crate) const RELAY_LIVE: &str =
    "heartbeat_at > now() - 3 * heartbeat_interval_ms * interval '1 millisecond'";

/// The relay registry's statements.
#[derive(Debug)]
pub(crate) struct RelaysSql {
    /// Registers relay `$1` (`$2` host, `$3` pid, `$4` version, `$5`
    /// started at, `$6` heartbeat interval in ms); a relay that registers
    /// again under its name keeps its pause.
    pub(crate) register: String,
    /// Relay `$1`'s heartbeat with `$2` events in flight; returns `paused`
    /// (no row: it was removed meanwhile).
    pub(crate) heartbeat: String,
    /// Removes relay `$1` unless an operator paused it.
    pub(crate) deregister: String,
    /// Every relay, by name, with whether it is live.
    pub(crate) list: String,
    /// Pauses (`$2`) relay `$1` and counts it in audit row `$3`; returns
    /// `n`, the rows changed.
    pub(crate) set_paused: String,
    /// Removes relays whose last heartbeat is before `$1`, unless paused.
    pub(crate) purge_stale: String,
}

impl RelaysSql {
    pub(crate) fn postgres(schema: &Schema) -> Self {
        let r = schema.table("outbox_relays");
        let a = schema.table("outbox_audit");
        RelaysSql {
            register: format!(
                "INSERT INTO {r} (name, host, pid, version, started_at, heartbeat_at, \
                   heartbeat_interval_ms) VALUES ($1, $2, $3, $4, $5, now(), $6) \
                 ON CONFLICT (name) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid, \
                   version = EXCLUDED.version, started_at = EXCLUDED.started_at, \
                   heartbeat_at = now(), heartbeat_interval_ms = EXCLUDED.heartbeat_interval_ms, \
                   in_flight = 0"
            ),
            heartbeat: format!(
                "UPDATE {r} SET heartbeat_at = now(), in_flight = $2 WHERE name = $1 RETURNING paused"
            ),
            deregister: format!("DELETE FROM {r} WHERE name = $1 AND NOT paused"),
            list: format!(
                "SELECT name, host, pid, version, started_at, heartbeat_at, in_flight, paused, \
                   ({RELAY_LIVE}) AS live FROM {r} ORDER BY name"
            ),
            set_paused: format!(
                "WITH p AS (UPDATE {r} SET paused = $2 WHERE name = $1 RETURNING 1), \
                 u AS (UPDATE {a} SET count = count + (SELECT count(*) FROM p) WHERE id = $3) \
                 SELECT count(*) AS n FROM p"
            ),
            purge_stale: format!("DELETE FROM {r} WHERE heartbeat_at < $1 AND NOT paused"),
        }
    }
}
