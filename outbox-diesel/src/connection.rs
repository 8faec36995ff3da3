//! [`Connection`]: the diesel-async connections this crate works on, one
//! per back end, and what differs between them when a transaction begins
//! and commits.

use std::future::Future;

use diesel::QueryResult;
use diesel::connection::TransactionManagerStatus;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use diesel_async::AnsiTransactionManager;
use diesel_async::pooled_connection::PoolableConnection;
use diesel_async::pooled_connection::{AsyncDieselConnectionManager, ManagerConfig};
use diesel_async::{SimpleAsyncConnection, TransactionManager};

use crate::Error;

mod sealed {
    pub trait Sealed {}
}

/// A diesel-async connection of a back end this crate supports:
/// `AsyncPgConnection` (feature `postgres`), `AsyncMysqlConnection`
/// (feature `mysql`) and `SyncConnectionWrapper<SqliteConnection>`
/// (`sqlite::AsyncSqliteConnection`, feature `sqlite`). Sealed: the crate's checked commit and its
/// transactions ([`Transaction`](crate::Transaction)) rely on what each
/// back end does to a transaction after a failed statement, which only
/// this crate knows.
///
/// # How each back end begins and commits
/// - **PostgreSQL**: `BEGIN`; the commit sends `SELECT 1; COMMIT` in one
///   message: in a transaction that an earlier failed statement aborted the
///   probe fails and the `COMMIT` (which would roll back without an error)
///   never runs.
/// - **MariaDB/MySQL**: `BEGIN; SAVEPOINT outbox_tx`; the commit sends
///   `RELEASE SAVEPOINT outbox_tx; COMMIT`. A deadlock (or a lock wait
///   timeout with `innodb_rollback_on_timeout`) rolls the whole transaction
///   back, savepoints included, and the statements after it run in
///   autocommit: the release then fails, so the `COMMIT` never runs and the
///   commit reports [`Error::NotCommitted`]. Other failed statements (a
///   duplicate key, a lock wait timeout by default) roll back only
///   themselves and leave the transaction open, as MySQL defines: a handler
///   that catches such an error and carries on commits the rest, where
///   PostgreSQL would refuse the commit.
/// - **SQLite**: `BEGIN IMMEDIATE` (the write lock at once, waiting up to
///   the connection's `busy_timeout`: a deferred `BEGIN` that reads and then
///   writes fails with `SQLITE_BUSY` at its first write, without waiting);
///   the commit is a plain `COMMIT`, its own probe. A failed statement
///   rolls back only itself (a constraint violation, a `CHECK`), and the
///   transaction stays open, as on MariaDB: a handler that catches such an
///   error and carries on commits the rest. Some errors roll the whole
///   transaction back (`SQLITE_FULL`, `SQLITE_IOERR`, `SQLITE_NOMEM`,
///   `SQLITE_BUSY`, an interrupt, `RAISE(ROLLBACK)` in a trigger, an
///   `OR ROLLBACK` conflict) and the statements after it run in autocommit:
///   the `COMMIT` then fails ("no transaction is active") and the commit
///   reports [`Error::NotCommitted`]; the recorder and the inbox check that
///   the transaction is still open right before they insert (a `BEGIN`
///   that must fail), so no event or inbox entry is ever committed on its
///   own.
pub trait Connection:
    PoolableConnection + SimpleAsyncConnection + Send + 'static + sealed::Sealed
{
    /// The back end's name, for error messages.
    #[doc(hidden)]
    const BACKEND: &'static str;

    /// diesel-async's deadpool manager of this connection
    /// (`AsyncDieselConnectionManager<Self>`), named here because deadpool's
    /// bounds on it hold only for the concrete connection types.
    #[doc(hidden)]
    type Manager: deadpool::managed::Manager<Type = Self, Error = diesel_async::pooled_connection::PoolError>
        + Send
        + Sync;

    /// [`commit_top_level`](crate::commit_top_level) of this connection,
    /// for code generic over the back end.
    #[doc(hidden)]
    fn commit_top_level(&mut self) -> impl Future<Output = Result<(), Error>> + Send
    where
        Self: Sized,
    {
        crate::transaction::commit(self)
    }

    /// [`in_top_level_transaction`](crate::in_top_level_transaction) of this
    /// connection.
    #[doc(hidden)]
    fn in_top_level_transaction(&mut self) -> bool
    where
        Self: Sized,
    {
        crate::transaction::top_level(self)
    }

    /// This back end's recorder (`Outbox`, `MysqlOutbox`, `SqliteOutbox`),
    /// for code generic over the connection (the Axum layer).
    #[doc(hidden)]
    type Recorder: Clone + Default + Send + Sync + std::fmt::Debug + 'static;

    /// Records `envelopes` in the transaction open on `conn`, as the
    /// recorder's `record_envelopes` does.
    #[doc(hidden)]
    fn record_envelopes<'a>(
        recorder: &'a Self::Recorder,
        conn: &'a mut Self,
        envelopes: &'a [outbox_core::EventEnvelope],
    ) -> impl Future<Output = Result<(), Error>> + Send + 'a;

    /// Records `event` in the transaction open on this connection, in the
    /// back end's default outbox, and returns its id: for code generic over
    /// the back end (an application that runs on any of them, as the
    /// example service does). The same as the back end's own `record`
    /// (`outbox_diesel::record`, `outbox_diesel::mysql::record`,
    /// `outbox_diesel::sqlite::record`), with the default recorder of each
    /// (PostgreSQL's `public` schema, MariaDB's current database, SQLite's
    /// `main` database).
    ///
    /// # Errors
    /// As the back end's `record`: [`Error::NoTransaction`] outside a
    /// transaction, [`Error::Event`] for an invalid event, the database's
    /// error.
    fn record_event<E: outbox_core::DomainEvent + Sync>(
        &mut self,
        event: &E,
    ) -> impl Future<Output = Result<uuid::Uuid, Error>> + Send
    where
        Self: Sized,
    {
        async move {
            let envelope = outbox_core::EventEnvelope::from_event(event)?;
            let id = envelope.id;
            Self::record_envelopes(&Self::Recorder::default(), self, &[envelope]).await?;
            Ok(id)
        }
    }

    /// Records `events` with one `INSERT`, as [`record_event`] does one;
    /// returns their ids in order. On any error nothing is written.
    ///
    /// [`record_event`]: Connection::record_event
    ///
    /// # Errors
    /// As [`record_event`](Connection::record_event).
    fn record_events<E: outbox_core::DomainEvent + Sync>(
        &mut self,
        events: &[E],
    ) -> impl Future<Output = Result<Vec<uuid::Uuid>, Error>> + Send
    where
        Self: Sized,
    {
        async move {
            let envelopes = events
                .iter()
                .map(outbox_core::EventEnvelope::from_event)
                .collect::<Result<Vec<_>, _>>()?;
            Self::record_envelopes(&Self::Recorder::default(), self, &envelopes).await?;
            Ok(envelopes.iter().map(|envelope| envelope.id).collect())
        }
    }

    /// diesel-async's manager for `url` with `config`.
    #[doc(hidden)]
    fn manager(url: &str, config: ManagerConfig<Self>) -> Self::Manager;

    /// Begins a top-level transaction the way [`commit_checked`] expects.
    ///
    /// [`commit_checked`]: Connection::commit_checked
    #[doc(hidden)]
    fn begin(&mut self) -> impl Future<Output = QueryResult<()>> + Send;

    /// Rolls back the innermost transaction (or savepoint).
    #[doc(hidden)]
    fn rollback(&mut self) -> impl Future<Output = QueryResult<()>> + Send;

    /// diesel's record of the open transactions.
    #[doc(hidden)]
    fn transaction_status(&mut self) -> &mut TransactionManagerStatus;

    /// Commits a top-level transaction begun by [`begin`](Connection::begin)
    /// only if the server still has it, in one round trip; tells diesel the
    /// transaction is over when it succeeds.
    #[doc(hidden)]
    fn commit_checked(&mut self) -> impl Future<Output = Result<(), Error>> + Send;
}

