//! The MariaDB store's rows: an event row (uuids as text, times as UTC
//! `DATETIME(6)`) and the small rows of the window, stats and settings.

use chrono::NaiveDateTime;
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bool, Datetime, Double, Integer, Nullable, Text};
use outbox_core::{EventEnvelope, EventStatus, Headers, OutboxRecord};

use crate::{Error, Result};

#[derive(Debug, QueryableByName)]
pub(crate) struct EventRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) seq: i64,
    #[diesel(sql_type = Text)]
    id: String,
    #[diesel(sql_type = Text)]
    pub(crate) aggregate_type: String,
    #[diesel(sql_type = Text)]
    pub(crate) aggregate_id: String,
    #[diesel(sql_type = Nullable<BigInt>)]
    aggregate_version: Option<i64>,
    #[diesel(sql_type = Text)]
    event_type: String,
    #[diesel(sql_type = Integer)]
    schema_version: i32,
    #[diesel(sql_type = Text)]
    payload: String,
    #[diesel(sql_type = Text)]
    headers: String,
    #[diesel(sql_type = Datetime)]
    occurred_at: NaiveDateTime,
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Integer)]
    attempts: i32,
    #[diesel(sql_type = Nullable<Datetime>)]
    next_attempt_at: Option<NaiveDateTime>,
    #[diesel(sql_type = Nullable<Text>)]
    last_error: Option<String>,
    #[diesel(sql_type = Nullable<Datetime>)]
    published_at: Option<NaiveDateTime>,
    #[diesel(sql_type = Nullable<Datetime>)]
    unroutable_since: Option<NaiveDateTime>,
    #[diesel(sql_type = Integer)]
    suspect_count: i32,
}

impl EventRow {
    /// The record as the admin shows it, whatever another writer stored:
    /// an unreadable id reads as the nil UUID, unreadable headers as none,
    /// an unknown status as `dead` (the table's CHECK allows only known
    /// ones).
    pub(crate) fn into_record_lenient(self) -> OutboxRecord {
        let id = self.id.parse().unwrap_or_default();
        let headers = serde_json::from_str(&self.headers).unwrap_or_default();
        let status = self.status.parse().unwrap_or(EventStatus::Dead);
        self.build(id, headers, status)
    }

    /// The record, or [`Error::MalformedRow`] if another writer stored an
    /// id, headers or a status this library cannot read.
    pub(crate) fn into_record(self) -> Result<OutboxRecord> {
        let seq = self.seq;
        let malformed = |reason: String| Error::MalformedRow { seq, reason };
        let id = self
            .id
            .parse()
            .map_err(|e| malformed(format!("id {:?} is not a UUID: {e}", self.id)))?;
        let headers: Headers = serde_json::from_str(&self.headers)
            .map_err(|e| malformed(format!("headers are not a map of strings: {e}")))?;
        let status: EventStatus = self.status.parse().map_err(|e| malformed(format!("{e}")))?;
        Ok(self.build(id, headers, status))
    }

    fn build(self, id: uuid::Uuid, headers: Headers, status: EventStatus) -> OutboxRecord {
        OutboxRecord {
            seq: self.seq,
            envelope: EventEnvelope {
                id,
                aggregate_type: self.aggregate_type,
                aggregate_id: self.aggregate_id,
                aggregate_version: self.aggregate_version,
                event_type: self.event_type,
                schema_version: self.schema_version,
                payload: self.payload,
                headers,
                occurred_at: self.occurred_at.and_utc(),
            },
            status,
            attempts: u32::try_from(self.attempts).unwrap_or(0),
            next_attempt_at: self.next_attempt_at.map(|t| t.and_utc()),
            last_error: self.last_error,
            published_at: self.published_at.map(|t| t.and_utc()),
            unroutable_since: self.unroutable_since.map(|t| t.and_utc()),
            suspect_count: u32::try_from(self.suspect_count).unwrap_or(0),
        }
    }
}

/// A row of the window statement: the relay's pause, and a window slot
/// (NULLs when the window is empty or the relay paused).
#[derive(Debug, QueryableByName)]
pub(crate) struct WindowRow {
    #[diesel(sql_type = Bool)]
    pub(crate) paused: bool,
    #[diesel(embed)]
    pub(crate) slot: Option<WindowSlotRow>,
}

#[derive(Debug, QueryableByName)]
pub(crate) struct WindowSlotRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) window_seq: i64,
    #[diesel(sql_type = Text)]
    pub(crate) window_aggregate_type: String,
    #[diesel(sql_type = Text)]
    pub(crate) window_aggregate_id: String,
    #[diesel(sql_type = Bool)]
    pub(crate) blocked: bool,
}

/// A row of the unordered claim: the relay's pause, and a locked event
/// (NULLs when none or paused).
#[derive(Debug, QueryableByName)]
pub(crate) struct UnorderedRow {
    #[diesel(sql_type = Bool)]
    pub(crate) paused: bool,
    #[diesel(embed)]
    pub(crate) locked: Option<EventRow>,
}

#[derive(Debug, QueryableByName)]
pub(crate) struct IdRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) id: i64,
}

#[derive(Debug, QueryableByName)]
pub(crate) struct AggregateRow {
    #[diesel(sql_type = Text)]
    pub(crate) aggregate_type: String,
    #[diesel(sql_type = Text)]
    pub(crate) aggregate_id: String,
}

#[derive(Debug, QueryableByName)]
pub(crate) struct SeqRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) seq: i64,
}

#[derive(Debug, QueryableByName)]
pub(crate) struct StatsRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) backlog: i64,
    #[diesel(sql_type = Nullable<Double>)]
    pub(crate) oldest_age: Option<f64>,
    #[diesel(sql_type = BigInt)]
    pub(crate) dead: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) unroutable: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) blocked: i64,
    #[diesel(sql_type = Text)]
    pub(crate) delivery_order: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) relays_live: i64,
}

#[derive(Debug, QueryableByName)]
pub(crate) struct OrderRow {
    #[diesel(sql_type = Text)]
    pub(crate) delivery_order: String,
}

#[derive(Debug, QueryableByName)]
pub(crate) struct VersionRow {
    #[diesel(sql_type = Integer)]
    pub(crate) version: i32,
}

#[derive(Debug, QueryableByName)]
pub(crate) struct PausedRow {
    #[diesel(sql_type = Bool)]
    pub(crate) paused: bool,
}
