//! The vocabulary and the relay engine of the `outbox` transactional outbox.
//!
//! Most applications depend on the `outbox` facade crate instead, which
//! re-exports everything here plus the derive and the adapters. This crate has
//! no database or broker driver: adapters implement its traits.
//!
//! ```
//! use outbox_core::{DomainEvent, EventEnvelope};
//! use serde::Serialize;
//!
//! #[derive(Serialize)]
//! struct OrderPlaced {
//!     order_id: u64,
//!     total_cents: i64,
//! }
//!
//! impl DomainEvent for OrderPlaced {
//!     fn aggregate_type(&self) -> &'static str { "order" }
//!     fn event_type(&self) -> &'static str { "order.placed" }
//!     fn aggregate_id(&self) -> String { self.order_id.to_string() }
//! }
//!
//! // What an adapter stores for the event, in the caller's transaction:
//! let envelope = EventEnvelope::from_event(&OrderPlaced { order_id: 1, total_cents: 990 })?;
//! assert_eq!(envelope.payload, r#"{"order_id":1,"total_cents":990}"#);
//! # Ok::<(), outbox_core::Error>(())
//! ```
//!
//! # The pieces
//! | item | what it is |
//! |---|---|
//! | [`DomainEvent`] | what an event says about itself (derive it with feature `derive`) |
//! | [`EventEnvelope`], [`OutboxRecord`] | the stored message, and the message plus delivery state |
//! | [`EventStatus`], [`Transition`] | the status machine, enforced in [`EventStatus::apply`] |
//! | [`RetryPolicy`] | exponential backoff with full jitter, capped, with an attempt limit |
//! | [`OutboxStore`], [`Claim`] | what a relay needs from storage (PostgreSQL: `outbox-diesel`) |
//! | [`Publisher`], [`PublishOutcome`] | what a relay needs from a broker (RabbitMQ: `outbox-lapin`) |
//! | [`InboxStore`], [`InboxDatabase`] | consumer-side deduplication, and transactions for consumers |
//! | [`Relay`], [`RelayHandle`] | the engine that moves committed events to the broker |
//! | [`context`] | headers (correlation, causation, trace) inherited by events recorded in a scope |
//! | [`relay::metric_names`] | names of the metrics it emits |
//! | [`failpoints`] | named points where fault tests can stop the relay |
//! | `testing` | in-memory store, inbox and recording publisher; the tests' shared harness and the store contracts (`testing::conformance`) (feature `test-util`) |
//!
//! # Guarantees of the relay
//! - An event is marked `Sent` only after the publisher reported
//!   [`PublishOutcome::Acked`] for it.
//! - A lost broker connection spends no attempts; the relay pauses and
//!   resumes. Per-message failures spend attempts and end in `Dead`.
//! - In [`DeliveryOrder::PerAggregate`] mode, events of one aggregate are
//!   published in `seq` order even when a batch has mixed outcomes (waves).
//! - At-least-once: a crash between the broker's confirm and the mark
//!   publishes those events again; consumers dedup on the event id.
//!
//! # Feature flags
//! | feature | default | enables |
//! |---|---|---|
//! | `derive` | no | re-export of `#[derive(DomainEvent)]` from `outbox-macros` |
//! | `test-util` | no | the `testing` module |
//! | `failpoints` | no | the named [`failpoints`] (via the `fail` crate) |
#![cfg_attr(docsrs, feature(doc_auto_cfg))]

pub mod admin;
mod backoff;
pub mod context;
mod envelope;
mod error;
mod event;
pub mod failpoints;
mod publisher;
mod redact;
pub mod relay;
mod retry;
mod status;
mod store;
#[cfg(feature = "test-util")]
pub mod testing;
pub mod trace_context;

pub use backoff::Backoff;
pub use envelope::{EventEnvelope, Headers, OutboxRecord};
pub use error::{Error, Result};
pub use event::DomainEvent;
pub use publisher::{PublishOutcome, Publisher};
pub use redact::redact_url;
pub use relay::{Relay, RelayBuilder, RelayHandle, UnroutablePolicy};
pub use retry::{NextStep, RetryPolicy};
pub use status::{EventStatus, Transition};
pub use store::{
    Claim, Claimed, DeadSelector, DeliveryOrder, FailedAttempt, InboxDatabase, InboxOutcome,
    InboxStore, OutboxStats, OutboxStore, RelayControl, RelayRegistration,
};

/// `#[derive(DomainEvent)]` (feature `derive`); see `outbox-macros`.
#[cfg(feature = "derive")]
pub use outbox_macros::DomainEvent;

// Re-exported so generated and adapter code can name exactly the versions in use.
#[doc(hidden)]
pub mod __private {
    pub use serde_json;
    pub use uuid;
}
