//! Test doubles for unit tests without servers (feature `test-util`):
//! [`InMemoryStore`], [`RecordingPublisher`] and [`InMemoryInbox`].
//!
//! They follow the same contracts as the real adapters (claims, per-aggregate
//! order, the status machine, fencing) so relay logic and application code can
//! be tested quickly; integration tests still belong against the real
//! PostgreSQL and RabbitMQ.

mod broker;
mod inbox;
mod memory;
mod publisher;

pub use broker::{BrokerError, InMemoryDeadLetterQueues, InMemorySession, QueuedMessage};
pub use inbox::{InMemoryInbox, InboxTx};
pub use memory::{InMemoryClaim, InMemoryStore, StoreError};
pub use publisher::{PublishAttempt, RecordingPublisher};
