use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = 1, version = "1")]
struct OrderPlaced {
    #[aggregate_id]
    order_id: u64,
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order", event_type = order.shipped, crate = outbox)]
struct OrderShipped {
    #[aggregate_id]
    order_id: u64,
}

fn main() {}
