use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
struct OrderPlaced<Id: Serialize> {
    #[aggregate_id]
    order_id: Id,
}

fn main() {}
