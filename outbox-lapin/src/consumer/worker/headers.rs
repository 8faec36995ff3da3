//! The headers a worker reads and writes: the routing key and exchange a
//! message first arrived with (kept on every republished copy), and the
//! headers events recorded by the handler inherit.

use lapin::message::Delivery;
use lapin::types::AMQPValue;
use outbox_core::{EventEnvelope, Headers, trace_context};

use crate::IncomingEvent;
use crate::consumer::republish::text;
use crate::headers::{ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER};
use crate::wire::header_str;

/// The routing key the message first arrived with, from its
/// [`ORIGINAL_ROUTING_KEY_HEADER`], if that holds one: text of at most 255
/// bytes (an AMQP short string). A longer one (the consumer only writes
/// routing keys it received, so another publisher wrote it) could never be
/// used to dead-letter the message: the message would go back to the queue
/// forever.
pub(super) fn original_routing_key(headers: &lapin::types::FieldTable) -> Option<&str> {
    header_str(headers, ORIGINAL_ROUTING_KEY_HEADER)
        .filter(|key| key.len() <= EventEnvelope::MAX_SHORT_BYTES)
}

/// The origin headers to put on a republished copy of `delivery`: none if it
/// carries a usable [`ORIGINAL_ROUTING_KEY_HEADER`] already (a retry), else
/// `routing_key` and the delivery's exchange, replacing an unusable header.
pub(super) fn origin_headers(
    delivery: &Delivery,
    routing_key: &str,
) -> Vec<(&'static str, AMQPValue)> {
    let usable = delivery
        .properties
        .headers()
        .as_ref()
        .and_then(original_routing_key)
        .is_some();
    if usable {
        return Vec::new();
    }
    vec![
        (ORIGINAL_ROUTING_KEY_HEADER, text(routing_key)),
        (ORIGINAL_EXCHANGE_HEADER, text(delivery.exchange.as_str())),
    ]
}

/// Headers the handler's recorded events inherit: causation = this event,
/// plus its correlation id, trace context and (when this process carries
/// baggage) baggage. At record, the `process` span's OpenTelemetry context,
/// when there is one, replaces this trace context; without one the events
/// continue the producer's (`event`'s headers are sanitized: a malformed
/// trace context was dropped).
pub(super) fn inherited_headers(event: &IncomingEvent) -> Headers {
    let mut headers = Headers::new().with(Headers::CAUSATION_ID, event.id.to_string());
    let baggage = (trace_context::baggage_limit() > 0).then_some(Headers::BAGGAGE);
    for key in [
        Some(Headers::CORRELATION_ID),
        Some(Headers::TRACEPARENT),
        Some(Headers::TRACESTATE),
        baggage,
    ]
    .into_iter()
    .flatten()
    {
        if let Some(value) = event.headers.get(key) {
            if key == Headers::CORRELATION_ID && value.len() > EventEnvelope::MAX_SHORT_BYTES {
                // Events recorded with it would be refused: carry none.
                tracing::warn!(
                    bytes = value.len(),
                    "incoming correlation id longer than {} bytes: not carried over",
                    EventEnvelope::MAX_SHORT_BYTES
                );
                continue;
            }
            if value.contains('\0') {
                // Refused by every store (`EventEnvelope::validate`): the
                // handler's `record` would fail on a header it never set.
                tracing::warn!(
                    header = key,
                    "incoming header with a NUL character: not carried over"
                );
                continue;
            }
            headers.insert(key, value);
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_no_event_could_be_recorded_with_are_not_inherited() {
        let mut event = IncomingEvent {
            id: uuid::Uuid::now_v7(),
            event_type: "order.placed".into(),
            aggregate_type: "order".into(),
            aggregate_id: "o-1".into(),
            aggregate_version: None,
            schema_version: 1,
            payload: "{}".into(),
            headers: Headers::new().with(Headers::CORRELATION_ID, "req\0-1"),
            occurred_at: chrono::Utc::now(),
            routing_key: "order.placed".into(),
        };
        let inherited = inherited_headers(&event);
        assert_eq!(inherited.get(Headers::CORRELATION_ID), None);
        let mut recorded = EventEnvelope {
            id: event.id,
            aggregate_type: "order".into(),
            aggregate_id: "o-2".into(),
            aggregate_version: None,
            event_type: "order.shipped".into(),
            schema_version: 1,
            payload: "{}".into(),
            headers: inherited,
            occurred_at: chrono::Utc::now(),
        };
        assert!(
            recorded.validate().is_ok(),
            "what the handler records is valid"
        );
        event.headers.insert(Headers::CORRELATION_ID, "req-1");
        recorded.headers = inherited_headers(&event);
        assert_eq!(recorded.headers.get(Headers::CORRELATION_ID), Some("req-1"));
    }
}
