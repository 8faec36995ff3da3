//! What is stored and published for one event: [`EventEnvelope`] (the message)
//! and [`OutboxRecord`] (the message plus its delivery state).
//!
//! This file holds the two types; the parts:
//! - `headers.rs`: [`Headers`], the string headers carried with an event;
//! - `validate.rs`: the limits and invariants every store and publisher
//!   relies on ([`EventEnvelope::validate`]).

mod headers;
mod validate;

use std::fmt;

use chrono::{DateTime, Utc};
use uuid::Uuid;

pub use headers::Headers;

use crate::{DomainEvent, Error, EventStatus};

/// One event as it is stored in the outbox and put on the wire.
///
/// Built from a [`DomainEvent`] with [`EventEnvelope::from_event`], which
/// assigns a time-ordered UUID v7 id and serializes the payload.
///
/// ```
/// use outbox_core::{DomainEvent, EventEnvelope, Headers};
/// # #[derive(serde::Serialize)] struct OrderPaid { order_id: u32 }
/// # impl DomainEvent for OrderPaid {
/// #     fn aggregate_type(&self) -> &'static str { "order" }
/// #     fn event_type(&self) -> &'static str { "order.paid" }
/// #     fn aggregate_id(&self) -> String { self.order_id.to_string() }
/// # }
///
/// let envelope = EventEnvelope::from_event(&OrderPaid { order_id: 9 })?
///     .with_correlation_id("req-1");
/// assert_eq!(envelope.event_type, "order.paid");
/// assert_eq!(envelope.aggregate_id, "9");
/// assert_eq!(envelope.payload, r#"{"order_id":9}"#);
/// assert_eq!(envelope.headers.get(Headers::CORRELATION_ID), Some("req-1"));
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct EventEnvelope {
    /// Unique, time-ordered (UUID v7) event id; the message id consumers dedup on.
    pub id: Uuid,
    /// Aggregate type, e.g. `"order"`.
    pub aggregate_type: String,
    /// Aggregate id, e.g. the order's UUID as text.
    pub aggregate_id: String,
    /// The aggregate's version after this event, when the application tracks one.
    pub aggregate_version: Option<i64>,
    /// Event type, e.g. `"order.placed"`.
    pub event_type: String,
    /// Version of the event type's payload schema.
    pub schema_version: i32,
    /// The payload as JSON text, kept byte-exact from serialization to the wire.
    pub payload: String,
    /// Trace context and correlation/causation ids.
    pub headers: Headers,
    /// When the event was recorded.
    pub occurred_at: DateTime<Utc>,
}

impl fmt::Debug for EventEnvelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The payload may be large or sensitive: show its size, not its text.
        f.debug_struct("EventEnvelope")
            .field("id", &self.id)
            .field("aggregate_type", &self.aggregate_type)
            .field("aggregate_id", &self.aggregate_id)
            .field("aggregate_version", &self.aggregate_version)
            .field("event_type", &self.event_type)
            .field("schema_version", &self.schema_version)
            .field("payload_bytes", &self.payload.len())
            .field("headers", &self.headers)
            .field("occurred_at", &self.occurred_at)
            .finish()
    }
}

impl EventEnvelope {
    /// Builds the envelope of `event`: a new UUID v7 id, the current time, the
    /// payload serialized to JSON, and the headers of the current
    /// [`context`](crate::context) scope, if any.
    ///
    /// # Errors
    /// [`Error::Serialize`] if the payload cannot be serialized (e.g. a map
    /// with non-string keys), [`Error::InvalidEvent`] if the envelope breaks
    /// an invariant of [`EventEnvelope::validate`].
    pub fn from_event<E: DomainEvent + ?Sized>(event: &E) -> Result<Self, Error> {
        let event_type = event.event_type();
        let payload = serde_json::to_string(event)
            .map_err(|source| Error::Serialize { event_type, source })?;
        let mut envelope = EventEnvelope {
            id: Uuid::now_v7(),
            aggregate_type: event.aggregate_type().to_owned(),
            aggregate_id: event.aggregate_id(),
            aggregate_version: event.aggregate_version(),
            event_type: event_type.to_owned(),
            schema_version: event.schema_version(),
            payload,
            headers: Headers::new(),
            occurred_at: Utc::now(),
        };
        crate::context::apply(&mut envelope.headers);
        if let Err(error) = envelope.validate() {
            // Carried baggage never fails a record: without it the event
            // may fit.
            if envelope.headers.remove(Headers::BAGGAGE).is_none() || envelope.validate().is_err() {
                return Err(error);
            }
            tracing::warn!(
                event_type,
                "outbox: baggage dropped from an event whose headers would not fit with it"
            );
        }
        Ok(envelope)
    }

    /// Adds or replaces a header.
    #[must_use]
    pub fn with_header(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(key, value);
        self
    }

