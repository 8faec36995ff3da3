use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event]
struct OrderPlaced {
    #[aggregate_id]
    order_id: u64,
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate, version = 2)]
struct OrderShipped {
    #[aggregate_id]
    order_id: u64,
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order", crate = "not a path")]
struct OrderPaid {
    #[aggregate_id]
    order_id: u64,
}

fn main() {}
