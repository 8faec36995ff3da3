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
    /// An AMQP operation failed.
    #[error("RabbitMQ operation `{operation}` failed: {source}")]
    Amqp {
        /// What was being done (e.g. `declare exchange orders`).
        operation: String,
        /// The driver's error.
        #[source]
        source: lapin::Error,
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

/// Opens a connection named `name` (shown in the management UI and
/// `rabbitmqctl list_connections client_properties`).
pub(crate) async fn connect(url: &str, name: &str) -> Result<lapin::Connection> {
    let properties = lapin::ConnectionProperties::default().with_connection_name(name.into());
    lapin::Connection::connect(url, properties)
        .await
        .map_err(|source| Error::Connect {
            url: redact_url(url),
            source,
        })
}
