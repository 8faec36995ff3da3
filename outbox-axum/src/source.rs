//! Where request transactions get their connection: [`ConnectionSource`],
//! implemented for diesel-async's deadpool pool.

use std::fmt;
use std::future::Future;
use std::ops::DerefMut;

use std::any::Any;

use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use futures_util::future::BoxFuture;
use outbox_core::EventEnvelope;
use outbox_diesel::Connection;

/// The error type a [`ConnectionSource`] reports.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A source of database connections for request transactions: a pool.
///
/// Its connections dereference to one of `outbox-diesel`'s connection types
/// (`AsyncPgConnection`; `AsyncMysqlConnection` and SQLite's
/// `SyncConnectionWrapper<SqliteConnection>` with this crate's features
/// `mysql` and `sqlite`): the layer begins, records and commits the way
/// that back end needs (see `outbox_diesel::Connection`).
///
/// Implemented for diesel-async's deadpool
/// [`Pool<AsyncPgConnection>`](diesel_async::pooled_connection::deadpool::Pool),
/// the pool `outbox_diesel::pool` builds and the relay's store uses, so one
/// pool serves both. Deadpool is the default because its connections are
/// owned (`'static`) values that can be held across `await`s and moved
/// between the extractor and the layer, and because
/// deadpool's `Object::take` can detach a connection
/// from the pool: that is how a transaction interrupted mid-way (a dropped
/// request future, a panic, a failed `COMMIT`) is closed instead of being
/// returned to the pool still inside `BEGIN`.
///
/// Another pool (bb8, or a plain connection per request) plugs in by
/// implementing this trait. For bb8, return `Pool::get_owned()`'s
/// `PooledConnection<'static, _>`; bb8 already drops a connection whose
/// transaction is still open (diesel-async's `is_broken` check), so the
/// default [`discard`](Self::discard) is enough. A source that opens a fresh
/// connection for each request:
///
/// ```no_run
/// use diesel_async::AsyncPgConnection;
/// use outbox_axum::{BoxError, ConnectionSource, OutboxLayer};
///
/// #[derive(Debug)]
/// struct Direct(String);
///
/// impl ConnectionSource for Direct {
///     type Connection = Box<AsyncPgConnection>;
///
///     async fn connection(&self) -> Result<Self::Connection, BoxError> {
///         // `outbox_diesel::connect` honours `sslmode` and `sslrootcert`.
///         Ok(Box::new(outbox_diesel::connect(&self.0).await?))
///     }
///     // `discard` keeps its default: dropping the connection closes it.
/// }
///
/// let layer = OutboxLayer::new(Direct("postgres://postgres@127.0.0.1/app".into()));
/// # let _ = layer;
/// ```
pub trait ConnectionSource: Send + Sync + 'static {
    /// A connection lent by the source; dropping it gives it back.
    type Connection: DerefMut<Target: Connection> + Send + 'static;

    /// Takes a connection. The layer bounds this (and the `BEGIN` after it)
    /// with its [`acquire_timeout`](crate::OutboxLayer::acquire_timeout), so
    /// it may wait; an error becomes a `503 Service Unavailable`.
    fn connection(&self) -> impl Future<Output = Result<Self::Connection, BoxError>> + Send;

    /// Gets rid of a connection that may still be inside a transaction (the
    /// request was cancelled, the handler panicked, `COMMIT` or `ROLLBACK`
    /// failed). It must not be lent out again in that state: close it, so
    /// PostgreSQL rolls back and releases its locks at once. The default
    /// drops it, which is right for sources whose connections are not pooled
    /// or whose pool checks the transaction state on return (bb8).
    fn discard(connection: Self::Connection) {
        drop(connection);
    }
}

/// Implements [`ConnectionSource`] for diesel-async's deadpool pool of `$conn`.
macro_rules! pool_source {
    ($conn:ty) => {
        impl ConnectionSource for Pool<$conn> {
            type Connection = Object<$conn>;

            async fn connection(&self) -> Result<Self::Connection, BoxError> {
                self.get().await.map_err(BoxError::from)
            }

            fn discard(connection: Self::Connection) {
                // Detached from the pool, the connection is closed when dropped.
                drop(Object::take(connection));
            }
        }
    };
}

pool_source!(AsyncPgConnection);
#[cfg(feature = "mysql")]
pool_source!(diesel_async::AsyncMysqlConnection);
#[cfg(feature = "sqlite")]
pool_source!(
    diesel_async::sync_connection_wrapper::SyncConnectionWrapper<diesel::SqliteConnection>
);

