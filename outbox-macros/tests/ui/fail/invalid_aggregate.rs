use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "")]
struct OrderPlaced {
    #[aggregate_id]
    order_id: u64,
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "sales order")]
struct OrderShipped {
    #[aggregate_id]
    order_id: u64,
}

fn main() {}
