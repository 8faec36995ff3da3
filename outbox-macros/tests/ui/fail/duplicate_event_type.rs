use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
enum OrderEvent {
    Placed {
        #[aggregate_id]
        order_id: u64,
    },
    OrderPlaced {
        #[aggregate_id]
        order_id: u64,
    },
    #[domain_event(event_type = "order.placed")]
    PlacedAgain {
        #[aggregate_id]
        order_id: u64,
    },
}

fn main() {}