/// A connection taken from some source, with the source's type erased so
/// that `Tx` and the layer are not generic.
/// A connection lent to a request, its back end erased: the layer drives
/// it through these, the handler's [`Tx`](crate::Tx) takes it back as its
/// concrete type.
pub(crate) trait Lent: Send {
    /// The connection, to be downcast to its concrete type.
    fn conn(&mut self) -> &mut (dyn Any + Send);
    /// The connection type's name (for a `Tx` of another type).
    fn connection_type(&self) -> &'static str;
    /// Begins the request's transaction (`outbox_diesel::begin_top_level`).
    fn begin(&mut self) -> BoxFuture<'_, outbox_diesel::Result<()>>;
    /// Whether exactly one transaction is open.
    fn in_top_level(&mut self) -> bool;
    /// Records `envelopes` with `recorder` (the back end's, or its default
    /// when `None`) and commits with the checked commit.
    fn commit<'a>(
        &'a mut self,
        recorder: Option<&'a (dyn Any + Send + Sync)>,
        envelopes: &'a [EventEnvelope],
    ) -> BoxFuture<'a, outbox_diesel::Result<()>>;
    /// Rolls back the innermost transaction.
    fn rollback(&mut self) -> BoxFuture<'_, outbox_diesel::Result<()>>;
    fn discard(self: Box<Self>);
}

struct LentFrom<S: ConnectionSource>(S::Connection);

type Target<S> = <<S as ConnectionSource>::Connection as std::ops::Deref>::Target;

impl<S: ConnectionSource> Lent for LentFrom<S> {
    fn conn(&mut self) -> &mut (dyn Any + Send) {
        &mut *self.0
    }

    fn connection_type(&self) -> &'static str {
        std::any::type_name::<Target<S>>()
    }

    fn begin(&mut self) -> BoxFuture<'_, outbox_diesel::Result<()>> {
        Box::pin(async move { Connection::begin(&mut *self.0).await.map_err(Into::into) })
    }

    fn in_top_level(&mut self) -> bool {
        Connection::in_top_level_transaction(&mut *self.0)
    }

    fn commit<'a>(
        &'a mut self,
        recorder: Option<&'a (dyn Any + Send + Sync)>,
        envelopes: &'a [EventEnvelope],
    ) -> BoxFuture<'a, outbox_diesel::Result<()>> {
        Box::pin(async move {
            let conn: &mut Target<S> = &mut self.0;
            // Not at the top level, `commit_top_level` refuses and says why;
            // the events would only go into a savepoint.
            if Connection::in_top_level_transaction(conn) && !envelopes.is_empty() {
                let default = <Target<S> as Connection>::Recorder::default();
                let recorder = match recorder {
                    None => &default,
                    Some(any) => any
                        .downcast_ref::<<Target<S> as Connection>::Recorder>()
                        .ok_or_else(|| {
                            outbox_diesel::Error::Config(format!(
                                "the layer's outbox (OutboxLayer::outbox) is not the recorder \
                                 of this connection type ({}): give it a {}",
                                std::any::type_name::<Target<S>>(),
                                std::any::type_name::<<Target<S> as Connection>::Recorder>(),
                            ))
                        })?,
                };
                <Target<S> as Connection>::record_envelopes(recorder, conn, envelopes).await?;
            }
            Connection::commit_top_level(conn).await
        })
    }

    fn rollback(&mut self) -> BoxFuture<'_, outbox_diesel::Result<()>> {
        Box::pin(async move {
            Connection::rollback(&mut *self.0)
                .await
                .map_err(outbox_diesel::Error::from)
        })
    }

    fn discard(self: Box<Self>) {
        S::discard(self.0);
    }
}

pub(crate) trait ErasedSource: Send + Sync {
    fn acquire(&self) -> BoxFuture<'_, Result<Box<dyn Lent>, BoxError>>;
    fn type_name(&self) -> &'static str;
    /// The recorder type of the source's back end, and its name.
    fn recorder(&self) -> (std::any::TypeId, &'static str);
}

pub(crate) struct Erased<S>(pub(crate) S);

impl<S: ConnectionSource> ErasedSource for Erased<S> {
    fn acquire(&self) -> BoxFuture<'_, Result<Box<dyn Lent>, BoxError>> {
        Box::pin(async move {
            let conn = self.0.connection().await?;
            Ok(Box::new(LentFrom::<S>(conn)) as Box<dyn Lent>)
        })
    }

    fn type_name(&self) -> &'static str {
        std::any::type_name::<S>()
    }

    fn recorder(&self) -> (std::any::TypeId, &'static str) {
        type Recorder<S> = <Target<S> as Connection>::Recorder;
        (
            std::any::TypeId::of::<Recorder<S>>(),
            std::any::type_name::<Recorder<S>>(),
        )
    }
}

impl fmt::Debug for dyn ErasedSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.type_name())
    }
}
