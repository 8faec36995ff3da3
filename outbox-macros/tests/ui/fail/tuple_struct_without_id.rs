use outbox::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
struct OrderPlaced(u64, i64);

fn main() {}
