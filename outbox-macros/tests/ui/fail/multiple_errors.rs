// Three mistakes, all reported by one compile.
use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order", colour = "red", version = 0)]
struct OrderPlaced {
    order_id: u64,
    total_cents: i64,
}

fn main() {}
