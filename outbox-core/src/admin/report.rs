//! What the admin API reports.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::{DeliveryOrder, EventStatus, Headers, OutboxRecord};

/// The state of an outbox at a glance (`outbox status`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StatusReport {
    /// Events per status. `pending`, `retry`, `held` and `dead` are exact;
    /// a store may count `sent` and `skipped` exactly only up to a limit
    /// (PostgreSQL: 100,000 each) and estimate beyond it, saying so in
    /// [`StatusCounts::estimated`].
    pub counts: StatusCounts,
    /// Age of the oldest unsent event, in seconds.
    pub oldest_unsent_age_seconds: Option<f64>,
    /// Aggregates held back by a `retry` or `dead` head (ordered mode).
    pub blocked_aggregates: u64,
    /// Events held because the broker returned them as unroutable.
    pub unroutable: u64,
    /// Unsent and dead events per event type, most first.
    pub by_event_type: Vec<EventTypeCounts>,
    /// Registered relays, live or stale.
    pub relays: Vec<RelayInfo>,
    /// The outbox's delivery order.
    pub delivery_order: DeliveryOrder,
}

/// Events per status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StatusCounts {
    /// `pending`.
    pub pending: u64,
    /// `retry`.
    pub retry: u64,
    /// `held`.
    pub held: u64,
    /// `dead`.
    pub dead: u64,
    /// `sent` (kept for audit until purged).
    pub sent: u64,
    /// `skipped`.
    pub skipped: u64,
    /// `true` when `sent` and `skipped` are estimates.
    pub estimated: bool,
}

impl StatusCounts {
    /// Events still to publish (`pending`, `retry`, `held`).
    pub fn unsent(&self) -> u64 {
        self.pending + self.retry + self.held
    }

    /// The count of one status.
    pub fn get(&self, status: EventStatus) -> u64 {
        match status {
            EventStatus::Pending => self.pending,
            EventStatus::Retry => self.retry,
            EventStatus::Held => self.held,
            EventStatus::Dead => self.dead,
            EventStatus::Sent => self.sent,
            EventStatus::Skipped => self.skipped,
        }
    }

    /// Adds one event of `status`.
    pub fn add(&mut self, status: EventStatus, n: u64) {
        let slot = match status {
            EventStatus::Pending => &mut self.pending,
            EventStatus::Retry => &mut self.retry,
            EventStatus::Held => &mut self.held,
            EventStatus::Dead => &mut self.dead,
            EventStatus::Sent => &mut self.sent,
            EventStatus::Skipped => &mut self.skipped,
        };
        *slot += n;
    }
}

/// Unsent and dead events of one event type.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EventTypeCounts {
    /// The event type.
    pub event_type: String,
    /// Its counts (`sent` and `skipped` are 0: not counted per type).
    pub counts: StatusCounts,
}

impl EventTypeCounts {
    /// Counts of one event type.
    pub fn new(event_type: impl Into<String>, counts: StatusCounts) -> Self {
        EventTypeCounts {
            event_type: event_type.into(),
            counts,
        }
    }
}

/// A relay as it registered itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RelayInfo {
    /// Its name (unique per outbox).
    pub name: String,
    /// Host it runs on.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Library version.
    pub version: String,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// Its last heartbeat.
    pub heartbeat_at: DateTime<Utc>,
    /// Batches in flight at the last heartbeat.
    pub in_flight: u32,
    /// Paused by an operator.
    pub paused: bool,
    /// Whether its heartbeat is recent (within three heartbeat intervals).
    pub live: bool,
}

impl RelayInfo {
    /// A relay that started at `started_at` and has not heartbeaten since
    /// (set the other fields after).
    pub fn new(
        name: impl Into<String>,
        host: impl Into<String>,
        pid: u32,
        version: impl Into<String>,
        started_at: DateTime<Utc>,
    ) -> Self {
        RelayInfo {
            name: name.into(),
            host: host.into(),
            pid,
            version: version.into(),
            started_at,
            heartbeat_at: started_at,
            in_flight: 0,
            paused: false,
            live: false,
        }
    }
}

/// One event in a listing: everything but payload and headers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EventSummary {
    /// Position in the outbox.
    pub seq: i64,
    /// Event id.
    pub id: Uuid,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Event type.
    pub event_type: String,
    /// Status.
    pub status: EventStatus,
    /// Failed attempts.
    pub attempts: u32,
    /// Times the broker connection died with it in flight.
    pub suspect_count: u32,
    /// When it was recorded.
    pub occurred_at: DateTime<Utc>,
    /// When a `retry` event is due.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Since when it is held as unroutable.
    pub unroutable_since: Option<DateTime<Utc>>,
    /// When the broker confirmed it.
    pub published_at: Option<DateTime<Utc>>,
    /// The last failure's reason.
    pub last_error: Option<String>,
}

impl From<&OutboxRecord> for EventSummary {
    fn from(r: &OutboxRecord) -> Self {
        let e = &r.envelope;
        EventSummary {
            seq: r.seq,
            id: e.id,
            aggregate_type: e.aggregate_type.clone(),
            aggregate_id: e.aggregate_id.clone(),
            event_type: e.event_type.clone(),
            status: r.status,
            attempts: r.attempts,
            suspect_count: r.suspect_count,
            occurred_at: e.occurred_at,
            next_attempt_at: r.next_attempt_at,
            unroutable_since: r.unroutable_since,
            published_at: r.published_at,
            last_error: r.last_error.clone(),
        }
    }
}

