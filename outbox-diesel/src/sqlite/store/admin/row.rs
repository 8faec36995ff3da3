//! The rows the admin reads on SQLite (time columns are INTEGER µs since
//! the epoch), and how they become `crate::rows`' plain fields.

use diesel::sql_types::{BigInt, Bool, Integer, Nullable, Text};

use crate::rows::{GroupFields, RelayFields};
use crate::sqlite::sql::time;

#[derive(diesel::QueryableByName)]
pub(super) struct CountRow {
    #[diesel(sql_type = BigInt)]
    pub(super) n: i64,
}

#[derive(diesel::QueryableByName)]
pub(super) struct LastRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(super) last: Option<i64>,
}

/// Events of one status and event type.
#[derive(diesel::QueryableByName)]
pub(super) struct TypeRow {
    #[diesel(sql_type = Text)]
    pub(super) event_type: String,
    #[diesel(sql_type = Text)]
    pub(super) status: String,
    #[diesel(sql_type = BigInt)]
    pub(super) n: i64,
}

/// `sent` and `skipped` rows counted up to a limit, and every row.
#[derive(diesel::QueryableByName)]
pub(super) struct DoneRow {
    #[diesel(sql_type = BigInt)]
    pub(super) sent: i64,
    #[diesel(sql_type = BigInt)]
    pub(super) skipped: i64,
    #[diesel(sql_type = BigInt)]
    pub(super) estimate: i64,
}

/// Failures of one event type, raw error and status.
#[derive(diesel::QueryableByName)]
pub(super) struct GroupRow {
    #[diesel(sql_type = Text)]
    pub(super) event_type: String,
    #[diesel(sql_type = Text)]
    pub(super) last_error: String,
    #[diesel(sql_type = Text)]
    pub(super) status: String,
    #[diesel(sql_type = BigInt)]
    pub(super) n: i64,
    #[diesel(sql_type = BigInt)]
    pub(super) first: i64,
    #[diesel(sql_type = BigInt)]
    pub(super) last: i64,
}

impl From<GroupRow> for GroupFields {
    fn from(r: GroupRow) -> Self {
        GroupFields {
            event_type: r.event_type,
            error: r.last_error,
            status: r.status,
            n: r.n,
            first: time(r.first),
            last: time(r.last),
        }
    }
}

#[derive(diesel::QueryableByName)]
pub(super) struct AttemptRow {
    #[diesel(sql_type = BigInt)]
    pub(super) at: i64,
    #[diesel(sql_type = Nullable<Text>)]
    pub(super) relay: Option<String>,
    #[diesel(sql_type = Text)]
    pub(super) outcome: String,
    #[diesel(sql_type = Text)]
    pub(super) error: String,
}

#[derive(diesel::QueryableByName)]
pub(super) struct RelayRow {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Text)]
    host: String,
    #[diesel(sql_type = Integer)]
    pid: i32,
    #[diesel(sql_type = Text)]
    version: String,
    #[diesel(sql_type = BigInt)]
    started_at: i64,
    #[diesel(sql_type = BigInt)]
    heartbeat_at: i64,
    #[diesel(sql_type = Integer)]
    in_flight: i32,
    #[diesel(sql_type = Bool)]
    paused: bool,
    #[diesel(sql_type = Bool)]
    live: bool,
}

impl From<RelayRow> for RelayFields {
    fn from(r: RelayRow) -> Self {
        RelayFields {
            name: r.name,
            host: r.host,
            pid: r.pid,
            version: r.version,
            started_at: time(r.started_at),
            heartbeat_at: time(r.heartbeat_at),
            in_flight: r.in_flight,
            paused: r.paused,
            live: r.live,
        }
    }
}

/// The first statement of a purge chunk: its last seq and whether every
/// row of it occurred after the cutoff.
#[derive(diesel::QueryableByName)]
pub(super) struct PurgeRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(super) last: Option<i64>,
    #[diesel(sql_type = Bool)]
    pub(super) past: bool,
}
