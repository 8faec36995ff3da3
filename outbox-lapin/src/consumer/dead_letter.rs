//! The [`DeadLetter`] a worker records (through
//! [`InboxDatabase::record_dead_letter`](outbox_core::InboxDatabase::record_dead_letter))
//! once the copy it republished to the dead-letter exchange is confirmed.

use std::collections::BTreeMap;

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable};
use outbox_core::admin::DeadLetter;

use super::Settings;
use crate::IncomingEvent;

/// The dead letter of `body`, republished with `properties` (headers
/// included) to the consumer's dead-letter exchange under `routing_key`.
pub(super) fn dead_letter(
    settings: &Settings,
    properties: &BasicProperties,
    body: &[u8],
    routing_key: &str,
    reason: &str,
    event: Option<&IncomingEvent>,
    attempts: i64,
) -> DeadLetter {
    let mut letter = DeadLetter::new(
        settings.name.as_str(),
        settings.queue.as_str(),
        settings.dead_letter_exchange.as_str(),
        routing_key,
        reason,
        body,
    );
    letter.event_id = event.map(|event| event.id);
    letter.message_id = properties.message_id().as_ref().map(|id| id.to_string());
    letter.event_type = event
        .map(|event| event.event_type.clone())
        .or_else(|| properties.kind().as_ref().map(|kind| kind.to_string()));
    letter.attempts = u32::try_from(attempts.max(1)).unwrap_or(u32::MAX);
    if let Some(headers) = properties.headers() {
        letter.headers = headers_text(headers);
    }
    letter
}

/// Every header as text.
pub(crate) fn headers_text(headers: &FieldTable) -> BTreeMap<String, String> {
    headers
        .inner()
        .iter()
        .map(|(key, value)| (key.to_string(), value_text(value)))
        .collect()
}

/// An AMQP value as text: strings as they are (lossy UTF-8), numbers and
/// booleans in decimal, arrays and tables as JSON-like text.
fn value_text(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.to_string(),
        AMQPValue::ByteArray(bytes) => String::from_utf8_lossy(bytes.as_slice()).into_owned(),
        AMQPValue::Boolean(v) => v.to_string(),
        AMQPValue::ShortShortInt(v) => v.to_string(),
        AMQPValue::ShortShortUInt(v) => v.to_string(),
        AMQPValue::ShortInt(v) => v.to_string(),
        AMQPValue::ShortUInt(v) => v.to_string(),
        AMQPValue::LongInt(v) => v.to_string(),
        AMQPValue::LongUInt(v) => v.to_string(),
        AMQPValue::LongLongInt(v) => v.to_string(),
        AMQPValue::Float(v) => v.to_string(),
        AMQPValue::Double(v) => v.to_string(),
        AMQPValue::Timestamp(v) => v.to_string(),
        AMQPValue::FieldArray(items) => {
            let items: Vec<String> = items.as_slice().iter().map(value_text).collect();
            format!("[{}]", items.join(", "))
        }
        AMQPValue::FieldTable(table) => {
            let entries: Vec<String> = headers_text(table)
                .into_iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            format!("{{{}}}", entries.join(", "))
        }
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{FieldArray, LongString, ShortString};

    #[test]
    fn headers_become_text() {
        let mut death = FieldTable::default();
        death.insert(
            ShortString::from("queue"),
            AMQPValue::LongString(LongString::from("q")),
        );
        let mut headers = FieldTable::default();
        headers.insert(
            ShortString::from("x-outbox-attempt"),
            AMQPValue::LongLongInt(3),
        );
        headers.insert(
            ShortString::from("x-outbox-dead-reason"),
            AMQPValue::LongString(LongString::from("boom")),
        );
        headers.insert(
            ShortString::from("x-death"),
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::FieldTable(death)])),
        );
        let text = headers_text(&headers);
        assert_eq!(text["x-outbox-attempt"], "3");
        assert_eq!(text["x-outbox-dead-reason"], "boom");
        assert_eq!(text["x-death"], "[{queue: q}]");
    }
}
