//! Test doubles for unit tests without servers (feature `test-util`):
//! [`InMemoryStore`], [`RecordingPublisher`] and [`InMemoryInbox`]; and the
//! harness every store's and adapter's tests share: a sample event
//! ([`TestEvent`]), failing events through a claim ([`fail_claimed`]), a
//! store wrapper with hooks ([`HookedStore`]), running a relay until the
//! store reaches a state ([`run_until`]), a relay only wakeups move
//! ([`wakeup_driven`]) and the store contracts ([`conformance`]).
//!
//! They follow the same contracts as the real adapters (claims, per-aggregate
//! order, the status machine, fencing) so relay logic and application code can
//! be tested quickly; integration tests still belong against the real
//! PostgreSQL and RabbitMQ.

mod broker;
pub mod conformance;
mod event;
mod fail;
mod hooked;
mod inbox;
mod memory;
mod publisher;
mod run;

pub use broker::{BrokerError, InMemoryDeadLetterQueues, InMemorySession, QueuedMessage};
pub use event::TestEvent;
pub use fail::{FailClaimed, fail_claimed};
pub use hooked::HookedStore;
pub use inbox::{InMemoryInbox, InboxTx};
pub use memory::{InMemoryClaim, InMemoryStore, StoreError};
pub use publisher::{PublishAttempt, RecordingPublisher};
pub use run::{RunUntil, run_until, wakeup_driven};
