//! What a dead letter's headers say (whether it was dead-lettered, the
//! queue it came from), and the properties of its replayed copy.

use std::collections::BTreeMap;

use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use crate::headers::{
    ATTEMPT_HEADER, DEAD_LETTER_ID_HEADER, DEAD_REASON_HEADER, ORIGINAL_ROUTING_KEY_HEADER,
    QUEUE_HEADER, REPLAYED_REASON_HEADER,
};
use crate::wire::header_str;

/// Whether the headers show the message was dead-lettered (by a consumer,
/// or by the broker).
pub(super) fn dead_lettered(headers: &FieldTable) -> bool {
    let inner = headers.inner();
    [
        QUEUE_HEADER,
        "x-death",
        DEAD_REASON_HEADER,
        DEAD_LETTER_ID_HEADER,
    ]
    .iter()
    .any(|name| inner.contains_key(*name))
}

/// The queue a dead letter came from: its [`QUEUE_HEADER`], else the queue
/// of the first (latest) `x-death` entry.
pub(super) fn origin_queue(headers: &FieldTable) -> Option<String> {
    if let Some(queue) = header_str(headers, QUEUE_HEADER).filter(|q| valid_queue(q)) {
        return Some(queue.to_owned());
    }
    let Some(AMQPValue::FieldArray(deaths)) = headers.inner().get("x-death") else {
        return None;
    };
    let Some(AMQPValue::FieldTable(first)) = deaths.as_slice().first() else {
        return None;
    };
    header_str(first, "queue")
        .filter(|q| valid_queue(q))
        .map(str::to_owned)
}

fn valid_queue(queue: &str) -> bool {
    !queue.is_empty() && queue.len() <= 255
}

/// The replayed copy's properties: the dead letter's, with the attempt
/// header removed, the dead reason moved to [`REPLAYED_REASON_HEADER`], and
/// the original routing key kept (the copy travels keyed by queue name).
pub(super) fn replay_properties(delivery: &Delivery) -> BasicProperties {
    let mut headers: BTreeMap<ShortString, AMQPValue> = delivery
        .properties
        .headers()
        .as_ref()
        .map(|table| table.inner().clone())
        .unwrap_or_default();
    headers.remove(ATTEMPT_HEADER);
    // Where it came from is told again by whoever dead-letters the copy:
    // stale origins would send a later dead letter back to the wrong queue.
    headers.remove(QUEUE_HEADER);
    headers.remove(DEAD_LETTER_ID_HEADER);
    headers.remove("x-death");
    if let Some(reason) = headers.remove(DEAD_REASON_HEADER) {
        headers.insert(ShortString::from(REPLAYED_REASON_HEADER), reason);
    }
    if !headers.contains_key(ORIGINAL_ROUTING_KEY_HEADER) {
        headers.insert(
            ShortString::from(ORIGINAL_ROUTING_KEY_HEADER),
            AMQPValue::LongString(LongString::from(delivery.routing_key.as_str())),
        );
    }
    delivery
        .properties
        .clone()
        .with_headers(FieldTable::from(headers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::FieldArray;

    fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
        let mut table = FieldTable::default();
        for (k, v) in entries {
            table.insert(ShortString::from(*k), v.clone());
        }
        table
    }

    fn text(s: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(s))
    }

    #[test]
    fn the_origin_is_the_queue_header_else_the_first_x_death() {
        let deaths = AMQPValue::FieldArray(FieldArray::from(vec![
            AMQPValue::FieldTable(table(&[("queue", text("latest"))])),
            AMQPValue::FieldTable(table(&[("queue", text("older"))])),
        ]));
        let both = table(&[(QUEUE_HEADER, text("ours")), ("x-death", deaths.clone())]);
        assert_eq!(origin_queue(&both).as_deref(), Some("ours"));
        let broker = table(&[("x-death", deaths)]);
        assert_eq!(origin_queue(&broker).as_deref(), Some("latest"));
        assert_eq!(origin_queue(&table(&[])), None);
        assert_eq!(origin_queue(&table(&[(QUEUE_HEADER, text(""))])), None);
    }
}