/// A [`Connection`], or something that holds one and hands it out: the
/// connection types themselves, a pooled connection (deadpool's `Object`),
/// a [`Transaction`](crate::Transaction), the Axum layer's `Tx`. Functions
/// generic over the back end take `&mut impl AsConnection`, so that
/// `&mut conn` works for a pooled connection as `&mut *conn` does (deref
/// coercion does not apply to a generic parameter).
pub trait AsConnection: Send {
    /// The connection held.
    type Conn: Connection;

    /// The connection.
    fn as_connection(&mut self) -> &mut Self::Conn;
}

impl<C: Connection> AsConnection for deadpool::managed::Object<AsyncDieselConnectionManager<C>>
where
    AsyncDieselConnectionManager<C>: deadpool::managed::Manager<Type = C>,
{
    type Conn = C;

    fn as_connection(&mut self) -> &mut C {
        self
    }
}

impl<C: Connection> AsConnection for crate::Transaction<C> {
    type Conn = C;

    fn as_connection(&mut self) -> &mut C {
        self
    }
}

/// `impl AsConnection for $conn` (itself).
macro_rules! as_itself {
    ($conn:ty) => {
        impl AsConnection for $conn {
            type Conn = $conn;

            fn as_connection(&mut self) -> &mut $conn {
                self
            }
        }
    };
}

