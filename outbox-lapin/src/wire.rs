//! The wire format: how an [`EventEnvelope`] becomes an AMQP message, and
//! how a consumer reads one back as an [`IncomingEvent`].
//!
//! | AMQP field | value |
//! |---|---|
//! | body | the JSON payload, byte-exact |
//! | `content_type` | `application/json` |
//! | `message_id` | the event id |
//! | `type` | the event type |
//! | `timestamp` | occurred-at, Unix seconds |
//! | `delivery_mode` | 2 (persistent) |
//! | `correlation_id` | the correlation id, when set |
//! | header `aggregate_type`, `aggregate_id` | long strings |
//! | header `aggregate_version` | signed 64-bit, only when set |
//! | header `schema_version` | signed 64-bit |
//! | headers `traceparent`, `tracestate` | long strings, when set and well formed (W3C Trace Context); with the `opentelemetry` feature and an OpenTelemetry layer, the context of the message's `publish` span (a child of the recorded one) |
//! | header `baggage` | long string, when set and well formed (W3C Baggage): the baggage recorded with the event (opt-in, see `outbox_core::trace_context::carry_baggage`) |
//! | headers `correlation_id`, `causation_id` | long strings, when set |
//! | headers `cloudEvents:id`, `cloudEvents:type`, `cloudEvents:source`, `cloudEvents:subject`, `cloudEvents:time`, `cloudEvents:specversion` | the CloudEvents AMQP binding: event id, event type, the configured source URI, aggregate id, occurred-at in RFC 3339, `1.0` |
//!
//! Other headers of the envelope travel as long strings under their own names.
//! A malformed `traceparent`, `tracestate` or `baggage` (one that
//! [`outbox_core::trace_context::is_well_formed`] refuses: stored by another
//! writer, or before they were checked) is never forwarded: the publisher
//! leaves it out, with a warning naming the event.

use chrono::{DateTime, SecondsFormat, Utc};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use outbox_core::{EventEnvelope, Headers, trace_context};
use uuid::Uuid;

/// Header: aggregate type.
pub const AGGREGATE_TYPE: &str = "aggregate_type";
/// Header: aggregate id.
pub const AGGREGATE_ID: &str = "aggregate_id";
/// Header: aggregate version (signed 64-bit).
pub const AGGREGATE_VERSION: &str = "aggregate_version";
/// Header: payload schema version (signed 64-bit).
pub const SCHEMA_VERSION: &str = "schema_version";
/// CloudEvents AMQP binding: event id.
pub const CE_ID: &str = "cloudEvents:id";
/// CloudEvents AMQP binding: event type.
pub const CE_TYPE: &str = "cloudEvents:type";
/// CloudEvents AMQP binding: the producing service's URI.
pub const CE_SOURCE: &str = "cloudEvents:source";
/// CloudEvents AMQP binding: aggregate id.
pub const CE_SUBJECT: &str = "cloudEvents:subject";
/// CloudEvents AMQP binding: occurred-at, RFC 3339.
pub const CE_TIME: &str = "cloudEvents:time";
/// CloudEvents AMQP binding: spec version, `1.0`.
pub const CE_SPECVERSION: &str = "cloudEvents:specversion";
/// Content type of every message.
pub const CONTENT_TYPE: &str = "application/json";

fn long(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value))
}

/// The AMQP properties (and headers) of `envelope`, with `source` as
/// `cloudEvents:source`. A malformed `traceparent`, `tracestate` or
/// `baggage` is left out.
pub fn properties(envelope: &EventEnvelope, source: &str) -> BasicProperties {
    properties_with(envelope, source, None)
}

