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
         (e.g. postgres://postgres@127.0.0.1:5432/postgres)"
    )]
    NoDatabaseUrl,
    /// PostgreSQL could not be reached (the message names the redacted URL
    /// and says to start it with scripts/dev-services).
    #[error("{0}")]
    Connect(#[source] outbox_diesel::Error),
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
    /// PostgreSQL not reachable.
    pub(crate) const CONNECT: u8 = 5;
}

impl Error {
    /// The process's exit code for this error.
    pub(crate) fn exit_code(&self) -> ExitCode {
        ExitCode::from(match self {
            Error::NoDatabaseUrl | Error::Invalid(_) => code::INVALID,
            Error::Connect(_) => code::CONNECT,
            Error::Admin(AdminError::NotFound(_)) => code::NOT_FOUND,
            Error::Admin(AdminError::Invalid(_) | AdminError::Forbidden { .. }) => code::INVALID,
            Error::Admin(_) | Error::Store(_) | Error::Io(_) => code::FAILED,
        })
    }
}

/// `Result` with the CLI's [`Error`].
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;