/// Whether a transaction is open on `conn` (at any depth).
pub(crate) fn in_transaction<C: Connection>(conn: &mut C) -> crate::Result<()> {
    match conn.transaction_status().transaction_depth()? {
        Some(_) => Ok(()),
        None => Err(Error::NoTransaction),
    }
}

/// Tells diesel that the server left the top-level transaction.
fn left_transaction(status: &mut TransactionManagerStatus) -> crate::Result<()> {
    use diesel::connection::TransactionDepthChange;
    if let TransactionManagerStatus::Valid(valid) = status {
        valid.change_transaction_depth(TransactionDepthChange::DecreaseDepth)?;
    }
    Ok(())
}

#[cfg(feature = "postgres")]
mod postgres {
    use diesel_async::AsyncPgConnection;

    use super::*;
    use crate::sql::{PROBE, PROBE_AND_COMMIT};

    impl sealed::Sealed for AsyncPgConnection {}
    as_itself!(AsyncPgConnection);

    impl Connection for AsyncPgConnection {
        type Manager = AsyncDieselConnectionManager<Self>;
        type Recorder = crate::Outbox;

        async fn record_envelopes(
            recorder: &Self::Recorder,
            conn: &mut Self,
            envelopes: &[outbox_core::EventEnvelope],
        ) -> Result<(), Error> {
            recorder.record_envelopes(conn, envelopes).await
        }

        fn manager(url: &str, config: ManagerConfig<Self>) -> Self::Manager {
            AsyncDieselConnectionManager::new_with_config(url, config)
        }
        const BACKEND: &'static str = "PostgreSQL";

        async fn begin(&mut self) -> QueryResult<()> {
            AnsiTransactionManager::begin_transaction(self).await
        }

        async fn rollback(&mut self) -> QueryResult<()> {
            AnsiTransactionManager::rollback_transaction(self).await
        }

        fn transaction_status(&mut self) -> &mut TransactionManagerStatus {
            AnsiTransactionManager::transaction_manager_status_mut(self)
        }

        async fn commit_checked(&mut self) -> Result<(), Error> {
            if let Err(error) = self.batch_execute(PROBE_AND_COMMIT).await {
                return Err(classify_failed_commit(self, error).await);
            }
            left_transaction(self.transaction_status())
        }
    }

    async fn classify_failed_commit(
        conn: &mut AsyncPgConnection,
        error: diesel::result::Error,
    ) -> Error {
        use diesel::result::{DatabaseErrorKind, Error as Diesel};
        match conn.batch_execute(PROBE).await {
            Err(Diesel::DatabaseError(DatabaseErrorKind::Unknown, _)) => Error::NotCommitted {
                reason: "nothing of it is stored: the transaction was aborted by an earlier \
                         statement that failed, and \
                         the code went on as if it had not (e.g. a handler that caught a \
                         database error and still returned success); PostgreSQL rolls such a \
                         transaction back at COMMIT. Fail when a statement fails, or run a \
                         statement that may fail in a nested `transaction(..)` (a savepoint), \
                         which rolls back only that statement"
                    .into(),
                source: Some(error),
            },
            // `COMMIT` failed (the transaction is over, rolled back), or the
            // connection is gone.
            _ => Error::Database(error),
        }
    }
}