/// The envelope headers a message carries: those
/// [`is_well_formed`](trace_context::is_well_formed) accepts, with `trace`
/// (the `traceparent`, `tracestate` and, when carried, `baggage` of the
/// message's `publish` span) in place of the recorded trace context.
pub(crate) fn forwarded<'a>(
    envelope: &'a EventEnvelope,
    trace: Option<&'a Headers>,
) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
    let replaced = move |key: &str| {
        trace.is_some_and(|trace| {
            key == Headers::TRACEPARENT
                || key == Headers::TRACESTATE
                || (key == Headers::BAGGAGE && trace.get(Headers::BAGGAGE).is_some())
        })
    };
    envelope
        .headers
        .iter()
        .filter(move |(key, _)| !replaced(key))
        .chain(trace.into_iter().flat_map(Headers::iter))
        .filter(|(key, value)| trace_context::is_well_formed(key, value))
}

/// The size of the [`forwarded`] headers as an AMQP field table: what
/// [`EventEnvelope::MAX_HEADERS_BYTES`] limits.
pub(crate) fn forwarded_bytes(envelope: &EventEnvelope, trace: Option<&Headers>) -> usize {
    forwarded(envelope, trace)
        .map(|(key, value)| key.len() + value.len() + EventEnvelope::HEADER_ENTRY_OVERHEAD)
        .sum()
}

/// Warns (once for the message) about the trace headers of `envelope` that
/// are malformed and so not forwarded.
pub(crate) fn warn_malformed(envelope: &EventEnvelope) {
    let mut malformed = envelope
        .headers
        .iter()
        .filter(|(key, value)| !trace_context::is_well_formed(key, value))
        .map(|(key, _)| key)
        .peekable();
    if malformed.peek().is_some() {
        let headers: Vec<&str> = malformed.collect();
        tracing::warn!(
            event_id = %envelope.id,
            trace_id = trace_context::trace_id(&envelope.headers).as_deref(),
            ?headers,
            "outbox: malformed trace context headers (not W3C) are not forwarded"
        );
    }
}

/// [`properties`], with `trace` in place of the recorded trace context
/// (see [`forwarded`]).
pub(crate) fn properties_with(
    envelope: &EventEnvelope,
    source: &str,
    trace: Option<&Headers>,
) -> BasicProperties {
    let id = envelope.id.to_string();
    let mut headers = FieldTable::default();
    // Envelope headers first, so the fixed ones below cannot be overridden.
    for (key, value) in forwarded(envelope, trace) {
        headers.insert(ShortString::from(key), long(value));
    }
    headers.insert(AGGREGATE_TYPE.into(), long(&envelope.aggregate_type));
    headers.insert(AGGREGATE_ID.into(), long(&envelope.aggregate_id));
    if let Some(version) = envelope.aggregate_version {
        headers.insert(AGGREGATE_VERSION.into(), AMQPValue::LongLongInt(version));
    }
    headers.insert(
        SCHEMA_VERSION.into(),
        AMQPValue::LongLongInt(i64::from(envelope.schema_version)),
    );
    headers.insert(CE_ID.into(), long(&id));
    headers.insert(CE_TYPE.into(), long(&envelope.event_type));
    headers.insert(CE_SOURCE.into(), long(source));
    headers.insert(CE_SUBJECT.into(), long(&envelope.aggregate_id));
    headers.insert(
        CE_TIME.into(),
        long(
            &envelope
                .occurred_at
                .to_rfc3339_opts(SecondsFormat::AutoSi, true),
        ),
    );
    headers.insert(CE_SPECVERSION.into(), long("1.0"));

    let mut properties = BasicProperties::default()
        .with_content_type(CONTENT_TYPE.into())
        .with_message_id(id.into())
        .with_type(envelope.event_type.as_str().into())
        .with_timestamp(u64::try_from(envelope.occurred_at.timestamp()).unwrap_or(0))
        .with_delivery_mode(2)
        .with_headers(headers);
    if let Some(correlation) = envelope.headers.get(Headers::CORRELATION_ID) {
        properties = properties.with_correlation_id(correlation.into());
    }
    properties
}

/// Reads a header as a string (long or short string).
pub fn header_str<'a>(headers: &'a FieldTable, key: &str) -> Option<&'a str> {
    match headers.inner().get(key)? {
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
        AMQPValue::ShortString(s) => Some(s.as_str()),
        _ => None,
    }
}

