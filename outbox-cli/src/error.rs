//! The CLI's [`Error`], each kind with its exit code.

use std::process::ExitCode;

use outbox_core::admin::AdminError;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum Error {
    /// No `--database-url` and no `DATABASE_URL`.
    #[error(
        "no database: pass --database-url or set DATABASE_URL \
         (e.g. postgres://postgres@127.0.0.1:5432/postgres, mysql://user:pw@127.0.0.1:3306/db \
         or sqlite://app.db)"
    )]
    NoDatabaseUrl,
    /// The database could not be reached (the message names the redacted URL
    /// and says to start it with scripts/dev-services).
    #[error("{0}")]
    Connect(#[source] outbox_diesel::Error),
    /// No `--amqp-url` and no `AMQP_URL`, for a command that needs the broker.
    #[error(
        "no RabbitMQ: pass --amqp-url or set AMQP_URL \
         (e.g. amqp://guest:guest@127.0.0.1:5672/%2f)"
    )]
    NoAmqpUrl,
    /// RabbitMQ could not be reached (the message names the redacted URL).
    #[error("{0}; start it with scripts/dev-services, check AMQP_URL")]
    AmqpConnect(#[source] outbox_lapin::Error),
    /// A broker call failed (e.g. no such queue).
    #[error("{0}")]
    Broker(#[source] outbox_lapin::Error),
    /// A dead-letter replay stopped part way (what it replayed is reported
    /// first); nothing was lost.
    #[error("{0}")]
    ReplayStopped(String),
    /// The request makes no sense, or a mutation was not confirmed.
    #[error("{0}")]
    Invalid(String),
    /// The admin API refused or failed.
    #[error(transparent)]
    Admin(#[from] AdminError),
    /// The store failed outside the admin API (migrate, explain).
    #[error(transparent)]
    Store(#[from] outbox_diesel::Error),
    /// Writing the output or reading a confirmation failed.
    #[error("cannot write the output: {0}")]
    Io(#[from] std::io::Error),
}

/// Exit codes, as documented in `--help` and the crate docs.
pub(crate) mod code {
    /// Ok.
    pub(crate) const OK: u8 = 0;
    /// The store or the output failed.
    pub(crate) const FAILED: u8 = 1;
    /// No such event, head or relay.
    pub(crate) const NOT_FOUND: u8 = 3;
    /// Invalid or unconfirmed request.
    pub(crate) const INVALID: u8 = 4;
    /// The database not reachable.
    pub(crate) const CONNECT: u8 = 5;
    /// RabbitMQ not reachable.
    pub(crate) const AMQP_CONNECT: u8 = 6;
    /// A dead-letter replay stopped part way (nothing lost).
    pub(crate) const REPLAY_STOPPED: u8 = 7;
}

impl Error {
    /// The process's exit code for this error.
    pub(crate) fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            Error::NoDatabaseUrl | Error::NoAmqpUrl | Error::Invalid(_) => code::INVALID,
            Error::Connect(_) => code::CONNECT,
            Error::AmqpConnect(_) => code::AMQP_CONNECT,
            Error::ReplayStopped(_) => code::REPLAY_STOPPED,
            Error::Admin(AdminError::NotFound(_)) => code::NOT_FOUND,
            Error::Admin(
                AdminError::Invalid(_) | AdminError::Forbidden { .. } | AdminError::Conflict(_),
            ) => code::INVALID,
            Error::Admin(_) | Error::Store(_) | Error::Broker(_) | Error::Io(_) => code::FAILED,
        })
    }
}

/// `Result` with the CLI's [`Error`].
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;