    /// Sets the correlation id header.
    #[must_use]
    pub fn with_correlation_id(self, id: impl Into<String>) -> Self {
        self.with_header(Headers::CORRELATION_ID, id)
    }

    /// Sets the causation id header (the id of the event that caused this one).
    #[must_use]
    pub fn with_causation_id(self, id: impl Into<String>) -> Self {
        self.with_header(Headers::CAUSATION_ID, id)
    }

    /// Sets the W3C `traceparent` header.
    #[must_use]
    pub fn with_traceparent(self, traceparent: impl Into<String>) -> Self {
        self.with_header(Headers::TRACEPARENT, traceparent)
    }

    /// The key that defines per-aggregate order: `(aggregate_type, aggregate_id)`.
    pub fn aggregate_key(&self) -> (&str, &str) {
        (&self.aggregate_type, &self.aggregate_id)
    }
}

/// An outbox row: the [`EventEnvelope`] plus its delivery state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRecord {
    /// Database-assigned sequence number; defines per-aggregate order.
    pub seq: i64,
    /// The event itself.
    pub envelope: EventEnvelope,
    /// Delivery status.
    pub status: EventStatus,
    /// Failed publish attempts so far (connection losses do not count).
    pub attempts: u32,
    /// When a `Retry` event may be claimed again.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// The reason of the last failed attempt.
    pub last_error: Option<String>,
    /// When the broker confirmed the event.
    pub published_at: Option<DateTime<Utc>>,
    /// Since when every publish of it came back unroutable, while the
    /// relay holds it under [`UnroutablePolicy::Hold`](crate::UnroutablePolicy).
    pub unroutable_since: Option<DateTime<Utc>>,
    /// How many times the broker connection died while this event was in
    /// flight ([`PublishOutcome::ConnectionDied`](crate::PublishOutcome::ConnectionDied)).
    /// From 1 on, every relay publishes it alone; see
    /// [`RelayBuilder::suspect_limit`](crate::RelayBuilder::suspect_limit).
    pub suspect_count: u32,
}

impl OutboxRecord {
    /// A new `Pending` record for `envelope` with sequence number `seq`.
    pub fn pending(seq: i64, envelope: EventEnvelope) -> Self {
        OutboxRecord {
            seq,
            envelope,
            status: EventStatus::Pending,
            attempts: 0,
            next_attempt_at: None,
            last_error: None,
            published_at: None,
            unroutable_since: None,
            suspect_count: 0,
        }
    }

