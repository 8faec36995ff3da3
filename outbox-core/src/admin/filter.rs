//! Which events an admin call reads or changes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::EventStatus;

/// Which events a [`list`](super::OutboxAdmin::list), a failure-group
/// report or a mutation selects. Every criterion set must hold; an empty
/// filter selects every event.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct EventFilter {
    /// Only these events.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<Uuid>,
    /// Only events in one of these statuses (any when empty).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub statuses: Vec<EventStatus>,
    /// Aggregate type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aggregate_type: Option<String>,
    /// Aggregate id (with [`aggregate_type`](Self::aggregate_type)).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aggregate_id: Option<String>,
    /// Event type.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// The last error contains this text (case-insensitive).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_contains: Option<String>,
    /// The failure group (see [`FailureGroup::id`](super::FailureGroup::id)).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Occurred at or after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub occurred_after: Option<DateTime<Utc>>,
    /// Occurred before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub occurred_before: Option<DateTime<Utc>>,
    /// Recorded no later than the event of this `seq` (`seq` at most this).
    /// [`Admin`](super::Admin)'s chunked runs set it to the highest `seq`
    /// when they start, so that they never change an event recorded after
    /// that.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seq_at_most: Option<i64>,
}

impl EventFilter {
    /// Every event.
    pub fn new() -> Self {
        Self::default()
    }

    /// One event.
    pub fn id(id: Uuid) -> Self {
        Self::new().with_ids([id])
    }

    /// Only these events.
    #[must_use]
    pub fn with_ids(mut self, ids: impl IntoIterator<Item = Uuid>) -> Self {
        self.ids = ids.into_iter().collect();
        self
    }

    /// Only events in `status` (added to the statuses already selected).
    #[must_use]
    pub fn with_status(mut self, status: EventStatus) -> Self {
        if !self.statuses.contains(&status) {
            self.statuses.push(status);
        }
        self
    }

    /// Only events of one aggregate.
    #[must_use]
    pub fn with_aggregate(
        mut self,
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
    ) -> Self {
        self.aggregate_type = Some(aggregate_type.into());
        self.aggregate_id = Some(aggregate_id.into());
        self
    }

    /// Only events of one aggregate type.
    #[must_use]
    pub fn with_aggregate_type(mut self, aggregate_type: impl Into<String>) -> Self {
        self.aggregate_type = Some(aggregate_type.into());
        self
    }

    /// Only events of one event type.
    #[must_use]
    pub fn with_event_type(mut self, event_type: impl Into<String>) -> Self {
        self.event_type = Some(event_type.into());
        self
    }

    /// Only events whose last error contains `text` (case-insensitive).
    #[must_use]
    pub fn with_error_containing(mut self, text: impl Into<String>) -> Self {
        self.error_contains = Some(text.into());
        self
    }

    /// Only events of one failure group.
    #[must_use]
    pub fn with_group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }

    /// Only events that occurred in `[after, before)` (either end open when
    /// `None`).
    #[must_use]
    pub fn with_occurred(
        mut self,
        after: Option<DateTime<Utc>>,
        before: Option<DateTime<Utc>>,
    ) -> Self {
        self.occurred_after = after;
        self.occurred_before = before;
        self
    }

    /// Only events with a `seq` of at most `seq` (recorded no later than
    /// that event); a bound already set stays if it is lower.
    #[must_use]
    pub fn with_seq_at_most(mut self, seq: i64) -> Self {
        self.seq_at_most = Some(self.seq_at_most.map_or(seq, |s| s.min(seq)));
        self
    }

    /// `true` when no criterion is set (the filter selects every event).
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }

    /// The same filter restricted to `statuses`: those of the filter that are
    /// among them, or all of them when the filter names none. `None` when the
    /// filter names statuses but none of these (the result would be empty).
    pub fn restricted_to(&self, statuses: &[EventStatus]) -> Option<Self> {
        let mut filter = self.clone();
        if filter.statuses.is_empty() {
            filter.statuses = statuses.to_vec();
        } else {
            filter.statuses.retain(|s| statuses.contains(s));
            if filter.statuses.is_empty() {
                return None;
            }
        }
        Some(filter)
    }

    /// Whether a record matches every criterion but [`group`](Self::group)
    /// (which needs the normalized error: see [`matches_group`](Self::matches_group)).
    /// The reference semantics the stores implement.
    pub fn matches(&self, record: &crate::OutboxRecord) -> bool {
        let e = &record.envelope;
        (self.ids.is_empty() || self.ids.contains(&e.id))
            && (self.statuses.is_empty() || self.statuses.contains(&record.status))
            && self
                .aggregate_type
                .as_ref()
                .is_none_or(|t| *t == e.aggregate_type)
            && self
                .aggregate_id
                .as_ref()
                .is_none_or(|i| *i == e.aggregate_id)
            && self.event_type.as_ref().is_none_or(|t| *t == e.event_type)
            && self.error_contains.as_ref().is_none_or(|text| {
                record
                    .last_error
                    .as_ref()
                    .is_some_and(|err| err.to_lowercase().contains(&text.to_lowercase()))
            })
            && self.occurred_after.is_none_or(|t| e.occurred_at >= t)
            && self.occurred_before.is_none_or(|t| e.occurred_at < t)
            && self.seq_at_most.is_none_or(|seq| record.seq <= seq)
            && self.matches_group(record)
    }

    /// Whether a record is in the filter's failure group (always when none
    /// is set).
    pub fn matches_group(&self, record: &crate::OutboxRecord) -> bool {
        self.group.as_ref().is_none_or(|group| {
            record.last_error.as_ref().is_some_and(|err| {
                super::group_id(&record.envelope.event_type, &super::normalize_error(err)) == *group
            })
        })
    }
}

/// One page of a listing, in `seq` order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// The cursor for the next page (`after`), `None` on the last page.
    /// Pages follow `seq`, which only grows: events recorded meanwhile land
    /// on later pages, none is shown twice or skipped.
    pub next: Option<i64>,
}

impl<T> Page<T> {
    /// A page.
    pub fn new(items: Vec<T>, next: Option<i64>) -> Self {
        Page { items, next }
    }
}
