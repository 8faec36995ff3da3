//! [`OutboxLayer`]: the settings, and the Tower `Layer` applying them.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, StatusCode};
use outbox_core::RelayHandle;
use tower::Layer;

use crate::OutboxService;
use crate::correlation::default_correlation_headers;
use crate::source::{ConnectionSource, Erased, ErasedSource};

type CommitIf = dyn Fn(StatusCode) -> bool + Send + Sync;

/// The layer's settings, shared by every request.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) source: Arc<dyn ErasedSource>,
    /// The recorder set by [`OutboxLayer::outbox`]; `None`: the default
    /// recorder of the connection's back end.
    pub(crate) outbox: Option<Arc<dyn Any + Send + Sync>>,
    pub(crate) relay: Option<RelayHandle>,
    pub(crate) commit_if: Arc<CommitIf>,
    pub(crate) standalone: bool,
    pub(crate) acquire_timeout: Duration,
    pub(crate) retry_after: Duration,
    pub(crate) correlation_headers: Vec<HeaderName>,
}

/// A Tower layer giving each request a lazily opened transaction ([`Tx`])
/// and an event collector ([`Events`]), and committing both together after
/// a successful response. See the [crate docs](crate) for the whole story.
///
/// | setting | default |
/// |---|---|
/// | [`outbox`](Self::outbox) | `Outbox::default()`: schema `public`, `NOTIFY` on |
/// | [`relay`](Self::relay) | none: no in-process wakeup after commit |
/// | [`commit_if`](Self::commit_if) | `status.is_success()` (2xx) |
/// | [`standalone`](Self::standalone) | `false`: events neither flushed nor committed through `Tx` fail the request |
/// | [`acquire_timeout`](Self::acquire_timeout) | 5 s for pool checkout + `BEGIN`, then `503` |
/// | [`retry_after`](Self::retry_after) | 1 s, sent as `Retry-After` with each `503` |
/// | [`correlation_header`](Self::correlation_header) | `x-request-id`, then `x-correlation-id`, else a new UUID v7 |
///
/// [`Tx`]: crate::Tx
/// [`Events`]: crate::Events
#[derive(Clone)]
#[must_use]
pub struct OutboxLayer {
    config: Arc<Config>,
}

impl fmt::Debug for OutboxLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        f.debug_struct("OutboxLayer")
            .field("source", &c.source)
            .field("outbox", &c.outbox.is_some())
            .field("relay", &c.relay.is_some())
            .field("standalone", &c.standalone)
            .field("acquire_timeout", &c.acquire_timeout)
            .field("retry_after", &c.retry_after)
            .field("correlation_headers", &c.correlation_headers)
            .finish_non_exhaustive()
    }
}

impl OutboxLayer {
    /// A layer taking request transactions from `source`, usually the
    /// deadpool pool of `outbox_diesel::pool` (see [`ConnectionSource`]).
    pub fn new(source: impl ConnectionSource) -> Self {
        OutboxLayer {
            config: Arc::new(Config {
                source: Arc::new(Erased(source)),
                outbox: None,
                relay: None,
                commit_if: Arc::new(|status: StatusCode| status.is_success()),
                standalone: false,
                acquire_timeout: Duration::from_secs(5),
                retry_after: Duration::from_secs(1),
                correlation_headers: default_correlation_headers(),
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Config)) -> Self {
        change(Arc::make_mut(&mut self.config));
        self
    }

    /// Where events are written: the recorder of the pool's back end
    /// (`outbox_diesel::Outbox` on PostgreSQL: its schema and whether
    /// recording sends a `NOTIFY`; `MysqlOutbox`, `SqliteOutbox`). Default:
    /// that back end's default recorder (`public`, with `NOTIFY`, on
    /// PostgreSQL). A recorder of another back end than the pool's fails
    /// every commit with `outbox_diesel::Error::Config`, saying which to give.
    ///
    /// # Panics
    /// If `outbox` is not the recorder of the source's back end (e.g. an
    /// `outbox_diesel::Outbox` for a MariaDB pool): a misconfiguration
    /// caught when the router is built, not at the first request.
    pub fn outbox<R: Clone + Send + Sync + 'static>(self, outbox: R) -> Self {
        let (expected, name) = self.config.source.recorder();
        assert!(
            std::any::TypeId::of::<R>() == expected,
            "OutboxLayer::outbox: got a {}, but the layer's connections ({:?}) record with a {name}",
            std::any::type_name::<R>(),
            self.config.source,
        );
        self.with(|c| c.outbox = Some(Arc::new(outbox)))
    }

    /// Wakes this relay after every commit that wrote events, so they are
    /// published now rather than at the relay's next poll.
    pub fn relay(self, handle: RelayHandle) -> Self {
        self.with(|c| c.relay = Some(handle))
    }

    /// Which responses commit the request's transaction; every other one
    /// rolls it back and drops the staged events. Default: 2xx.
    ///
    /// ```
    /// # fn pool() -> diesel_async::pooled_connection::deadpool::Pool<diesel_async::AsyncPgConnection> { unimplemented!() }
    /// use axum::http::StatusCode;
    /// use outbox_axum::OutboxLayer;
    ///
    /// # fn build() -> OutboxLayer {
    /// // Also commit on redirects (e.g. POST-redirect-GET):
    /// OutboxLayer::new(pool())
    ///     .commit_if(|status| status.is_success() || status.is_redirection())
    /// # }
    /// ```
    pub fn commit_if(self, predicate: impl Fn(StatusCode) -> bool + Send + Sync + 'static) -> Self {
        self.with(|c| c.commit_if = Arc::new(predicate))
    }

    /// What happens to events staged in a request that never opened a
    /// [`Tx`](crate::Tx) and did not [`flush`](crate::Events::flush) them.
    ///
    /// `false` (default): the request fails with a `500` and an error log,
    /// since writing them separately from the business change would break
    /// the outbox's atomicity. `true`: they are written in a short
    /// transaction of their own before the response is sent (for handlers
    /// whose only effect is the event).
    pub fn standalone(self, on: bool) -> Self {
        self.with(|c| c.standalone = on)
    }

    /// The longest a request waits for a pooled connection and its `BEGIN`
    /// before [`Tx`](crate::Tx) gives up with `503 Service Unavailable`.
    /// Default 5 s. It applies whatever the pool's own settings; a deadpool
    /// `timeouts.wait` (which needs a runtime set on the pool builder) may be
    /// shorter.
    pub fn acquire_timeout(self, timeout: Duration) -> Self {
        self.with(|c| c.acquire_timeout = timeout)
    }

    /// The `Retry-After` sent with every `503` (whole seconds, rounded up,
    /// at least 1). Default 1 s.
    pub fn retry_after(self, after: Duration) -> Self {
        self.with(|c| c.retry_after = after)
    }

    /// The request header holding the correlation id, instead of
    /// `x-request-id` then `x-correlation-id`. Without a usable value (visible
    /// ASCII, at most 200 bytes) a UUID v7 is generated.
    pub fn correlation_header(self, name: HeaderName) -> Self {
        self.with(|c| c.correlation_headers = vec![name])
    }
}

impl<S> Layer<S> for OutboxLayer {
    type Service = OutboxService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        OutboxService::new(inner, Arc::clone(&self.config))
    }
}
