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
    /// A query failed. When the server answered that it is read-only
    /// (SQLSTATE 25006, e.g. a standby, or a primary demoted in a
    /// failover), the message says so (see [`Error::is_read_only`]).
    #[error("outbox query failed: {0}{hint}", hint = read_only_hint(.0))]
    Database(#[from] diesel::result::Error),
    /// No connection could be taken from the pool (the driver's error is
    /// the source).
    #[error("could not get a database connection from the pool: {0}")]
    Pool(#[from] diesel_async::pooled_connection::deadpool::PoolError),
    /// A direct connection (for `LISTEN` or migrations) could not be opened.
    #[error(
        "database not reachable at {url}: {source}; start it with scripts/dev-services \
         or check DATABASE_URL"
    )]
    Connect {
        /// The URL, with any password redacted.
        url: String,
        /// The driver's error.
        #[source]
        source: diesel::ConnectionError,
    },
    /// A commit was refused because it would not have been a real top-level
    /// `COMMIT` of a healthy transaction (a nested transaction left open, an
    /// aborted transaction): nothing was committed. See
    /// [`commit_top_level`](crate::commit_top_level).
    #[error("transaction not committed: {reason}")]
    NotCommitted {
        /// What was wrong, and what to change.
        reason: String,
        /// The probe's error, for an aborted transaction.
        #[source]
        source: Option<diesel::result::Error>,
    },
    /// The connection URL asks for TLS this build cannot give (no
    /// `postgres-tls` feature), or its TLS settings are unusable (an
    /// unreadable `sslrootcert`, `verify-full` without one).
    #[error("TLS to the database at {url}: {reason}")]
    Tls {
        /// The URL, with any password redacted.
        url: String,
        /// What is wrong and what to do.
        reason: String,
    },
    /// A claim was asked to mark an event (by its `seq`) that is not one of
    /// its records: the whole mark was refused and nothing was changed, so a
    /// claim never marks another relay's row.
    #[error(
        "outbox event seq {seq} is not part of this claim, nothing was marked: mark only the \
         seqs of the claim's own records()"
    )]
    NotInClaim {
        /// The seq that was refused.
        seq: i64,
    },
    /// One mark ([`mark_sent`](outbox_core::Claim::mark_sent),
    /// [`mark_suspect`](outbox_core::Claim::mark_suspect) or
    /// [`mark_failed`](outbox_core::Claim::mark_failed)) named an event's
    /// `seq` more than once: the whole mark was refused and nothing was
    /// changed (the statement would fold the copies silently, or store one
    /// of two different outcomes, which one unspecified).
    #[error(
        "outbox event seq {seq} is named more than once in one mark, nothing was marked: name \
         each of the claim's records at most once per mark_sent, mark_suspect or mark_failed call"
    )]
    DuplicateSeq {
        /// The seq named twice (the first found).
        seq: i64,
    },
    /// A claim was used after it was finished (its transaction is gone).
    #[error(
        "outbox claim already finished: its transaction is committed, so it can mark nothing \
         more; take a new claim"
    )]
    ClaimFinished,
    /// A setting is invalid (e.g. a schema name PostgreSQL cannot hold).
    #[error("invalid outbox configuration: {0}")]
    Config(String),
    /// The outbox's tables are at a schema version this version of the
    /// library cannot work on.
    #[error(
        "outbox schema {schema:?} is at migration {found}, but this version of outbox-diesel \
         works on migrations {min} to {max}: {}",
        if *found < *min {
            "run outbox_diesel::migrate (or apply outbox_diesel::ddl) before starting relays"
        } else {
            "a newer version migrated it; run that version's relays, not this one"
        }
    )]
    SchemaVersion {
        /// The schema.
        schema: String,
        /// Its newest applied migration.
        found: i32,
        /// The oldest this version works on.
        min: i32,
        /// The newest this version knows.
        max: i32,
    },
    /// The delivery order stored in the schema's `outbox_settings` is not
    /// one this version knows (`per_aggregate` or `unordered`), e.g. written
    /// by hand or by a newer version: nothing was claimed or reported.
    #[error(
        "outbox schema {schema:?} stores delivery order {value:?}, which this version of \
         outbox-diesel does not know (expected per_aggregate or unordered): set it with \
         PgOutboxStore::set_delivery_order, or run the version that wrote it"
    )]
    UnknownDeliveryOrder {
        /// The schema.
        schema: String,
        /// The stored value.
        value: String,
    },
    /// SQLite: a claim's lease expired and another claim took these events
    /// (`seqs`) before [`finish`](outbox_core::Claim::finish) applied this
    /// claim's marks of them. The marks of the claim's other events were
    /// committed. These events were published and may be published again:
    /// delivery is at-least-once, nothing is lost. A publish took longer
    /// than the claim timeout, which must exceed the confirm timeout.
    #[error(
        "the lease of outbox events {seqs:?} expired and another claim took them before this          claim finished: their marks were not applied (the claim's other marks were committed);          they were published and may be published again (at-least-once delivery, nothing is          lost). Raise the claim timeout above the longest publish"
    )]
    LeaseLost {
        /// The seqs whose marks were not applied, in seq order.
        seqs: Vec<i64>,
    },
    /// A stored row could not be read back (corrupt headers, unknown status).
    #[error("outbox row {seq} is malformed: {reason}")]
    MalformedRow {
        /// The row's sequence number.
        seq: i64,
        /// What is wrong.
        reason: String,
    },
}

impl Error {
    /// Whether the database answered that it is read-only (SQLSTATE 25006,
    /// `read_only_sql_transaction`): a standby, a primary being demoted, or
    /// `default_transaction_read_only` set. The connection that got it
    /// should not be used again: the next one (with
    /// `target_session_attrs=read-write`, this crate's default) goes to a
    /// server that takes writes.
    pub fn is_read_only(&self) -> bool {
        matches!(self, Error::Database(e) if is_read_only(e))
    }
}

/// Whether `error` is PostgreSQL's (or MySQL's) "read-only transaction".
pub(crate) fn is_read_only(error: &diesel::result::Error) -> bool {
    matches!(
        error,
        diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::ReadOnlyTransaction,
            _
        )
    )
}

fn read_only_hint(error: &diesel::result::Error) -> &'static str {
    if is_read_only(error) {
        "; the database is read-only (a standby?): do not reuse this connection (the outbox \
         closes the connections of its own statements that get this answer: the relay store's, \
         the inbox entry's and dead letter's, a failed commit's; close your own, e.g. drop a \
         `Transaction` rather than roll it back); new connections go to a server that takes writes \
         (target_session_attrs=read-write), so list the hosts of the primary and its standbys \
         in the URL to follow a failover"
    } else {
        ""
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) use outbox_core::redact_url;
