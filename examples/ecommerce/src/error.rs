//! [`Error`]: why the service stopped, and [`error_chain`] for one-line logs.

use crate::{config, db};

/// Why the service stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Bad settings.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// PostgreSQL: unreachable, or migrations failed.
    #[error(transparent)]
    Database(#[from] db::DbError),
    /// The outbox (relay settings).
    #[error(transparent)]
    Outbox(#[from] outbox::Error),
    /// RabbitMQ: unreachable, or a declaration refused.
    #[error(transparent)]
    Broker(#[from] outbox::rabbitmq::Error),
    /// The admin API's settings (e.g. `ADMIN_TOKEN` too short).
    #[error(transparent)]
    Admin(#[from] outbox::axum::Error),
    /// The metrics recorder could not be installed.
    #[error("cannot install the metrics recorder: {0}")]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
    /// The HTTP listener.
    #[error("HTTP server on {addr}: {source}")]
    Http {
        /// The address.
        addr: std::net::SocketAddr,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// A component panicked.
    #[error("the {component} component panicked: {source}")]
    Panicked {
        /// Which one.
        component: &'static str,
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
    },
}

impl From<outbox::postgres::Error> for Error {
    fn from(error: outbox::postgres::Error) -> Self {
        Error::Database(error.into())
    }
}

/// `error` and its sources, joined by `: ` (for one-line logs).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut parent = text.clone();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // `#[error(transparent)]`, "...: {source}" and "...: {source}; hint"
        // messages already hold their source's text (as sqlx's do): only
        // where the parent's own message shows it whole, after a `: `.
        let shown = parent == cause_text
            || parent.ends_with(&format!(": {cause_text}"))
            || parent.contains(&format!(": {cause_text};"));
        if !shown {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        parent = cause_text;
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_chains_do_not_repeat_themselves() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer: {0}")]
        struct Outer(#[source] std::io::Error);
        let error = Outer(std::io::Error::other("inner"));
        assert_eq!(error_chain(&error), "outer: inner");

        // The source in the middle of the message, a hint after it.
        #[derive(Debug, thiserror::Error)]
        #[error("not reachable: {0}; start it")]
        struct Hinted(#[source] std::io::Error);
        let error = Hinted(std::io::Error::other("refused"));
        assert_eq!(error_chain(&error), "not reachable: refused; start it");

        // A source whose words the message merely contains is appended.
        #[derive(Debug, thiserror::Error)]
        #[error("pool timed out waiting for a connection")]
        struct Pool(#[source] std::io::Error);
        let error = Pool(std::io::Error::other("timed out"));
        assert_eq!(
            error_chain(&error),
            "pool timed out waiting for a connection: timed out"
        );

        // A source the message does not hold is appended.
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Plain(#[source] std::io::Error);
        let error = Plain(std::io::Error::other("inner"));
        assert_eq!(error_chain(&error), "outer: inner");
    }
}
