//! The request's transaction: [`Tx`], and how the layer opens, commits and
//! rolls it back.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use std::any::Any;

use axum::extract::FromRequestParts;
use diesel_async::AsyncPgConnection;
use http::request::Parts;
use outbox_core::EventEnvelope;
use outbox_diesel::Connection;
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard};

use crate::TxRejection;
use crate::layer::Config;
use crate::source::Lent;

/// The request's database transaction, on a pooled connection.
///
/// Extracting `Tx` takes a connection from the layer's pool and runs
/// `BEGIN` (lazily: requests whose handler does not extract it never touch
/// the pool). Use it wherever diesel-async wants a connection: it
/// dereferences to [`AsyncPgConnection`], so both `&mut tx` and `&mut *tx`
/// work with `diesel_async::RunQueryDsl`, and `&mut tx` coerces to
/// `&mut AsyncPgConnection` for functions that take one.
///
/// Do not commit it yourself: the layer writes the staged events and commits
/// after the handler returned a success response, and rolls back otherwise
/// (see the crate docs). `conn.transaction(..)` on it opens a savepoint.
///
/// There is one transaction per request. Extracting a second `Tx` while the
/// first is alive is rejected with a `500` ([`TxRejection::AlreadyExtracted`])
/// rather than waiting for itself forever; a middleware may extract it,
/// drop it, and the handler extract it again: both see the same transaction.
/// Do not move it into a spawned task or the response body: the layer
/// cannot commit a transaction it cannot get back, and answers `500`.
pub struct Tx<C: Connection = AsyncPgConnection> {
    guard: OwnedMappedMutexGuard<TxState, C>,
}

impl<C: Connection> fmt::Debug for Tx<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tx").finish_non_exhaustive()
    }
}

impl<C: Connection> outbox_diesel::AsConnection for Tx<C> {
    type Conn = C;

    fn as_connection(&mut self) -> &mut C {
        &mut self.guard
    }
}

impl<C: Connection> Deref for Tx<C> {
    type Target = C;

    fn deref(&self) -> &C {
        &self.guard
    }
}

impl<C: Connection> DerefMut for Tx<C> {
    fn deref_mut(&mut self) -> &mut C {
        &mut self.guard
    }
}

impl<S: Send + Sync, C: Connection> FromRequestParts<S> for Tx<C> {
    type Rejection = TxRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let cell = parts
            .extensions
            .get::<TxCell>()
            .cloned()
            .ok_or(TxRejection::MissingLayer)?;
        cell.open().await
    }
}

/// The per-request slot holding the transaction once it is open.
#[derive(Clone)]
pub(crate) struct TxCell {
    state: Arc<Mutex<TxState>>,
    config: Arc<Config>,
}

pub(crate) enum TxState {
    /// No handler asked for a transaction yet.
    Idle,
    /// `BEGIN` ran; not yet finished.
    Open(Held),
    /// Committed, rolled back or handed to the layer for that.
    Finished,
}

/// The slot was locked: a `Tx` is still alive after the handler returned.
#[derive(Debug)]
pub(crate) struct TxStillBorrowed;

impl TxCell {
    pub(crate) fn new(config: Arc<Config>) -> Self {
        TxCell {
            state: Arc::new(Mutex::new(TxState::Idle)),
            config,
        }
    }

    /// The extractor: the open transaction, beginning it if needed.
    async fn open<C: Connection>(&self) -> Result<Tx<C>, TxRejection> {
        let mut guard: OwnedMutexGuard<TxState> = Arc::clone(&self.state)
            .try_lock_owned()
            .map_err(|_| TxRejection::AlreadyExtracted)?;
        if matches!(*guard, TxState::Idle) {
            // Cancelled here, the `Held` being built is dropped and closes
            // its connection; the slot stays `Idle`.
            let held = Held::begin(&self.config).await?;
            *guard = TxState::Open(held);
        }
        let found = match &*guard {
            TxState::Open(held) => held.connection_type(),
            _ => return Err(TxRejection::Finished),
        };
        OwnedMutexGuard::try_map(guard, |state| match state {
            TxState::Open(held) => held.conn().and_then(|conn| conn.downcast_mut::<C>()),
            _ => None,
        })
        .map(|guard| Tx { guard })
        .map_err(|_| TxRejection::WrongConnection {
            wanted: std::any::type_name::<C>(),
            found,
        })
    }