/// One event, whole (`outbox events show`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct EventDetail {
    /// Every column of the listing.
    #[serde(flatten)]
    pub summary: EventSummary,
    /// Aggregate version, if tracked.
    pub aggregate_version: Option<i64>,
    /// Payload schema version.
    pub schema_version: i32,
    /// The payload (JSON), `None` when redacted.
    pub payload: Option<serde_json::Value>,
    /// The headers, `None` when redacted.
    pub headers: Option<Headers>,
    /// The failure group of its last error, if any.
    pub group: Option<String>,
    /// Its last attempts that failed, oldest first (the store keeps the last
    /// [`ATTEMPTS_KEPT`](super::ATTEMPTS_KEPT)).
    pub history: Vec<Attempt>,
}

impl EventDetail {
    /// The detail of a record with its history.
    pub fn new(record: &OutboxRecord, history: Vec<Attempt>) -> Self {
        let e = &record.envelope;
        let payload = serde_json::from_str(&e.payload)
            .unwrap_or_else(|_| serde_json::Value::String(e.payload.clone()));
        EventDetail {
            summary: EventSummary::from(record),
            aggregate_version: e.aggregate_version,
            schema_version: e.schema_version,
            payload: Some(payload),
            headers: Some(e.headers.clone()),
            group: record
                .last_error
                .as_ref()
                .map(|err| super::group_id(&e.event_type, &super::normalize_error(err))),
            history,
        }
    }

    /// Without payload and headers (for callers not allowed to see them).
    #[must_use]
    pub fn redacted(mut self) -> Self {
        self.payload = None;
        self.headers = None;
        self
    }
}

/// What one attempt ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum AttemptOutcome {
    /// Failed; retried later.
    Retry,
    /// Failed; no attempts left, or unreadable: parked `dead`.
    Dead,
    /// The broker connection died with it in flight (counted as a suspect).
    Suspect,
}

impl AttemptOutcome {
    /// The name stored in the database.
    pub const fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Retry => "retry",
            AttemptOutcome::Dead => "dead",
            AttemptOutcome::Suspect => "suspect",
        }
    }

    /// The outcome named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [
            AttemptOutcome::Retry,
            AttemptOutcome::Dead,
            AttemptOutcome::Suspect,
        ]
        .into_iter()
        .find(|o| o.as_str() == name)
    }
}

/// A failed attempt to publish an event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Attempt {
    /// When it was recorded.
    pub at: DateTime<Utc>,
    /// The relay that made it, when known.
    pub relay: Option<String>,
    /// What it ended with.
    pub outcome: AttemptOutcome,
    /// Why.
    pub error: String,
}

impl Attempt {
    /// An attempt.
    pub fn new(
        at: DateTime<Utc>,
        relay: Option<String>,
        outcome: AttemptOutcome,
        error: impl Into<String>,
    ) -> Self {
        Attempt {
            at,
            relay,
            outcome,
            error: error.into(),
        }
    }
}

/// Dead and retrying events that failed the same way (`outbox dead groups`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct FailureGroup {
    /// Stable id: [`group_id`](super::group_id) of the event type and error.
    pub id: String,
    /// The event type.
    pub event_type: String,
    /// The error with numbers and ids stripped ([`normalize_error`](super::normalize_error)).
    pub error: String,
    /// `dead` events in the group.
    pub dead: u64,
    /// `retry` events in the group.
    pub retry: u64,
    /// When the earliest of them occurred.
    pub first_seen: DateTime<Utc>,
    /// When the latest of them occurred.
    pub last_seen: DateTime<Utc>,
}

impl FailureGroup {
    /// Events in the group.
    pub fn count(&self) -> u64 {
        self.dead + self.retry
    }
}

/// Merges rows of (event type, raw error, status, count, first, last) into
/// failure groups, most events first: the one place the grouping rule lives,
/// whatever store read the rows.
pub fn group_failures<I>(rows: I) -> Vec<FailureGroup>
where
    I: IntoIterator<
        Item = (
            String,
            String,
            EventStatus,
            u64,
            DateTime<Utc>,
            DateTime<Utc>,
        ),
    >,
{
    let mut groups: std::collections::HashMap<String, FailureGroup> =
        std::collections::HashMap::new();
    for (event_type, error, status, n, first, last) in rows {
        let error = super::normalize_error(&error);
        let id = super::group_id(&event_type, &error);
        let group = groups.entry(id.clone()).or_insert_with(|| FailureGroup {
            id,
            event_type,
            error,
            dead: 0,
            retry: 0,
            first_seen: first,
            last_seen: last,
        });
        match status {
            EventStatus::Dead => group.dead += n,
            _ => group.retry += n,
        }
        group.first_seen = group.first_seen.min(first);
        group.last_seen = group.last_seen.max(last);
    }
    let mut groups: Vec<FailureGroup> = groups.into_values().collect();
    groups.sort_by(|a, b| {
        b.count()
            .cmp(&a.count())
            .then_with(|| a.event_type.cmp(&b.event_type))
            .then_with(|| a.error.cmp(&b.error))
    });
    groups
}
