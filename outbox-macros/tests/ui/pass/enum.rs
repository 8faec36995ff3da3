//! An enum: one event type per variant, with per-variant overrides.

use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[serde(untagged)]
#[domain_event(aggregate = "order", version = 3)]
pub enum OrderEvent {
    OrderPlaced {
        #[aggregate_id]
        order_id: u64,
        #[aggregate_version]
        version: i32,
    },
    #[domain_event(event_type = "order.cancelled", version = 1)]
    Cancel(#[aggregate_id] u64),
}

fn main() {
    let placed = OrderEvent::OrderPlaced {
        order_id: 1,
        version: 2,
    };
    assert_eq!(placed.event_type(), "order.placed");
    assert_eq!(placed.schema_version(), 3);
    assert_eq!(placed.aggregate_version(), Some(2));
    let cancel = OrderEvent::Cancel(1);
    assert_eq!(cancel.event_type(), "order.cancelled");
    assert_eq!(cancel.schema_version(), 1);
    assert_eq!(cancel.aggregate_version(), None);
    assert_eq!(OrderEvent::EVENT_TYPES, ["order.placed", "order.cancelled"]);
}
