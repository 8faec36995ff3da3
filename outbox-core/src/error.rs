//! The crate's [`Error`] type.

use crate::{EventStatus, Transition};

/// Errors of `outbox-core`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The event's payload could not be serialized to JSON.
    #[error(
        "event `{event_type}` could not be serialized to JSON: {source}; \
         check its Serialize implementation (maps need string keys)"
    )]
    Serialize {
        /// The event type that failed.
        event_type: &'static str,
        /// The serializer's error.
        #[source]
        source: serde_json::Error,
    },
    /// The event breaks an invariant the outbox relies on.
    #[error("invalid event `{event_type}`: {reason}")]
    InvalidEvent {
        /// The event type that failed.
        event_type: String,
        /// What is wrong.
        reason: String,
    },
    /// A status change that the state machine does not allow.
    #[error("illegal status transition: {transition:?} is not allowed from `{from}`")]
    InvalidTransition {
        /// The current status.
        from: EventStatus,
        /// The attempted transition.
        transition: Transition,
    },
    /// A status name that is not one of [`EventStatus::ALL`].
    #[error("unknown event status `{0}` (expected pending, retry, held, sent, dead or skipped)")]
    UnknownStatus(String),
    /// A delivery order name that is not one of [`DeliveryOrder::ALL`](crate::DeliveryOrder::ALL).
    #[error("unknown delivery order `{0}` (expected per_aggregate or unordered)")]
    UnknownDeliveryOrder(String),
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