    /// The event id.
    pub fn id(&self) -> Uuid {
        self.envelope.id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;
    use std::collections::HashMap;

    #[derive(Serialize)]
    struct Placed<T: Serialize> {
        id: String,
        body: T,
    }

    impl<T: Serialize> DomainEvent for Placed<T> {
        fn aggregate_type(&self) -> &'static str {
            "order"
        }
        fn event_type(&self) -> &'static str {
            "order.placed"
        }
        fn schema_version(&self) -> i32 {
            3
        }
        fn aggregate_id(&self) -> String {
            self.id.clone()
        }
        fn aggregate_version(&self) -> Option<i64> {
            Some(4)
        }
    }

    #[test]
    fn from_event_copies_metadata_and_serializes_the_payload() {
        let before = Utc::now();
        let env = EventEnvelope::from_event(&Placed {
            id: "o-1".into(),
            body: "ünïcode \"quoted\"",
        })
        .unwrap();
        assert_eq!(env.id.get_version_num(), 7);
        assert_eq!(env.aggregate_key(), ("order", "o-1"));
        assert_eq!(env.event_type, "order.placed");
        assert_eq!(env.schema_version, 3);
        assert_eq!(env.aggregate_version, Some(4));
        assert_eq!(env.payload, r#"{"id":"o-1","body":"ünïcode \"quoted\""}"#);
        assert!(env.headers.is_empty());
        assert!(env.occurred_at >= before && env.occurred_at <= Utc::now());
    }

    #[test]
    fn ids_are_unique_and_time_ordered() {
        let ids: Vec<Uuid> = (0..1000)
            .map(|i| {
                EventEnvelope::from_event(&Placed {
                    id: i.to_string(),
                    body: (),
                })
                .unwrap()
                .id
            })
            .collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted, ids, "v7 ids must be unique and increasing");
    }

    #[test]
    fn unserializable_payload_is_a_typed_error() {
        let mut body = HashMap::new();
        body.insert((1, 2), "tuple keys are not JSON object keys");
        let err = EventEnvelope::from_event(&Placed {
            id: "o-1".into(),
            body,
        })
        .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Serialize {
                    event_type: "order.placed",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("order.placed"), "{err}");
    }

    #[test]
    fn empty_or_nul_ids_are_rejected() {
        for id in ["", "a\0b"] {
            let err = EventEnvelope::from_event(&Placed {
                id: id.into(),
                body: (),
            })
            .unwrap_err();
            assert!(
                matches!(&err, Error::InvalidEvent { reason, .. } if reason.contains("aggregate_id")),
                "{err:?}"
            );
        }
        let env = EventEnvelope::from_event(&Placed {
            id: "x".into(),
            body: (),
        })
        .unwrap()
        .with_header("bad", "nul\0");
        assert!(env.validate().is_err());
    }

    #[test]
    fn lengths_beyond_the_wire_and_index_limits_are_rejected() {
        let ok = |id: String| {
            EventEnvelope::from_event(&Placed { id, body: () }).map(|e| e.aggregate_id.len())
        };
        let max = EventEnvelope::MAX_AGGREGATE_ID_BYTES;
        assert_eq!(
            ok("é".repeat(max / 2)).unwrap(),
            max,
            "bytes, not characters"
        );
        let err = ok(format!("{}x", "é".repeat(max / 2))).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidEvent { reason, .. }
                if reason == "aggregate_id is 2049 bytes long; at most 2048 are allowed"),
            "{err:?}"
        );
        let env = || {
            EventEnvelope::from_event(&Placed {
                id: "o".into(),
                body: (),
            })
            .unwrap()
        };
        let short = EventEnvelope::MAX_SHORT_BYTES;
        assert!(
            env()
                .with_correlation_id("c".repeat(short))
                .validate()
                .is_ok()
        );
        assert!(
            env()
                .with_correlation_id("c".repeat(short + 1))
                .validate()
                .is_err()
        );
        assert!(env().with_header("h".repeat(short), "v").validate().is_ok());
        assert!(
            env()
                .with_header("h".repeat(short + 1), "v")
                .validate()
                .is_err()
        );
        // Other header values are AMQP long strings, within the frame.
        assert!(
            env()
                .with_header("note", "n".repeat(10_000))
                .validate()
                .is_ok()
        );
        let big = env().with_header("note", "n".repeat(EventEnvelope::MAX_HEADERS_BYTES));
        assert!(big.validate().is_err());
        assert!(big.validate_wire().is_err(), "a publisher refuses it too");
        // Many small headers: their names and values fit, but AMQP's
        // per-entry framing doubles them past the limit.
        let many: Headers = (0..10_000).map(|i| (format!("h{i:04}"), "v")).collect();
        let raw: usize = many.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(raw <= EventEnvelope::MAX_HEADERS_BYTES, "{raw}");
        let mut crowded = env();
        crowded.headers = many;
        assert!(crowded.encoded_headers_bytes() > EventEnvelope::MAX_HEADERS_BYTES);
        assert!(crowded.validate().is_err(), "counted with its framing");
        assert!(crowded.validate_wire().is_err());
        // A malformed trace header is never sent, but it is stored: it
        // counts against the limit all the same.
        for key in [Headers::TRACEPARENT, Headers::TRACESTATE, Headers::BAGGAGE] {
            let huge = env().with_header(key, "x".repeat(EventEnvelope::MAX_HEADERS_BYTES));
            assert!(huge.validate().is_err(), "{key}");
            assert!(
                huge.validate_wire().is_ok(),
                "{key}: not sent, so not refused"
            );
        }
        // The aggregate id limit is the store's, not the wire's.
        let mut long_id = env();
        long_id.aggregate_id = "i".repeat(EventEnvelope::MAX_AGGREGATE_ID_BYTES + 1);
        assert!(long_id.validate().is_err());
        assert!(long_id.validate_wire().is_ok());
        let mut long_type = env();
        long_type.event_type = "t".repeat(short + 1);
        assert!(long_type.validate().is_err());
    }

    #[test]
    fn headers_builders_and_debug_hides_payload() {
        let env = EventEnvelope::from_event(&Placed {
            id: "x".into(),
            body: "secret-card-number",
        })
        .unwrap()
        .with_correlation_id("c")
        .with_causation_id("d")
        .with_traceparent("00-abc-def-01");
        assert_eq!(env.headers.get(Headers::CORRELATION_ID), Some("c"));
        assert_eq!(env.headers.get(Headers::CAUSATION_ID), Some("d"));
        assert_eq!(env.headers.get(Headers::TRACEPARENT), Some("00-abc-def-01"));
        let debug = format!("{env:?}");
        assert!(!debug.contains("secret-card-number"), "{debug}");
        let mut merged = Headers::new().with(Headers::CORRELATION_ID, "mine");
        merged.merge_missing(&env.headers);
        assert_eq!(merged.get(Headers::CORRELATION_ID), Some("mine"));
        assert_eq!(merged.get(Headers::CAUSATION_ID), Some("d"));
        assert_eq!(merged.len(), 3);
    }
}
