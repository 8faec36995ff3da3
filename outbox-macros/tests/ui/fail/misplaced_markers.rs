use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
#[aggregate_id]
struct OrderPlaced {
    #[aggregate_id]
    order_id: u64,
    #[domain_event(aggregate = "order")]
    total_cents: i64,
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
enum OrderEvent {
    #[aggregate_version]
    Shipped(#[aggregate_id] u64),
}

fn main() {}
