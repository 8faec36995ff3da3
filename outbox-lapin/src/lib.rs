//! RabbitMQ adapter of the `outbox` transactional outbox (lapin). **Not
//! implemented yet**: this crate reserves the name and its place in the
//! workspace.
//!
//! Planned (see the project README's roadmap): `LapinPublisher` implementing
//! `outbox_core::Publisher` with publisher confirms, `mandatory` routing and the
//! wire format of the project's design, and an inbox-aware `InboxConsumer`.
//!
//! ```
//! // The trait it will implement lives in outbox-core:
//! use outbox_core::{PublishOutcome, Publisher};
//! let refused = PublishOutcome::rejected("NO_ROUTE");
//! assert!(matches!(refused, PublishOutcome::Rejected { .. }));
//! ```
