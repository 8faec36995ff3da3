use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order", topic = "orders")]
struct OrderPlaced {
    #[aggregate_id]
    order_id: u64,
}

fn main() {}
