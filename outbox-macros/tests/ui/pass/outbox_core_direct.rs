//! Directly with `outbox_core` (the trait) and `outbox_macros` (the derive).

use outbox_core::DomainEvent;
use outbox_macros::DomainEvent;
use serde::Serialize;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "payment", event_type = "payment.captured")]
struct Captured {
    #[aggregate_id]
    payment_id: String,
    cents: i64,
}

fn main() {
    let event = Captured {
        payment_id: "p-1".to_owned(),
        cents: 5,
    };
    assert_eq!(event.aggregate_type(), "payment");
    assert_eq!(event.event_type(), "payment.captured");
    assert_eq!(event.aggregate_id(), "p-1");
    assert_eq!(event.cents, 5);
}
