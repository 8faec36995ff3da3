//! The rows the admin reads.

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Bool, Integer, Nullable, Text, Timestamptz};
use outbox_core::admin::RelayInfo;

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
    #[diesel(sql_type = Timestamptz)]
    pub(super) first: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    pub(super) last: DateTime<Utc>,
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
pub(super) struct ChunkRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(super) last: Option<i64>,
    #[diesel(sql_type = BigInt)]
    pub(super) changed: i64,
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
    #[diesel(sql_type = Timestamptz)]
    pub(super) at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(super) relay: Option<String>,
    #[diesel(sql_type = Text)]
    pub(super) outcome: String,
    #[diesel(sql_type = Text)]
    pub(super) error: String,
}

#[derive(diesel::QueryableByName)]
pub(super) struct AuditRow {
    #[diesel(sql_type = BigInt)]
    pub(super) id: i64,
    #[diesel(sql_type = Timestamptz)]
    pub(super) at: DateTime<Utc>,
    #[diesel(sql_type = Text)]
    pub(super) identity: String,
    #[diesel(sql_type = Text)]
    pub(super) action: String,
    #[diesel(sql_type = Text)]
    pub(super) target: String,
    #[diesel(sql_type = BigInt)]
    pub(super) count: i64,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub(super) finished_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Text>)]
    pub(super) outcome: Option<String>,
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
    #[diesel(sql_type = Timestamptz)]
    started_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    heartbeat_at: DateTime<Utc>,
    #[diesel(sql_type = Integer)]
    in_flight: i32,
    #[diesel(sql_type = Bool)]
    paused: bool,
    #[diesel(sql_type = Bool)]
    live: bool,
}

impl From<RelayRow> for RelayInfo {
    fn from(r: RelayRow) -> Self {
        RelayInfo::from(crate::rows::RelayFields {
            name: r.name,
            host: r.host,
            pid: r.pid,
            version: r.version,
            started_at: r.started_at,
            heartbeat_at: r.heartbeat_at,
            in_flight: r.in_flight,
            paused: r.paused,
            live: r.live,
        })
    }
}

pub(super) use crate::rows::count;

#[derive(diesel::QueryableByName)]
pub(super) struct PurgeRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(super) last: Option<i64>,
    #[diesel(sql_type = BigInt)]
    pub(super) changed: i64,
    #[diesel(sql_type = Bool)]
    pub(super) past: bool,
}
