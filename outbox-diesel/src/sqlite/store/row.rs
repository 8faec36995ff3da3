//! The SQLite store's rows: an event row (uuids as text, times as INTEGER
//! µs since the epoch) and the small rows of the window, stats, settings.

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bool, Double, Integer, Nullable, Text};
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
    #[diesel(sql_type = BigInt)]
    occurred_at: i64,
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Integer)]
    attempts: i32,
    #[diesel(sql_type = Nullable<BigInt>)]
    next_attempt_at: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    last_error: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    published_at: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    unroutable_since: Option<i64>,
    #[diesel(sql_type = Integer)]
    suspect_count: i32,
}

/// µs since the epoch as a time (`None` out of chrono's range).
fn time(micros: i64) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_micros(micros)
}

impl EventRow {
    /// The record, or [`Error::MalformedRow`] if another writer stored an
    /// id, headers, a status or a time this library cannot read.
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
        let occurred_at = time(self.occurred_at).ok_or_else(|| {
            malformed(format!("occurred_at {} is out of range", self.occurred_at))
        })?;
        Ok(self.build(id, headers, status, occurred_at))
    }

    /// The record as far as it can be read, for the admin's listings: a
    /// row another writer stored malformed is shown, not an error (headers
    /// it cannot read are empty, an unknown status reads as `dead`, a time
    /// out of range as the epoch).
    pub(crate) fn into_record_lenient(self) -> OutboxRecord {
        let id = self.id.parse().unwrap_or_default();
        let headers = serde_json::from_str(&self.headers).unwrap_or_default();
        // The table's CHECK constraint allows only known statuses.
        let status = self.status.parse().unwrap_or(EventStatus::Dead);
        let occurred_at = time(self.occurred_at).unwrap_or_default();
        self.build(id, headers, status, occurred_at)
    }

    fn build(
        self,
        id: uuid::Uuid,
        headers: Headers,
        status: EventStatus,
        occurred_at: DateTime<Utc>,
    ) -> OutboxRecord {
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
                occurred_at,
            },
            status,
            attempts: u32::try_from(self.attempts).unwrap_or(0),
            next_attempt_at: self.next_attempt_at.and_then(time),
            last_error: self.last_error,
            published_at: self.published_at.and_then(time),
            unroutable_since: self.unroutable_since.and_then(time),
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
    /// Leased by a claim whose lease has not expired.
    #[diesel(sql_type = Bool)]
    pub(crate) locked: bool,
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