#[cfg(feature = "mysql")]
pub(crate) use mysql::BEGIN as MYSQL_BEGIN;

#[cfg(feature = "mysql")]
mod mysql {
    use diesel_async::AsyncMysqlConnection;

    use super::*;

    /// The savepoint every checked transaction opens first; it exists as
    /// long as the server still has the transaction.
    pub(crate) const BEGIN: &str = "BEGIN; SAVEPOINT outbox_tx";
    /// Fails, and stops the batch before the `COMMIT`, when the savepoint
    /// is gone: the server rolled the transaction back.
    pub(crate) const PROBE_AND_COMMIT: &str = "RELEASE SAVEPOINT outbox_tx; COMMIT";

    /// Whether the server has a transaction open (`open`: 1 or 0).
    const OPEN: &str = "SELECT @@in_transaction AS open";

    #[derive(diesel::QueryableByName)]
    struct Open {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        open: i64,
    }

    impl sealed::Sealed for AsyncMysqlConnection {}
    as_itself!(AsyncMysqlConnection);

    impl Connection for AsyncMysqlConnection {
        type Manager = AsyncDieselConnectionManager<Self>;
        type Recorder = crate::mysql::MysqlOutbox;

        async fn record_envelopes(
            recorder: &Self::Recorder,
            conn: &mut Self,
            envelopes: &[outbox_core::EventEnvelope],
        ) -> Result<(), Error> {
            recorder.record_envelopes(conn, envelopes).await
        }

        fn manager(url: &str, config: ManagerConfig<Self>) -> Self::Manager {
            AsyncDieselConnectionManager::new_with_config(url, config)
        }
        const BACKEND: &'static str = "MariaDB";

        async fn begin(&mut self) -> QueryResult<()> {
            AnsiTransactionManager::begin_transaction_sql(self, BEGIN).await
        }

        async fn rollback(&mut self) -> QueryResult<()> {
            AnsiTransactionManager::rollback_transaction(self).await
        }

        fn transaction_status(&mut self) -> &mut TransactionManagerStatus {
            AnsiTransactionManager::transaction_manager_status_mut(self)
        }

        async fn commit_checked(&mut self) -> Result<(), Error> {
            if let Err(error) = self.batch_execute(PROBE_AND_COMMIT).await {
                // MySQL's error codes do not survive diesel-async (only the
                // message does): 1305 reads "SAVEPOINT outbox_tx does not
                // exist".
                let lost = matches!(
                    &error,
                    diesel::result::Error::DatabaseError(_, info)
                        if info.message().contains("outbox_tx")
                );
                if !lost {
                    return Err(Error::Database(error));
                }
                // No savepoint: either the server rolled the transaction
                // back, or it was not begun by `begin` (a plain `BEGIN`).
                let open: Result<Vec<Open>, _> =
                    diesel_async::RunQueryDsl::load(diesel::sql_query(OPEN), self).await;
                let still_open = matches!(open.as_deref(), Ok([Open { open: 1 }]));
                return Err(Error::NotCommitted {
                    reason: if still_open {
                        "the transaction was not begun by outbox_diesel::begin_top_level (or \
                         Transaction::begin), whose savepoint the MariaDB commit checks; it is \
                         still open, nothing of it is committed: begin it with \
                         begin_top_level, or commit it yourself"
                    } else {
                        "MariaDB rolled the transaction back before the commit (a deadlock, \
                         or a lock wait timeout with innodb_rollback_on_timeout), and the \
                         code went on as if it had not (e.g. a handler that caught the \
                         database error and still returned success): what ran before is \
                         rolled back, but statements run after it were committed one by one \
                         (autocommit), except this library's own inserts (events, inbox \
                         entries), which refuse to run outside a transaction. Fail when a \
                         statement fails, and retry the whole transaction after a deadlock"
                    }
                    .into(),
                    source: Some(error),
                });
            }
            left_transaction(self.transaction_status())
        }
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use diesel::SqliteConnection;
    use diesel::connection::SimpleConnection as _;
    use diesel_async::sync_connection_wrapper::{
        SyncConnectionWrapper, SyncTransactionManagerWrapper,
    };