/// Reads a header as a signed integer (any AMQP integer type).
pub fn header_i64(headers: &FieldTable, key: &str) -> Option<i64> {
    match headers.inner().get(key)? {
        AMQPValue::LongLongInt(v) => Some(*v),
        AMQPValue::LongInt(v) => Some(i64::from(*v)),
        AMQPValue::LongUInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortUInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortShortInt(v) => Some(i64::from(*v)),
        AMQPValue::ShortShortUInt(v) => Some(i64::from(*v)),
        AMQPValue::Timestamp(v) => i64::try_from(*v).ok(),
        _ => None,
    }
}

/// An event as a consumer receives it, decoded from the wire format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncomingEvent {
    /// The event id (`message_id`): what the inbox deduplicates on.
    pub id: Uuid,
    /// Event type (`type`).
    pub event_type: String,
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Aggregate version, when the producer set one.
    pub aggregate_version: Option<i64>,
    /// Payload schema version.
    pub schema_version: i32,
    /// The JSON payload, as sent.
    pub payload: String,
    /// `traceparent`, `tracestate`, `baggage`, `correlation_id` and
    /// `causation_id`, when the message carries them (the inbox consumer
    /// drops a malformed trace context, and the baggage unless this process
    /// [carries](outbox_core::trace_context::carry_baggage) it). Other
    /// headers are in the delivery's AMQP properties.
    pub headers: Headers,
    /// When the event occurred (`cloudEvents:time`, else `timestamp`).
    pub occurred_at: DateTime<Utc>,
    /// The routing key it arrived with.
    pub routing_key: String,
}

impl IncomingEvent {
    /// Deserializes the payload.
    ///
    /// # Errors
    /// The JSON error when the payload does not match `T`.
    pub fn payload_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.payload)
    }
}

/// Why a delivery is not a valid event; such messages go to the dead-letter
/// exchange at once, with this as the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// `message_id` missing or not a UUID.
    #[error("message_id is missing or not a UUID")]
    MessageId,
    /// `type` missing.
    #[error("type (the event type) is missing")]
    EventType,
    /// A required header is missing or has the wrong AMQP type.
    #[error("header `{0}` is missing or has the wrong type")]
    Header(&'static str),
    /// The body is not UTF-8 JSON.
    #[error("body is not JSON: {0}")]
    Body(String),
}

