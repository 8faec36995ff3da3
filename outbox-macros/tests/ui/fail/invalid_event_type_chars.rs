use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order", event_type = "order placed")]
struct OrderPlaced {
    #[aggregate_id]
    order_id: u64,
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order", event_type = "order/shipped")]
struct OrderShipped {
    #[aggregate_id]
    order_id: u64,
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
struct OrderÄnderung {
    #[aggregate_id]
    order_id: u64,
}

fn main() {}
