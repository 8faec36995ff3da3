use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order", version = -1)]
struct OrderPlaced {
    #[aggregate_id]
    order_id: u64,
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order", version = 2147483648)]
struct OrderShipped {
    #[aggregate_id]
    order_id: u64,
}

fn main() {}
