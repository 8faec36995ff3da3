//! The crate's [`Error`] type.

/// Errors of `outbox-diesel`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `record` was called on a connection without an open transaction.
    #[error(
        "no open transaction: outbox events must be recorded inside the transaction of the \
         business change (e.g. `conn.transaction(|conn| ...)`), never in autocommit"
    )]
    NoTransaction,
    /// The event is invalid or its payload failed to serialize.
    #[error(transparent)]
    Event(#[from] outbox_core::Error),
    /// A query failed.
    #[error("outbox query failed: {0}")]
    Database(#[from] diesel::result::Error),
    /// No connection could be taken from the pool.
    #[error("could not get a PostgreSQL connection from the pool: {0}")]
    Pool(String),
    /// A direct connection (for `LISTEN` or migrations) could not be opened.
    #[error(
        "PostgreSQL not reachable at {url}: {source}; start it with scripts/dev-services \
         or check DATABASE_URL"
    )]
    Connect {
        /// The URL, with any password redacted.
        url: String,
        /// The driver's error.
        #[source]
        source: diesel::ConnectionError,
    },
    /// The connection URL asks for TLS this build cannot give (no
    /// `postgres-tls` feature), or its TLS settings are unusable (an
    /// unreadable `sslrootcert`, `verify-full` without one).
    #[error("TLS to PostgreSQL at {url}: {reason}")]
    Tls {
        /// The URL, with any password redacted.
        url: String,
        /// What is wrong and what to do.
        reason: String,
    },
    /// A setting is invalid (e.g. a schema name PostgreSQL cannot hold).
    #[error("invalid outbox configuration: {0}")]
    Config(String),
    /// A stored row could not be read back (corrupt headers, unknown status).
    #[error("outbox row {seq} is malformed: {reason}")]
    MalformedRow {
        /// The row's sequence number.
        seq: i64,
        /// What is wrong.
        reason: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) use outbox_core::redact_url;
