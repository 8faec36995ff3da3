use outbox::DomainEvent;

#[derive(DomainEvent)]
#[domain_event(aggregate = "order")]
union OrderPlaced {
    order_id: u64,
    total_cents: i64,
}

fn main() {}
