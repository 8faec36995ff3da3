//! The crate's [`Error`] type.

/// Errors of `outbox-lapin`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The broker could not be reached or refused the connection.
    #[error(
        "RabbitMQ not reachable at {url}: {source}; start it with scripts/dev-services \
         or check AMQP_URL"
    )]
    Connect {
        /// The URL, with any password redacted.
        url: String,
        /// The driver's error.
        #[source]
        source: lapin::Error,
    },
    /// The broker accepted the TCP connection but did not complete the AMQP
    /// handshake in time (a broker still booting or overloaded, or a
    /// network that drops packets).
    #[error(
        "RabbitMQ at {url} did not complete the connection within {after:?}; is it starting, \
         overloaded, or behind a network that drops packets?"
    )]
    ConnectTimeout {
        /// The URL, with any password redacted.
        url: String,
        /// How long it waited.
        after: std::time::Duration,
    },
    /// No node of the broker could be reached: every URL of an
    /// [`AmqpUrls`](crate::AmqpUrls) list of several failed, in the order
    /// tried (with a single URL, the error is that URL's [`Error::Connect`]
    /// or [`Error::ConnectTimeout`]).
    #[error(
        "no RabbitMQ node reachable ({} tried): {}; start them, or check AMQP_URL",
        .failures.len(),
        .failures.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
    )]
    Unreachable {
        /// Each URL's error ([`Error::Connect`] or [`Error::ConnectTimeout`],
        /// naming the URL, password redacted), in the order tried.
        failures: Vec<Error>,
    },
    /// No broker URL was given (an empty string or list).
    #[error(
        "no RabbitMQ URL given: pass one URL, or several separated by commas (one per cluster node)"
    )]
    NoUrls,
    /// An AMQP operation failed.
    #[error("RabbitMQ operation `{operation}` failed: {source}")]
    Amqp {
        /// What was being done (e.g. `declare exchange orders`).
        operation: String,
        /// The driver's error.
        #[source]
        source: lapin::Error,
    },
    /// The broker did not answer an operation in time: it is overloaded,
    /// blocked by a resource alarm, paused, or the network drops packets.
    /// The connection (or channel) involved is not used again.
    #[error(
        "RabbitMQ did not complete `{operation}` within {after:?}; the broker is unavailable \
         (overloaded, blocked by a memory or disk alarm, or unreachable); it is retried on a new \
         connection"
    )]
    Timeout {
        /// What was being done (e.g. `open channel`).
        operation: String,
        /// How long it waited.
        after: std::time::Duration,
    },
    /// A setting is invalid.
    #[error("invalid RabbitMQ configuration: {0}")]
    Config(String),
}

impl Error {
    pub(crate) fn amqp(operation: impl Into<String>) -> impl FnOnce(lapin::Error) -> Error {
        let operation = operation.into();
        move |source| Error::Amqp { operation, source }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) use outbox_core::redact_url;