    use super::*;

    type Manager = SyncTransactionManagerWrapper<diesel::connection::AnsiTransactionManager>;

    /// Takes the write lock at once (see [`Connection`]), and writes a
    /// marker row in a temporary table: SQLite rolls it back with the
    /// transaction, whatever starts a transaction afterwards (a nested
    /// `transaction(..)`'s `SAVEPOINT` does, in autocommit).
    ///
    /// The marker cannot be committed by anything but
    /// [`PROBE_AND_COMMIT`], which deletes it first: it references a row
    /// that never exists, checked at commit (a deferred foreign key), so a
    /// plain `COMMIT` (diesel's own, of a transaction begun here) fails
    /// instead of leaving a marker behind on the connection, where it would
    /// vouch for a later transaction that SQLite rolled back. Foreign keys
    /// must be on (`connect` and `pool` set it): checked first.
    pub(crate) const BEGIN: &str = "SELECT CASE WHEN (SELECT foreign_keys FROM pragma_foreign_keys) \
        = 1 THEN 1 ELSE json('outbox: PRAGMA foreign_keys must be ON') END; \
        BEGIN IMMEDIATE; \
        CREATE TEMP TABLE IF NOT EXISTS outbox_tx_never (x INTEGER PRIMARY KEY); \
        CREATE TEMP TABLE IF NOT EXISTS outbox_tx_open \
          (x INTEGER REFERENCES outbox_tx_never (x) DEFERRABLE INITIALLY DEFERRED); \
        INSERT INTO temp.outbox_tx_open VALUES (1)";
    /// Fails (a malformed-JSON error, or "no such table" when even the
    /// table went with the rollback) before the `COMMIT` when the marker is
    /// gone: SQLite rolled the transaction back.
    pub(crate) const PROBE_AND_COMMIT: &str = "SELECT CASE WHEN EXISTS \
        (SELECT 1 FROM temp.outbox_tx_open) THEN 1 ELSE json('outbox: transaction lost') END; \
        DELETE FROM temp.outbox_tx_open; COMMIT";
    /// Whether the marker of [`BEGIN`] is there (`open`: 0 or 1).
    const MARKED: &str = "SELECT EXISTS (SELECT 1 FROM temp.outbox_tx_open) AS open";

    #[derive(diesel::QueryableByName)]
    struct Open {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        open: i32,
    }

    impl sealed::Sealed for SyncConnectionWrapper<SqliteConnection> {}
    as_itself!(SyncConnectionWrapper<SqliteConnection>);

    impl Connection for SyncConnectionWrapper<SqliteConnection> {
        type Manager = AsyncDieselConnectionManager<Self>;
        type Recorder = crate::sqlite::SqliteOutbox;

        async fn record_envelopes(
            recorder: &Self::Recorder,
            conn: &mut Self,
            envelopes: &[outbox_core::EventEnvelope],
        ) -> Result<(), Error> {
            recorder.record_envelopes(conn, envelopes).await
        }

        fn manager(url: &str, config: ManagerConfig<Self>) -> Self::Manager {
            AsyncDieselConnectionManager::new_with_config(url, config)
        }
        const BACKEND: &'static str = "SQLite";

        async fn begin(&mut self) -> QueryResult<()> {
            self.spawn_blocking(|conn| {
                let begun =
                    diesel::connection::AnsiTransactionManager::begin_transaction_sql(conn, BEGIN);
                if begun.is_err() {
                    // `BEGIN IMMEDIATE` may have run before a later statement
                    // of the batch failed: a write transaction diesel does
                    // not know of, which would keep the file's write lock.
                    let _ = conn.batch_execute("ROLLBACK");
                }
                begun
            })
            .await
        }