    /// For the layer: takes the transaction (if one was opened) and marks
    /// the slot finished, so no later extraction can open another.
    pub(crate) fn take(&self) -> Result<Option<Held>, TxStillBorrowed> {
        let mut state = self.state.try_lock().map_err(|_| TxStillBorrowed)?;
        Ok(match std::mem::replace(&mut *state, TxState::Finished) {
            TxState::Open(held) => Some(held),
            TxState::Idle | TxState::Finished => None,
        })
    }
}

/// A connection inside an open transaction. Dropping it (a cancelled
/// request, a panic, an error on the way) discards the connection through
/// its source, which closes it: PostgreSQL then rolls back and releases the
/// locks at once, and no pooled connection is ever left inside `BEGIN`.
pub(crate) struct Held {
    // `Some` until `commit` or `rollback` returns it to its source.
    lent: Option<Box<dyn Lent>>,
}

impl Held {
    /// Takes a connection and runs `BEGIN`, within the acquire timeout.
    pub(crate) async fn begin(config: &Config) -> Result<Held, TxRejection> {
        let unavailable = |reason: String| TxRejection::Unavailable {
            reason,
            retry_after: config.retry_after,
        };
        let begin = async {
            let lent = config
                .source
                .acquire()
                .await
                .map_err(|e| unavailable(format!("no database connection: {e}")))?;
            // Guarded from here on: if `BEGIN` is cancelled or fails, the
            // connection is closed, not pooled.
            let mut held = Held { lent: Some(lent) };
            if let Some(lent) = held.lent.as_mut() {
                lent.begin()
                    .await
                    .map_err(|e| unavailable(format!("BEGIN failed: {e}")))?;
            }
            Ok(held)
        };
        tokio::time::timeout(config.acquire_timeout, begin)
            .await
            .map_err(|_| {
                unavailable(format!(
                    "no database connection within {:?} (pool exhausted or database down)",
                    config.acquire_timeout
                ))
            })?
    }

    pub(crate) fn conn(&mut self) -> Option<&mut (dyn Any + Send)> {
        self.lent.as_mut().map(|lent| lent.conn())
    }

    fn connection_type(&self) -> &'static str {
        self.lent
            .as_ref()
            .map_or("none", |lent| lent.connection_type())
    }

    /// Writes `envelopes` (one `INSERT`, none if empty) and commits with
    /// [`outbox_diesel::commit_top_level`]: only a real top-level `COMMIT`
    /// of a healthy transaction counts (not a savepoint release left by a
    /// cancelled nested transaction, nor the silent rollback of an aborted
    /// one). On any error the connection is discarded; the outcome of a
    /// `COMMIT` that fails mid-way is PostgreSQL's (committed or rolled
    /// back, never half).
    pub(crate) async fn commit(
        mut self,
        recorder: Option<&(dyn Any + Send + Sync)>,
        envelopes: &[EventEnvelope],
    ) -> Result<(), outbox_diesel::Error> {
        if let Some(lent) = self.lent.as_mut() {
            lent.commit(recorder, envelopes).await?;
        }
        // Back to the pool, outside any transaction.
        drop(self.lent.take());
        Ok(())
    }

    pub(crate) async fn rollback(mut self) {
        if let Some(lent) = self.lent.as_mut() {
            if !lent.in_top_level() {
                tracing::warn!(
                    "a nested transaction (savepoint) of the request is still open (its \
                     future was dropped mid-way); closing the connection to roll back"
                );
                return; // `self` is dropped: discarded
            }
            if let Err(error) = lent.rollback().await {
                tracing::warn!(%error, "ROLLBACK failed; closing the connection instead");
                return;
            }
        }
        drop(self.lent.take());
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(lent) = self.lent.take() {
            lent.discard();
        }
    }
}
