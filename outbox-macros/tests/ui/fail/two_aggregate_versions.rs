use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
struct OrderPlaced {
    #[aggregate_id]
    order_id: u64,
    #[aggregate_version]
    version: i64,
    #[aggregate_version]
    revision: i64,
}

fn main() {}
