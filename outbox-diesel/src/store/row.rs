//! Reading outbox rows back.

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bool, Integer, Nullable, Text, Timestamptz};
use outbox_core::{EventEnvelope, EventStatus, Headers, OutboxRecord};
use uuid::Uuid;

use crate::{Error, Result};

#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct EventRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) seq: i64,
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    id: Uuid,
    #[diesel(sql_type = Text)]
    aggregate_type: String,
    #[diesel(sql_type = Text)]
    aggregate_id: String,
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
    #[diesel(sql_type = Timestamptz)]
    occurred_at: DateTime<Utc>,
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Integer)]
    attempts: i32,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    next_attempt_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Text>)]
    last_error: Option<String>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    published_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    unroutable_since: Option<DateTime<Utc>>,
    #[diesel(sql_type = Integer)]
    suspect_count: i32,
}

impl EventRow {
    /// Its aggregate type.
    pub(crate) fn aggregate_type(&self) -> &str {
        &self.aggregate_type
    }

    /// Its aggregate id.
    pub(crate) fn aggregate_id(&self) -> &str {
        &self.aggregate_id
    }

    /// As [`into_record`](Self::into_record), but a row whose headers are
    /// not a map of strings reads with none (what the admin API shows of a
    /// malformed row, whose `last_error` says what is wrong).
    pub(crate) fn into_record_lenient(self) -> OutboxRecord {
        let headers = serde_json::from_str(&self.headers).unwrap_or_default();
        // The table's CHECK constraint allows only known statuses.
        let status = self.status.parse().unwrap_or(EventStatus::Dead);
        self.build(headers, status)
    }

    pub(crate) fn into_record(self) -> Result<OutboxRecord> {
        let seq = self.seq;
        let malformed = |reason: String| Error::MalformedRow { seq, reason };
        let headers: Headers = serde_json::from_str(&self.headers)
            .map_err(|e| malformed(format!("headers are not a map of strings: {e}")))?;
        let status: EventStatus = self.status.parse().map_err(|e| malformed(format!("{e}")))?;
        Ok(self.build(headers, status))
    }

    fn build(self, headers: Headers, status: EventStatus) -> OutboxRecord {
        let seq = self.seq;
        OutboxRecord {
            seq,
            envelope: EventEnvelope {
                id: self.id,
                aggregate_type: self.aggregate_type,
                aggregate_id: self.aggregate_id,
                aggregate_version: self.aggregate_version,
                event_type: self.event_type,
                schema_version: self.schema_version,
                payload: self.payload,
                headers,
                occurred_at: self.occurred_at,
            },
            status,
            attempts: u32::try_from(self.attempts).unwrap_or(0),
            next_attempt_at: self.next_attempt_at,
            last_error: self.last_error,
            published_at: self.published_at,
            unroutable_since: self.unroutable_since,
            suspect_count: u32::try_from(self.suspect_count).unwrap_or(0),
        }
    }
}

/// A row of an ordered claim's result: whether the claiming relay is
/// paused, and a row of its window (none when the window is empty, as it is
/// for a paused relay: the claim then yields this one row).
#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct WindowRow {
    #[diesel(sql_type = Bool)]
    pub(crate) paused: bool,
    #[diesel(embed)]
    pub(crate) slot: Option<WindowSlotRow>,
}

/// A row of an ordered claim's window, with the row itself when the claim
/// locked it.
#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct WindowSlotRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) window_seq: i64,
    #[diesel(sql_type = Text)]
    pub(crate) window_aggregate_type: String,
    #[diesel(sql_type = Text)]
    pub(crate) window_aggregate_id: String,
    /// An earlier event of its aggregate is dead, held, or waits for a
    /// retry that is not due.
    #[diesel(sql_type = Bool)]
    pub(crate) blocked: bool,
    /// `None` when the claim did not lock it (blocked, held by another
    /// relay, changed since the window was read, or beyond the limit).
    #[diesel(embed)]
    pub(crate) locked: Option<EventRow>,
}

/// A row of an unordered claim's result: whether the claiming relay is
/// paused, and a locked row (none when nothing was locked: the claim then
/// yields this one row).
#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct UnorderedRow {
    #[diesel(sql_type = Bool)]
    pub(crate) paused: bool,
    #[diesel(embed)]
    pub(crate) locked: Option<EventRow>,
}

#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct StatsRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) backlog: i64,
    #[diesel(sql_type = Nullable<diesel::sql_types::Double>)]
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

#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct ManyRow {
    #[diesel(sql_type = Bool)]
    pub(crate) many: bool,
}

#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct VersionRow {
    #[diesel(sql_type = Integer)]
    pub(crate) version: i32,
}

#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct OrderRow {
    #[diesel(sql_type = Text)]
    pub(crate) delivery_order: String,
}

#[derive(Debug, diesel::QueryableByName)]
pub(crate) struct PausedRow {
    #[diesel(sql_type = Bool)]
    pub(crate) paused: bool,
}
