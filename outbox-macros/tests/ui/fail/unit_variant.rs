use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
enum OrderEvent {
    Placed {
        #[aggregate_id]
        order_id: u64,
    },
    Cancelled,
}

fn main() {}
