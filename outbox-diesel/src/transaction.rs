//! [`Transaction`] ([`PgTransaction`] on PostgreSQL): a pooled connection
//! with an open transaction that rolls back (by closing the connection) when dropped; and
//! [`commit_top_level`], the one checked commit every transaction this
//! workspace finishes goes through.

use std::ops::{Deref, DerefMut};

use deadpool::managed::{Object, Pool};

use crate::{AsConnection, Connection, Error, Result};

/// [`Transaction`] on PostgreSQL.
#[cfg(feature = "postgres")]
pub type PgTransaction = Transaction<diesel_async::AsyncPgConnection>;

/// [`Transaction`] on MariaDB/MySQL.
#[cfg(feature = "mysql")]
pub type MysqlTransaction = Transaction<diesel_async::AsyncMysqlConnection>;

/// [`Transaction`] on SQLite (begun with `BEGIN IMMEDIATE`).
#[cfg(feature = "sqlite")]
pub type SqliteTransaction = Transaction<crate::sqlite::AsyncSqliteConnection>;

/// Begins a top-level transaction on `conn` the way [`commit_top_level`]
/// expects it: `BEGIN` on PostgreSQL; on MariaDB/MySQL `BEGIN` and a
/// savepoint whose loss tells the commit that the server rolled the
/// transaction back; on SQLite `BEGIN IMMEDIATE`, which takes the write
/// lock at once, waiting up to the connection's `busy_timeout` (see
/// [`Connection`]).
///
/// # Errors
/// [`Error::Database`] if `BEGIN` fails. With a transaction already open
/// PostgreSQL opens a savepoint instead (which the commit then refuses as
/// nested), and MariaDB fails.
pub async fn begin_top_level<A: AsConnection>(conn: &mut A) -> Result<()> {
    conn.as_connection().begin().await?;
    Ok(())
}

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
/// then (on PostgreSQL) sends `SELECT 1; COMMIT` as one message: the `SELECT 1` fails in an
/// aborted transaction and the `COMMIT` is then skipped. Cost: no extra
/// round trip, one trivial statement parsed and run by the server (about
/// 10 µs; measured in the crate docs, "Checked commits").
///
/// On MariaDB/MySQL the transaction must have been begun by
/// [`begin_top_level`] (or [`Transaction::begin`]): the commit probes the
/// savepoint it opens (see [`Connection`]). On SQLite the `COMMIT` is its
/// own probe: it fails when SQLite has rolled the transaction back.
///
/// The Axum layer, [`Transaction::commit`] (the inbox consumer's and the
/// relay's transactions) use it. Call it yourself where you hold a
/// transaction open across API boundaries. After an error the connection
/// may still be inside the (aborted or nested) transaction: close it
/// rather than pooling it (deadpool: `Object::take`), which rolls back.
///
/// ```no_run
/// use diesel_async::AsyncPgConnection;
///
/// # async fn run(conn: &mut AsyncPgConnection) -> Result<(), outbox_diesel::Error> {
/// outbox_diesel::begin_top_level(conn).await?;
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
pub async fn commit_top_level<A: AsConnection>(conn: &mut A) -> Result<()> {
    commit(conn.as_connection()).await
}

/// [`commit_top_level`] of a connection.
pub(crate) async fn commit<C: Connection>(conn: &mut C) -> Result<()> {
    let status = conn.transaction_status();
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
    conn.commit_checked().await
}

/// A transaction on a pooled connection, held across `await`s and API
/// boundaries (a relay's claim, an inbox consumer's handler).
///
/// Use it as a `&mut C` (it dereferences to the connection, e.g.
/// `AsyncPgConnection`). Finish it
/// with [`commit`](Self::commit) or [`rollback`](Self::rollback); if it is
/// dropped instead (an error, a panic, a cancelled future), the connection is
/// closed rather than returned to the pool, so PostgreSQL rolls the
/// transaction back at once and no pooled connection is left inside it.
///
/// A transaction whose own statements (this crate's, e.g. the inbox entry
/// of [`PgInboxDatabase`](crate::PgInboxDatabase)) were answered
/// "read-only" ([`Error::is_read_only`]: a standby, a fenced old primary)
/// closes its connection on [`rollback`](Self::rollback) too, so the pool's
/// next connection goes to a server that takes writes.
pub struct Transaction<C: Connection> {
    // `Some` from `begin` until `commit`, `rollback` or drop, all of which
    // consume `self`: every `&self` method sees `Some`.
    conn: Option<Object<C::Manager>>,
    /// Set when a statement of this crate on it was answered "read-only":
    /// the connection is closed, never pooled again.
    read_only: bool,
}

impl<C: Connection> std::fmt::Debug for Transaction<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction")
            .field("backend", &C::BACKEND)
            .field("open", &self.conn.is_some())
            .field("read_only", &self.read_only)
            .finish()
    }
}

impl<C: Connection> Transaction<C> {
    /// Takes a connection from `pool` and opens a transaction on it.
    ///
    /// # Errors
    /// [`Error::Pool`] or [`Error::Database`].
    pub async fn begin(pool: &Pool<C::Manager>) -> Result<Self> {
        // Held by the transaction before `BEGIN` is sent: if `BEGIN` fails
        // or its future is dropped (cancelled while it waits for a lock,
        // e.g. SQLite's write lock), `Drop` closes the connection instead
        // of pooling it inside a transaction.
        let conn = pool.get().await.map_err(Error::Pool)?;
        let mut tx = Transaction {
            conn: Some(conn),
            read_only: false,
        };
        if let Some(conn) = tx.conn.as_mut() {
            Connection::begin(&mut **conn).await?;
        }
        Ok(tx)
    }

