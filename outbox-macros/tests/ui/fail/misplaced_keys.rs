use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order", event_type = "order.event")]
enum OrderEvent {
    #[domain_event(aggregate = "payment", crate = "outbox")]
    Placed {
        #[aggregate_id]
        order_id: u64,
    },
}

fn main() {}