/// Decodes a delivery's properties and body.
///
/// # Errors
/// [`DecodeError`] naming what is missing or malformed.
pub fn decode(
    properties: &BasicProperties,
    routing_key: &str,
    body: &[u8],
) -> Result<IncomingEvent, DecodeError> {
    let id = properties
        .message_id()
        .as_ref()
        .and_then(|id| Uuid::parse_str(id.as_str()).ok())
        .ok_or(DecodeError::MessageId)?;
    let event_type = properties
        .kind()
        .as_ref()
        .map(|t| t.as_str().to_owned())
        .filter(|t| !t.is_empty())
        .ok_or(DecodeError::EventType)?;
    let empty = FieldTable::default();
    let table = properties.headers().as_ref().unwrap_or(&empty);
    let aggregate_type = header_str(table, AGGREGATE_TYPE)
        .ok_or(DecodeError::Header(AGGREGATE_TYPE))?
        .to_owned();
    let aggregate_id = header_str(table, AGGREGATE_ID)
        .ok_or(DecodeError::Header(AGGREGATE_ID))?
        .to_owned();
    let schema_version = header_i64(table, SCHEMA_VERSION)
        .and_then(|v| i32::try_from(v).ok())
        .ok_or(DecodeError::Header(SCHEMA_VERSION))?;
    let aggregate_version = match table.inner().get(AGGREGATE_VERSION) {
        None => None,
        Some(_) => Some(
            header_i64(table, AGGREGATE_VERSION).ok_or(DecodeError::Header(AGGREGATE_VERSION))?,
        ),
    };
    let payload = std::str::from_utf8(body)
        .map_err(|e| DecodeError::Body(e.to_string()))?
        .to_owned();
    serde_json::from_str::<serde::de::IgnoredAny>(&payload)
        .map_err(|e| DecodeError::Body(e.to_string()))?;
    let occurred_at = header_str(table, CE_TIME)
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
        .or_else(|| {
            properties
                .timestamp()
                .and_then(|t| DateTime::from_timestamp(i64::try_from(t).ok()?, 0))
        })
        .unwrap_or_else(Utc::now);
    let mut headers = Headers::new();
    for key in [
        Headers::TRACEPARENT,
        Headers::TRACESTATE,
        Headers::BAGGAGE,
        Headers::CORRELATION_ID,
        Headers::CAUSATION_ID,
    ] {
        if let Some(value) = header_str(table, key) {
            headers.insert(key, value);
        }
    }
    Ok(IncomingEvent {
        id,
        event_type,
        aggregate_type,
        aggregate_id,
        aggregate_version,
        schema_version,
        payload,
        headers,
        occurred_at,
        routing_key: routing_key.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn envelope() -> EventEnvelope {
        EventEnvelope {
            id: Uuid::now_v7(),
            aggregate_type: "order".into(),
            aggregate_id: "o-1".into(),
            aggregate_version: Some(3),
            event_type: "order.placed".into(),
            schema_version: 2,
            payload: r#"{"b":1,"a":"ü"}"#.into(),
            headers: Headers::new()
                .with(Headers::CORRELATION_ID, "c-1")
                .with(Headers::CAUSATION_ID, "e-0")
                .with(Headers::TRACEPARENT, TRACEPARENT),
            occurred_at: DateTime::parse_from_rfc3339("2026-11-29T08:00:00.123456Z")
                .unwrap()
                .with_timezone(&Utc),
        }
    }

    #[test]
    fn encodes_the_documented_properties_and_headers() {
        let env = envelope();
        let p = properties(&env, "/shop");
        assert_eq!(p.content_type().as_ref().unwrap().as_str(), CONTENT_TYPE);
        assert_eq!(
            p.message_id().as_ref().unwrap().as_str(),
            env.id.to_string()
        );
        assert_eq!(p.kind().as_ref().unwrap().as_str(), "order.placed");
        assert_eq!(*p.timestamp(), Some(1_795_939_200));
        assert_eq!(*p.delivery_mode(), Some(2));
        assert_eq!(p.correlation_id().as_ref().unwrap().as_str(), "c-1");
        let h = p.headers().as_ref().unwrap();
        assert_eq!(header_str(h, AGGREGATE_TYPE), Some("order"));
        assert_eq!(header_str(h, AGGREGATE_ID), Some("o-1"));
        assert_eq!(
            h.inner().get(AGGREGATE_VERSION),
            Some(&AMQPValue::LongLongInt(3))
        );
        assert_eq!(
            h.inner().get(SCHEMA_VERSION),
            Some(&AMQPValue::LongLongInt(2))
        );
        assert_eq!(header_str(h, CE_ID), Some(env.id.to_string().as_str()));
        assert_eq!(header_str(h, CE_TYPE), Some("order.placed"));
        assert_eq!(header_str(h, CE_SOURCE), Some("/shop"));
        assert_eq!(header_str(h, CE_SUBJECT), Some("o-1"));
        assert_eq!(header_str(h, CE_TIME), Some("2026-11-29T08:00:00.123456Z"));
        assert_eq!(header_str(h, CE_SPECVERSION), Some("1.0"));
        assert_eq!(header_str(h, "traceparent"), Some(TRACEPARENT));
        assert_eq!(header_str(h, "causation_id"), Some("e-0"));
    }

    #[test]
    fn malformed_trace_context_is_not_forwarded_nor_counted() {
        let mut env = envelope();
        let well_formed = env.encoded_headers_bytes();
        env.headers.insert(Headers::TRACEPARENT, "00-abc-def-01");
        env.headers.insert(Headers::TRACESTATE, "Not=A,State");
        env.headers.insert(Headers::BAGGAGE, "no equals sign");
        env.headers.insert("other", "00-abc-def-01");
        let p = properties(&env, "/shop");
        let h = p.headers().as_ref().unwrap();
        for key in [Headers::TRACEPARENT, Headers::TRACESTATE, Headers::BAGGAGE] {
            assert!(h.inner().get(key).is_none(), "{key} forwarded");
        }
        assert_eq!(header_str(h, "other"), Some("00-abc-def-01"));
        assert_eq!(header_str(h, Headers::CORRELATION_ID), Some("c-1"));
        // The size checks count what is sent.
        assert_eq!(
            env.encoded_headers_bytes(),
            well_formed - (Headers::TRACEPARENT.len() + TRACEPARENT.len() + 6)
                + ("other".len() + "00-abc-def-01".len() + 6)
        );
        assert_eq!(forwarded_bytes(&env, None), env.encoded_headers_bytes());
    }

    #[test]
    fn a_publish_span_context_replaces_the_recorded_one() {
        let mut env = envelope();
        env.headers.insert(Headers::TRACESTATE, "rojo=1");
        env.headers.insert(Headers::BAGGAGE, "user=1");
        let sent = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01";
        let trace = Headers::new().with(Headers::TRACEPARENT, sent);
        let p = properties_with(&env, "/shop", Some(&trace));
        let h = p.headers().as_ref().unwrap();
        assert_eq!(header_str(h, Headers::TRACEPARENT), Some(sent));
        assert_eq!(
            header_str(h, Headers::TRACESTATE),
            None,
            "the span has none"
        );
        assert_eq!(
            header_str(h, Headers::BAGGAGE),
            Some("user=1"),
            "as recorded"
        );
        assert_eq!(
            forwarded_bytes(&env, Some(&trace)),
            env.encoded_headers_bytes() - ("tracestate".len() + "rojo=1".len() + 6)
        );
    }

    #[test]
    fn aggregate_version_is_absent_when_unset() {
        let mut env = envelope();
        env.aggregate_version = None;
        let p = properties(&env, "/shop");
        assert!(
            p.headers()
                .as_ref()
                .unwrap()
                .inner()
                .get(AGGREGATE_VERSION)
                .is_none()
        );
        assert_eq!(
            decode(&p, "k", env.payload.as_bytes())
                .unwrap()
                .aggregate_version,
            None
        );
    }

    #[test]
    fn decode_round_trips() {
        let env = envelope();
        let p = properties(&env, "/shop");
        let incoming = decode(&p, "order.placed", env.payload.as_bytes()).unwrap();
        assert_eq!(incoming.id, env.id);
        assert_eq!(incoming.event_type, env.event_type);
        assert_eq!(incoming.aggregate_type, env.aggregate_type);
        assert_eq!(incoming.aggregate_id, env.aggregate_id);
        assert_eq!(incoming.aggregate_version, Some(3));
        assert_eq!(incoming.schema_version, 2);
        assert_eq!(incoming.payload, env.payload);
        assert_eq!(incoming.headers, env.headers);
        assert_eq!(incoming.occurred_at, env.occurred_at);
        assert_eq!(incoming.routing_key, "order.placed");
    }

    #[test]
    fn malformed_messages_say_what_is_wrong() {
        let env = envelope();
        let good = properties(&env, "/shop");
        assert_eq!(
            decode(&BasicProperties::default(), "k", b"{}"),
            Err(DecodeError::MessageId)
        );
        let no_type = BasicProperties::default().with_message_id(env.id.to_string().into());
        assert_eq!(decode(&no_type, "k", b"{}"), Err(DecodeError::EventType));
        let no_headers = no_type.clone().with_type("x.y".into());
        assert_eq!(
            decode(&no_headers, "k", b"{}"),
            Err(DecodeError::Header(AGGREGATE_TYPE))
        );
        assert!(matches!(
            decode(&good, "k", b"not json"),
            Err(DecodeError::Body(_))
        ));
        assert!(matches!(
            decode(&good, "k", &[0xff, 0xfe]),
            Err(DecodeError::Body(_))
        ));
    }
}