        async fn rollback(&mut self) -> QueryResult<()> {
            Manager::rollback_transaction(self).await
        }

        fn transaction_status(&mut self) -> &mut TransactionManagerStatus {
            Manager::transaction_manager_status_mut(self)
        }

        async fn commit_checked(&mut self) -> Result<(), Error> {
            if let Err(error) = self.batch_execute(PROBE_AND_COMMIT).await {
                let lost = matches!(
                    &error,
                    diesel::result::Error::DatabaseError(_, info)
                        if info.message().contains("malformed JSON")
                            || info.message().contains("outbox_tx_open")
                            || info.message().contains("no transaction is active")
                );
                return Err(if lost {
                    Error::NotCommitted {
                        reason: "SQLite rolled the transaction back before the commit (an \
                                 error such as SQLITE_FULL, SQLITE_IOERR, SQLITE_BUSY or an \
                                 interrupt, or RAISE(ROLLBACK) in a trigger), and the code went \
                                 on as if it had not (e.g. a handler that caught the database \
                                 error and still returned success): what ran before is rolled \
                                 back, statements run after it may have been committed one by \
                                 one (autocommit), except this library's own inserts, which \
                                 refuse to run then. Or the transaction was not begun by \
                                 begin_top_level (or a Transaction), whose marker this commit \
                                 checks. Fail when a statement fails"
                            .into(),
                        source: Some(error),
                    }
                } else {
                    Error::Database(error)
                });
            }
            left_transaction(self.transaction_status())
        }
    }

    /// Runs `query` on `conn` only if SQLite still has the transaction
    /// diesel counts open; returns its row count, or `None` (nothing run)
    /// when it does not, where the insert would commit on its own.
    ///
    /// A transaction begun by this crate carries a marker row ([`BEGIN`]),
    /// which SQLite rolls back with the transaction: present, the
    /// transaction is the one begun. Without it (an application's own
    /// `immediate_transaction`), at diesel depth 1 the probe is a `BEGIN`,
    /// which fails inside a transaction ("cannot start a transaction within
    /// a transaction") and succeeds in autocommit (rolled back at once);
    /// deeper, a `SAVEPOINT` run after a rollback would have started a new
    /// transaction that the probe cannot tell from the old one, so nothing
    /// is run. All in one task on the blocking thread that holds the
    /// connection, so nothing runs in between.
    pub(crate) async fn execute_if_open<Q>(
        conn: &mut SyncConnectionWrapper<SqliteConnection>,
        query: Q,
    ) -> QueryResult<Option<usize>>
    where
        Q: diesel::RunQueryDsl<SqliteConnection>
            + diesel::query_dsl::methods::ExecuteDsl<SqliteConnection>
            + Send
            + 'static,
    {
        let depth = Manager::transaction_manager_status_mut(conn)
            .transaction_depth()
            .ok()
            .flatten()
            .map(std::num::NonZeroU32::get);
        conn.spawn_blocking(move |conn: &mut SqliteConnection| {
            let marked =
                match diesel::RunQueryDsl::get_result::<Open>(diesel::sql_query(MARKED), conn) {
                    Ok(row) => row.open == 1,
                    Err(diesel::result::Error::DatabaseError(_, info))
                        if info.message().contains("no such table") =>
                    {
                        false
                    }
                    Err(error) => return Err(error),
                };
            if !marked {
                if depth != Some(1) {
                    return Ok(None);
                }
                match conn.batch_execute("BEGIN") {
                    Err(diesel::result::Error::DatabaseError(_, info))
                        if info.message().contains("within a transaction") => {}
                    Err(error) => return Err(error),
                    Ok(()) => {
                        conn.batch_execute("ROLLBACK")?;
                        return Ok(None);
                    }
                }
            }
            diesel::RunQueryDsl::execute(query, conn).map(Some)
        })
        .await
    }
}

#[cfg(feature = "sqlite")]
pub(crate) use sqlite::execute_if_open as sqlite_execute_if_open;
