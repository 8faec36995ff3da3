use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order", version = 1, aggregate = "sale")]
#[domain_event(version = 2)]
struct OrderPlaced {
    #[aggregate_id]
    order_id: u64,
}

fn main() {}
