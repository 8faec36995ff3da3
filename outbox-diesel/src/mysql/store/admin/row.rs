//! The rows the admin reads on MariaDB (times are UTC `DATETIME(6)`),
//! turned into the plain rows of [`crate::rows`].

use chrono::NaiveDateTime;
use diesel::sql_types::{BigInt, Bool, Datetime, Integer, Nullable, Text};

use crate::rows::{GroupFields, RelayFields};

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
    #[diesel(sql_type = Datetime)]
    pub(super) first: NaiveDateTime,
    #[diesel(sql_type = Datetime)]
    pub(super) last: NaiveDateTime,
}

impl From<GroupRow> for GroupFields {
    fn from(r: GroupRow) -> Self {
        GroupFields {
            event_type: r.event_type,
            error: r.last_error,
            status: r.status,
            n: r.n,
            first: r.first.and_utc(),
            last: r.last.and_utc(),
        }
    }
}

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

#[derive(diesel::QueryableByName)]
pub(super) struct TypeRow {
    #[diesel(sql_type = Text)]
    pub(super) event_type: String,
    #[diesel(sql_type = Text)]
    pub(super) status: String,
    #[diesel(sql_type = BigInt)]
    pub(super) n: i64,
}

#[derive(diesel::QueryableByName)]
pub(super) struct DoneRow {
    #[diesel(sql_type = BigInt)]
    pub(super) sent: i64,
    #[diesel(sql_type = BigInt)]
    pub(super) skipped: i64,
    #[diesel(sql_type = BigInt)]
    pub(super) estimate: i64,
}

#[derive(diesel::QueryableByName)]
pub(super) struct AttemptRow {
    #[diesel(sql_type = Datetime)]
    pub(super) at: NaiveDateTime,
    #[diesel(sql_type = Nullable<Text>)]
    pub(super) relay: Option<String>,
    #[diesel(sql_type = Text)]
    pub(super) outcome: String,
    #[diesel(sql_type = Text)]
    pub(super) error: String,
}

#[derive(diesel::QueryableByName)]
pub(super) struct PurgeWindowRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(super) last: Option<i64>,
    #[diesel(sql_type = Bool)]
    pub(super) past: bool,
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
    #[diesel(sql_type = Datetime)]
    started_at: NaiveDateTime,
    #[diesel(sql_type = Datetime)]
    heartbeat_at: NaiveDateTime,
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
            started_at: r.started_at.and_utc(),
            heartbeat_at: r.heartbeat_at.and_utc(),
            in_flight: r.in_flight,
            paused: r.paused,
            live: r.live,
        }
    }
}
