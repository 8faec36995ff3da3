//! [`PgTransaction`]: a pooled connection with an open transaction that
//! rolls back (by closing the connection) when dropped; and
//! [`commit_top_level`], the one checked commit every transaction this
//! workspace finishes goes through.

use std::ops::{Deref, DerefMut};

use diesel::connection::{TransactionDepthChange, TransactionManagerStatus};
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::{
    AnsiTransactionManager, AsyncConnection, AsyncPgConnection, SimpleAsyncConnection,
    TransactionManager,
};

use crate::sql::{PROBE, PROBE_AND_COMMIT};
use crate::{Error, Result};

/// Commits the transaction open on `conn`, but only if that is a real
/// top-level `COMMIT` of a healthy transaction; otherwise commits nothing and
/// returns [`Error::NotCommitted`] with what went wrong.
///
/// `AnsiTransactionManager::commit_transaction` (and so a plain
/// `COMMIT` through diesel) does not guarantee that:
/// - when a nested `conn.transaction(..)` was cancelled mid-way (its
///   future dropped by a timeout or `select!`), diesel's depth stays above
///   1 and a "commit" only releases a savepoint, leaving the transaction
///   open;
/// - when a statement failed and the caller went on anyway (caught the
///   error and returned success), PostgreSQL has aborted the transaction
///   and turns `COMMIT` into `ROLLBACK` *without an error*.
///
/// This checks diesel's transaction depth is exactly 1 (no round trip),
/// then sends `SELECT 1; COMMIT` as one message: the `SELECT 1` fails in an
/// aborted transaction and the `COMMIT` is then skipped. Cost: no extra
/// round trip, one trivial statement parsed and run by the server (about
/// 10 µs; measured in the crate docs, "Checked commits").
///
/// The Axum layer, [`PgTransaction::commit`] (the inbox consumer's and the
/// relay's transactions) use it. Call it yourself where you hold a
/// transaction open across API boundaries. After an error the connection
/// may still be inside the (aborted or nested) transaction: close it
/// rather than pooling it (deadpool: `Object::take`), which rolls back.
///
/// ```no_run
/// use diesel_async::{AnsiTransactionManager, AsyncPgConnection, TransactionManager};
///
/// # async fn run(conn: &mut AsyncPgConnection) -> Result<(), outbox_diesel::Error> {
/// AnsiTransactionManager::begin_transaction(conn).await?;
/// // ... the business change and `outbox_diesel::record(conn, ..)` ...
/// outbox_diesel::commit_top_level(conn).await?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::NotCommitted`] if no transaction is open, a nested one
/// (savepoint) is still open, diesel's transaction manager is broken, or
/// the transaction is aborted: nothing was committed. [`Error::Database`]
/// if the `COMMIT` itself fails (e.g. a deferred constraint): PostgreSQL has
/// rolled the transaction back.
pub async fn commit_top_level(conn: &mut AsyncPgConnection) -> Result<()> {
    let status = AnsiTransactionManager::transaction_manager_status_mut(conn);
    match status.transaction_depth() {
        Ok(Some(depth)) if depth.get() == 1 => {}
        Ok(Some(depth)) => {
            let nested = depth.get() - 1;
            return Err(Error::NotCommitted {
                reason: format!(
                    "{nested} nested transaction(s) (savepoints) still open: a \
                     `transaction(..)` future on this connection was dropped before it \
                     finished (cancelled by a timeout, `select!` or an early return), so its \
                     work may be half done; await nested transactions to the end, or fail \
                     when one is cancelled"
                ),
                source: None,
            });
        }
        Ok(None) => {
            return Err(Error::NotCommitted {
                reason: "no transaction is open on the connection (was it committed or \
                         rolled back by hand?)"
                    .into(),
                source: None,
            });
        }
        Err(source) => {
            return Err(Error::NotCommitted {
                reason: "diesel's transaction manager is broken (an earlier COMMIT or \
                         ROLLBACK failed)"
                    .into(),
                source: Some(source),
            });
        }
    }
    if let Err(error) = conn.batch_execute(PROBE_AND_COMMIT).await {
        return Err(classify_failed_commit(conn, error).await);
    }
    // The server left the transaction; tell diesel.
    if let TransactionManagerStatus::Valid(valid) =
        AnsiTransactionManager::transaction_manager_status_mut(conn)
    {
        valid.change_transaction_depth(TransactionDepthChange::DecreaseDepth)?;
    }
    Ok(())
}

/// Which statement of [`PROBE_AND_COMMIT`] failed. Runs on the failure path
/// only: a transaction that the probe found aborted is still open, so a
/// second probe fails again; after a failed `COMMIT` the session is outside
/// any transaction and it succeeds. (The SQLSTATE would say it directly, but
/// diesel does not expose it.)
async fn classify_failed_commit(
    conn: &mut AsyncPgConnection,
    error: diesel::result::Error,
) -> Error {
    use diesel::result::{DatabaseErrorKind, Error as Diesel};
    match conn.batch_execute(PROBE).await {
        Err(Diesel::DatabaseError(DatabaseErrorKind::Unknown, _)) => Error::NotCommitted {
            reason: "the transaction was aborted by an earlier statement that failed, and \
                     the code went on as if it had not (e.g. a handler that caught a database \
                     error and still returned success); PostgreSQL rolls such a transaction \
                     back at COMMIT. Fail when a statement fails, or run a statement that may \
                     fail in a nested `transaction(..)` (a savepoint), which rolls back only \
                     that statement"
                .into(),
            source: Some(error),
        },
        // `COMMIT` failed (the transaction is over, rolled back), or the
        // connection is gone.
        _ => Error::Database(error),
    }
}

