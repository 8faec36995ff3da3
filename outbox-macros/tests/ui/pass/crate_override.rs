//! `#[domain_event(crate = "...")]`: a re-export, an absolute path, and a
//! renamed import.

use serde::Serialize;

mod events {
    pub use outbox::DomainEvent;
}

extern crate outbox_core as renamed_core;

use events::DomainEvent;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order", crate = "crate::events")]
struct ThroughReexport {
    #[aggregate_id]
    id: u64,
}

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order", crate = "::outbox_core")]
struct Absolute {
    #[aggregate_id]
    id: u64,
}

#[derive(Serialize, DomainEvent)]
#[domain_event(crate = "renamed_core", aggregate = "order")]
struct Renamed {
    #[aggregate_id]
    id: u64,
}

fn main() {
    assert_eq!(
        ThroughReexport { id: 1 }.event_type(),
        "order.through_reexport"
    );
    assert_eq!(Absolute { id: 1 }.event_type(), "order.absolute");
    assert_eq!(Renamed { id: 1 }.event_type(), "order.renamed");
}
