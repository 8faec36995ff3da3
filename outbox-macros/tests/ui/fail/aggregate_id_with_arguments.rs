use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
struct OrderPlaced {
    #[aggregate_id(display)]
    order_id: u64,
    #[aggregate_version = "yes"]
    version: i64,
}

fn main() {}