/// A transaction on a pooled connection, held across `await`s and API
/// boundaries (a relay's claim, an inbox consumer's handler).
///
/// Use it as a `&mut AsyncPgConnection` (it dereferences to one). Finish it
/// with [`commit`](Self::commit) or [`rollback`](Self::rollback); if it is
/// dropped instead (an error, a panic, a cancelled future), the connection is
/// closed rather than returned to the pool, so PostgreSQL rolls the
/// transaction back at once and no pooled connection is left inside it.
pub struct PgTransaction {
    // `Some` from `begin` until `commit`, `rollback` or drop, all of which
    // consume `self`: every `&self` method sees `Some`.
    conn: Option<Object<AsyncPgConnection>>,
}

impl std::fmt::Debug for PgTransaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTransaction")
            .field("open", &self.conn.is_some())
            .finish()
    }
}

impl PgTransaction {
    /// Takes a connection from `pool` and opens a transaction on it.
    ///
    /// # Errors
    /// [`Error::Pool`] or [`Error::Database`].
    pub async fn begin(pool: &Pool<AsyncPgConnection>) -> Result<Self> {
        let mut conn = pool.get().await.map_err(Error::Pool)?;
        AnsiTransactionManager::begin_transaction(&mut *conn).await?;
        Ok(PgTransaction { conn: Some(conn) })
    }

    /// As [`begin`](Self::begin), with `sql` (a simple-query batch that
    /// starts with `BEGIN`, e.g. followed by `SET LOCAL`s) in the one round
    /// trip.
    pub(crate) async fn begin_with(pool: &Pool<AsyncPgConnection>, sql: &str) -> Result<Self> {
        let mut conn = pool.get().await.map_err(Error::Pool)?;
        AnsiTransactionManager::begin_transaction_sql(&mut *conn, sql).await?;
        Ok(PgTransaction { conn: Some(conn) })
    }

    /// Commits with [`commit_top_level`] and returns the connection to the
    /// pool. If the commit is refused or fails, nothing is committed and the
    /// connection is closed instead (so no pooled connection is left inside
    /// a transaction).
    ///
    /// # Errors
    /// [`Error::NotCommitted`] if a nested transaction (savepoint) opened on
    /// it is still open or the transaction is aborted (a statement failed and
    /// the caller went on): the transaction is rolled back.
    /// [`Error::Database`] if the `COMMIT` fails (PostgreSQL rolls back).
    pub async fn commit(mut self) -> Result<()> {
        if let Some(mut conn) = self.conn.take()
            && let Err(err) = commit_top_level(&mut conn).await
        {
            drop(Object::take(conn));
            return Err(err);
        }
        Ok(())
    }

    /// Rolls back and returns the connection to the pool. If a nested
    /// transaction (savepoint) is still open on it, or the rollback fails,
    /// the connection is closed instead, which rolls back all of it.
    ///
    /// # Errors
    /// [`Error::Database`] if the rollback fails (the connection is closed).
    pub async fn rollback(mut self) -> Result<()> {
        if let Some(mut conn) = self.conn.take() {
            if !in_top_level_transaction(&mut conn) {
                // `ROLLBACK` would only roll back to the innermost
                // savepoint and leave the transaction open.
                drop(Object::take(conn));
                return Ok(());
            }
            if let Err(err) = AnsiTransactionManager::rollback_transaction(&mut *conn).await {
                drop(Object::take(conn));
                return Err(err.into());
            }
        }
        Ok(())
    }
}

/// `Ok` if a transaction (diesel-managed, any depth) is open on `conn`:
/// what recording and the inbox require, so that they never autocommit.
///
/// # Errors
/// [`Error::NoTransaction`] when none is open; [`Error::Database`] when
/// diesel's transaction manager is broken.
pub(crate) fn in_transaction(conn: &mut AsyncPgConnection) -> Result<()> {
    let status =
        <AsyncPgConnection as AsyncConnection>::TransactionManager::transaction_manager_status_mut(
            conn,
        );
    match status.transaction_depth()? {
        Some(_) => Ok(()),
        None => Err(Error::NoTransaction),
    }
}

/// `true` if exactly one transaction is open on `conn` as diesel counts
/// (no nested transaction, i.e. savepoint, left open and the transaction
/// manager not broken): only then does a `ROLLBACK` through diesel end the
/// transaction. Otherwise roll back by closing the connection.
pub fn in_top_level_transaction(conn: &mut AsyncPgConnection) -> bool {
    matches!(
        <AsyncPgConnection as AsyncConnection>::TransactionManager::transaction_manager_status_mut(
            conn
        )
        .transaction_depth(),
        Ok(Some(depth)) if depth.get() == 1
    )
}

impl Deref for PgTransaction {
    type Target = AsyncPgConnection;

    #[allow(clippy::expect_used)]
    fn deref(&self) -> &AsyncPgConnection {
        // Infallible: `conn` is `Some` for as long as `self` can be borrowed.
        self.conn.as_deref().expect("open transaction")
    }
}

impl DerefMut for PgTransaction {
    #[allow(clippy::expect_used)]
    fn deref_mut(&mut self) -> &mut AsyncPgConnection {
        // Infallible: `conn` is `Some` for as long as `self` can be borrowed.
        self.conn.as_deref_mut().expect("open transaction")
    }
}

impl Drop for PgTransaction {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // Still inside the transaction: close the connection instead of
            // pooling it, so PostgreSQL rolls back and releases locks now.
            drop(Object::take(conn));
        }
    }
}
