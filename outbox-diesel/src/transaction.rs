//! [`PgTransaction`]: a pooled connection with an open transaction that
//! rolls back (by closing the connection) when dropped.

use std::ops::{Deref, DerefMut};

use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::{AnsiTransactionManager, AsyncPgConnection, TransactionManager};

use crate::{Error, Result};

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
        let mut conn = pool.get().await.map_err(|e| Error::Pool(e.to_string()))?;
        AnsiTransactionManager::begin_transaction(&mut *conn).await?;
        Ok(PgTransaction { conn: Some(conn) })
    }

    /// As [`begin`](Self::begin), with `sql` (a simple-query batch that
    /// starts with `BEGIN`, e.g. followed by `SET LOCAL`s) in the one round
    /// trip.
    pub(crate) async fn begin_with(pool: &Pool<AsyncPgConnection>, sql: &str) -> Result<Self> {
        let mut conn = pool.get().await.map_err(|e| Error::Pool(e.to_string()))?;
        AnsiTransactionManager::begin_transaction_sql(&mut *conn, sql).await?;
        Ok(PgTransaction { conn: Some(conn) })
    }

    /// Commits and returns the connection to the pool.
    ///
    /// # Errors
    /// [`Error::Database`] if the commit fails (the transaction is then
    /// rolled back by PostgreSQL).
    pub async fn commit(mut self) -> Result<()> {
        if let Some(mut conn) = self.conn.take()
            && let Err(err) = AnsiTransactionManager::commit_transaction(&mut *conn).await
        {
            drop(Object::take(conn));
            return Err(err.into());
        }
        Ok(())
    }

    /// Rolls back and returns the connection to the pool.
    ///
    /// # Errors
    /// [`Error::Database`] if the rollback fails (the connection is closed).
    pub async fn rollback(mut self) -> Result<()> {
        if let Some(mut conn) = self.conn.take()
            && let Err(err) = AnsiTransactionManager::rollback_transaction(&mut *conn).await
        {
            drop(Object::take(conn));
            return Err(err.into());
        }
        Ok(())
    }
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