    /// As [`begin`](Self::begin), with `sql` (a simple-query batch that
    /// starts with `BEGIN`, e.g. followed by `SET LOCAL`s) in the one round
    /// trip.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) async fn begin_with(pool: &Pool<C::Manager>, sql: &str) -> Result<Self>
    where
        C: diesel_async::AsyncConnection<TransactionManager = diesel_async::AnsiTransactionManager>,
    {
        let conn = pool.get().await.map_err(Error::Pool)?;
        let mut tx = Transaction {
            conn: Some(conn),
            read_only: false,
        };
        if let Some(conn) = tx.conn.as_mut() {
            diesel_async::AnsiTransactionManager::begin_transaction_sql(&mut **conn, sql).await?;
        }
        Ok(tx)
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
        // The connection stays in `self` while the commit is awaited: if the
        // future is dropped there, `Drop` closes it (never pooled inside a
        // transaction).
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        let committed = commit(&mut **conn).await;
        self.finish(committed)
    }

    /// Gives the connection back to the pool after `outcome` succeeded;
    /// closes it otherwise.
    fn finish(&mut self, outcome: Result<()>) -> Result<()> {
        if let Some(conn) = self.conn.take()
            && outcome.is_err()
        {
            drop(Object::take(conn));
        }
        outcome
    }

    /// [`commit`](Self::commit), then `after` (a batch that resets what the
    /// transaction's `begin_with` set for the session) before the
    /// connection goes back to the pool. If `after` fails the connection is
    /// closed instead; the commit stands.
    ///
    /// # Errors
    /// As [`commit`](Self::commit); [`Error::Database`] if `after` fails.
    #[cfg(feature = "mysql")]
    pub(crate) async fn commit_then(mut self, after: &str) -> Result<()> {
        use diesel_async::SimpleAsyncConnection as _;
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        let mut outcome = commit(&mut **conn).await;
        if outcome.is_ok() {
            outcome = conn.batch_execute(after).await.map_err(Error::from);
        }
        self.finish(outcome)
    }

    /// Notes `result` of a statement run on this transaction: a read-only
    /// answer makes [`rollback`](Self::rollback) close the connection.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn note<T>(&mut self, result: &Result<T>) {
        if let Err(error) = result
            && error.is_read_only()
        {
            self.read_only = true;
        }
    }

    /// Rolls back and returns the connection to the pool. If a nested
    /// transaction (savepoint) is still open on it, or the rollback fails,
    /// or a statement of this crate on it was answered "read-only", the
    /// connection is closed instead, which rolls back all of it.
    ///
    /// # Errors
    /// [`Error::Database`] if the rollback fails (the connection is closed).
    pub async fn rollback(mut self) -> Result<()> {
        let read_only = self.read_only;
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        if read_only {
            // A standby or a fenced old primary: not to be pooled again.
            tracing::warn!(
                "the database is read-only (a standby?): closing the connection; new ones go \
                 to a server that takes writes (target_session_attrs=read-write)"
            );
            let _ = self.finish(Err(Error::NoTransaction));
            return Ok(());
        }
        if !top_level(&mut **conn) {
            // `ROLLBACK` would only roll back to the innermost savepoint
            // and leave the transaction open: close the connection.
            let _ = self.finish(Err(Error::NoTransaction));
            return Ok(());
        }
        let rolled_back = conn.rollback().await.map_err(Error::from);
        self.finish(rolled_back)
    }
}

/// `true` if exactly one transaction is open on `conn` as diesel counts
/// (no nested transaction, i.e. savepoint, left open and the transaction
/// manager not broken): only then does a `ROLLBACK` through diesel end the
/// transaction. Otherwise roll back by closing the connection.
pub fn in_top_level_transaction<A: AsConnection>(conn: &mut A) -> bool {
    top_level(conn.as_connection())
}

/// [`in_top_level_transaction`] of a connection.
pub(crate) fn top_level<C: Connection>(conn: &mut C) -> bool {
    matches!(
        conn.transaction_status().transaction_depth(),
        Ok(Some(depth)) if depth.get() == 1
    )
}

impl<C: Connection> Deref for Transaction<C> {
    type Target = C;

    #[allow(clippy::expect_used)]
    fn deref(&self) -> &C {
        // Infallible: `conn` is `Some` for as long as `self` can be borrowed.
        self.conn.as_deref().expect("open transaction")
    }
}

impl<C: Connection> DerefMut for Transaction<C> {
    #[allow(clippy::expect_used)]
    fn deref_mut(&mut self) -> &mut C {
        // Infallible: `conn` is `Some` for as long as `self` can be borrowed.
        self.conn.as_deref_mut().expect("open transaction")
    }
}

impl<C: Connection> Drop for Transaction<C> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            // Still inside the transaction: close the connection instead of
            // pooling it, so PostgreSQL rolls back and releases locks now.
            drop(Object::take(conn));
        }
    }
}
