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

/// `url` with the password (if any) replaced by `***`.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

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

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            super::redact_url("amqp://guest:guest@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
    }
}
