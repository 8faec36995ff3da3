//! Traffic of a scenario: producers that commit business rows with their
//! events (and roll some back on purpose), the verifying tap that records
//! every message the relay got to the broker, and the inbox consumer whose
//! effects must happen exactly once.
//!
//! The event they carry ([`Tick`]) is here; the producers, the tap and the
//! inbox consumer have a file each.

mod inbox;
mod producers;
mod tap;

pub use inbox::{HandlerFaults, Inbox};
pub use producers::{Produced, ProducerConfig, Producers, commit_burst};
pub use tap::{Delivery, Tap};

use outbox::DomainEvent;
use serde::{Deserialize, Serialize};

/// The event every producer records: the `seq`-th event of `aggregate`.
#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[domain_event(aggregate = "fault", event_type = "fault.tick")]
pub struct Tick {
    /// Aggregate id (`p<producer>-a<n>`).
    #[aggregate_id]
    pub aggregate: String,
    /// Increases with every transaction of the aggregate, committed or not.
    pub seq: i32,
}

/// The same event under an event type the scenario may leave unbound
/// (`fault.late`): its payload reads as a [`Tick`].
#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[domain_event(aggregate = "fault", event_type = "fault.late")]
pub struct Late {
    /// Aggregate id.
    #[aggregate_id]
    pub aggregate: String,
    /// As [`Tick::seq`].
    pub seq: i32,
}

impl From<&Tick> for Late {
    fn from(tick: &Tick) -> Late {
        Late {
            aggregate: tick.aggregate.clone(),
            seq: tick.seq,
        }
    }
}
