//! [`AdminError`]: why an admin call failed.

/// Why an admin call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The request makes no sense (an empty selection for a mutation, a
    /// status a verb cannot change, ...). The message says what to change.
    #[error("{0}")]
    Invalid(String),
    /// The caller may only read.
    #[error("{identity} may only read; {action} needs the operator role")]
    Forbidden {
        /// Who asked.
        identity: String,
        /// What they asked for.
        action: &'static str,
    },
    /// No such event, aggregate, relay, dead letter or queue.
    #[error("{0}")]
    NotFound(String),
    /// The request clashes with what is running (e.g. a replay of the same
    /// dead-letter queue). The message says what.
    #[error("{0}")]
    Conflict(String),
    /// The store failed.
    #[error("the outbox store failed: {0}")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The broker failed (dead-letter queues).
    #[error("the broker failed: {0}")]
    Broker(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl AdminError {
    pub(crate) fn store<E: std::error::Error + Send + Sync + 'static>(error: E) -> Self {
        AdminError::Store(Box::new(error))
    }

    pub(crate) fn broker<E: std::error::Error + Send + Sync + 'static>(error: E) -> Self {
        AdminError::Broker(Box::new(error))
    }
}
