//! Through the facade: `outbox::DomainEvent` is both the trait and the derive.

use outbox::DomainEvent;
use serde::Serialize;
use uuid::Uuid;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order", version = 2)]
pub struct OrderPlaced {
    #[aggregate_id]
    pub order_id: Uuid,
    #[aggregate_version]
    pub version: i64,
    pub total_cents: i64,
}

fn record<E: DomainEvent>(event: &E) -> (&'static str, String) {
    (event.event_type(), event.aggregate_id())
}

fn main() {
    let event = OrderPlaced {
        order_id: Uuid::nil(),
        version: 1,
        total_cents: 10,
    };
    assert_eq!(record(&event), ("order.placed", Uuid::nil().to_string()));
    assert_eq!(event.schema_version(), 2);
    assert_eq!(event.aggregate_version(), Some(1));
    assert_eq!(OrderPlaced::SCHEMA_VERSION, 2);
}
