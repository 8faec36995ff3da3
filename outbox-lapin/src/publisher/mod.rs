//! [`LapinPublisher`]: the relay's [`Publisher`](outbox_core::Publisher) on
//! RabbitMQ, with publisher confirms.
//!
//! This file holds the type, what it promises (its docs) and
//! [`LapinPublisher::connect`]; the parts:
//! - `builder.rs`: [`LapinPublisherBuilder`], the settings and their
//!   defaults;
//! - `pool.rs`: the connection (the exchange declared on connect) and the
//!   confirm-mode channels handed to batches;
//! - `target.rs`: where an event goes (exchange, routing key) and whether
//!   it fits on the wire;
//! - `confirm.rs`: sending a batch pipelined and awaiting its confirms and
//!   returns;
//! - `classify.rs`: sorting a lapin error (connection lost, connection died
//!   under a message, channel closed by a message);
//! - `publish.rs`: the `Publisher` impl: a batch published in rounds,
//!   narrowed down (bisected) on channel errors to the message at fault;
//! - `span.rs`: each message's `publish` span (feature `opentelemetry`).

mod builder;
mod classify;
mod confirm;
mod pool;
mod publish;
mod settings;
mod span;
mod target;

use std::fmt;
use std::sync::Arc;

use outbox_core::EventEnvelope;

pub use builder::LapinPublisherBuilder;

use crate::Result;
use pool::State;

/// Computes the routing key of an event.
pub type RoutingKeyFn = dyn Fn(&EventEnvelope) -> String + Send + Sync;

/// Chooses the exchange of an event (overriding the configured one).
pub type ExchangeFn = dyn Fn(&EventEnvelope) -> Option<String> + Send + Sync;

/// Gauge: 1 while the broker has blocked the publisher's connection
/// (`connection.blocked`, a resource alarm).
pub const BLOCKED_GAUGE: &str = "outbox_broker_blocked";

/// Publishes outbox events to a RabbitMQ exchange with publisher confirms.
///
/// - One connection; each batch in flight has a confirm-mode channel of its
///   own (kept idle between batches when every message of the last one was
///   answered). A batch is published pipelined (every message sent before
///   any confirm is awaited), then all confirms are awaited within
///   [`confirm_timeout`](LapinPublisherBuilder::confirm_timeout). Concurrent
///   batches (the relay's [`concurrency`](outbox_core::RelayBuilder::concurrency))
///   overlap: one awaits its confirms while the next sends.
/// - `mandatory = true` and `delivery_mode = 2`: an unroutable message comes
///   back as a return, which counts as a failure, never as sent. Returns are
///   matched to their messages by `message_id` once every confirm of the
///   batch is in (lapin attaches a return to whichever confirm completes
///   next, which may be another message's).
/// - An event that cannot go on the wire (it breaks
///   [`EventEnvelope::validate_wire`], its exchange name or routing key
///   is over 255 bytes, or its content header frame, encoded exactly as it
///   would be sent, exceeds the `frame_max` negotiated on the connection)
///   is [`PublishOutcome::Unpublishable`] without being sent: the relay
///   marks it `Dead` at once. (Sent, an oversized frame makes RabbitMQ close
///   the whole connection.)
/// - A connection closed by the broker is sorted by its reply code: 501
///   (frame error), 502 (syntax error) and 505 (unexpected frame) are about
///   a frame sent for a message, so the batch is narrowed down to it like
///   a channel error (it ends [`PublishOutcome::Rejected`]); 320 (forced:
///   an operator, a broker shutting down) and other codes are the
///   broker's ([`PublishOutcome::ConnectionLost`]), except 541 (internal
///   error), which a message may cause (see the next point).
/// - A connection that dies under messages in flight (sent, not yet
///   confirmed) without the broker saying why (an I/O error, an abrupt
///   close: e.g. a proxy or a broker plugin that drops the connection on
///   one message) or with 541 makes them [`PublishOutcome::ConnectionDied`]:
///   one of them may have killed it. The relay spends no attempt, counts
///   them as suspects in their rows, publishes each suspect alone from then
///   on, and parks one `Dead` once the connection died with it alone in
///   flight often enough ([`suspect_limit`](outbox_core::RelayBuilder::suspect_limit)).
///   Messages not sent yet, a missed heartbeat (the broker or the network
///   went silent) and a close with a reply code other than 541 are
///   `ConnectionLost` and make nothing suspect.
/// - Only `basic.ack` without a return is [`PublishOutcome::Acked`]. A
///   `312 NO_ROUTE` return is [`PublishOutcome::Unroutable`] (what it costs
///   is the relay's `UnroutablePolicy`: by default nothing, the event is
///   held). A `basic.nack`, another return and a channel closed by the
///   broker because of a message (404 no such exchange, 406, a message too
///   large) are [`PublishOutcome::Rejected`], which spends an attempt. On a channel
///   error the batch is narrowed down (bisected) on fresh channels so only
///   the message that causes it is rejected.
/// - A message not confirmed within the
///   [`confirm_timeout`](LapinPublisherBuilder::confirm_timeout) is
///   [`PublishOutcome::Unconfirmed`]: the broker is stalled or a queue is
///   stuck, so no attempt is spent (the relay pauses, or holds that exchange
///   and routing key back behind a circuit breaker). The channel is not
///   used again, and an ack seen only after the timeout is not trusted (a
///   `basic.return` for it may have come with a confirm that was already
///   given up), so nothing unroutable is ever taken as sent.
/// - A lost connection (or a broker that blocks publishers because of a
///   resource alarm) is [`PublishOutcome::ConnectionLost`] for every message
///   not yet confirmed (`ConnectionDied` for those in flight, as above):
///   the relay pauses, spends no attempts, and the next batch reconnects.
/// - Every broker call is bounded: connecting by
///   [`CONNECT_TIMEOUT`](crate::CONNECT_TIMEOUT), opening a channel,
///   `confirm.select`, declaring the exchange and closing a channel by
///   [`operation_timeout`](LapinPublisherBuilder::operation_timeout), and
///   sending a batch (`basic_publish` blocks under TCP backpressure, e.g. a
///   resource alarm raised mid-batch) by the batch's confirm deadline. No
///   lock is held across a broker call. A call that times out counts as
///   "broker unavailable" ([`PublishOutcome::ConnectionLost`] for what was
///   not sent: no attempt spent) and its connection is not used again.
/// - Known behaviour of the client library: when the broker closes a
///   channel while later messages of the batch are still queued for it,
///   lapin may send them after acknowledging the close, and RabbitMQ then
///   closes the whole connection (`CHANNEL_ERROR - expected 'channel.open'`).
///   Everything in flight on the connection is then `ConnectionLost` (no
///   attempts spent) and published again after the pause, from the whole
///   batch; the race does not hit every time, so narrowing down eventually
///   completes with only the culprit rejected (the publisher tests repeat
///   this case).
///
/// The wire format is documented in [`wire`].
///
/// ```no_run
/// use outbox_lapin::LapinPublisher;
///
/// # async fn run() -> Result<(), outbox_lapin::Error> {
/// let publisher = LapinPublisher::builder("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .exchange("shop.events")
///     .source("/shop")
///     .build()?;
/// publisher.connect().await?; // optional: fail fast at start
/// # Ok(()) }
/// ```
///
/// [`PublishOutcome::Acked`]: outbox_core::PublishOutcome::Acked
/// [`PublishOutcome::Rejected`]: outbox_core::PublishOutcome::Rejected
/// [`PublishOutcome::Unpublishable`]: outbox_core::PublishOutcome::Unpublishable
/// [`PublishOutcome::Unroutable`]: outbox_core::PublishOutcome::Unroutable
/// [`PublishOutcome::Unconfirmed`]: outbox_core::PublishOutcome::Unconfirmed
/// [`PublishOutcome::ConnectionLost`]: outbox_core::PublishOutcome::ConnectionLost
/// [`PublishOutcome::ConnectionDied`]: outbox_core::PublishOutcome::ConnectionDied
/// [`wire`]: crate::wire
#[derive(Clone)]
pub struct LapinPublisher {
    inner: Arc<Inner>,
}

struct Inner {
    /// What the builder set.
    settings: settings::Settings,
    /// The connection and idle channels. Never held across an await: every
    /// broker call runs outside it, bounded.
    state: std::sync::Mutex<State>,
    /// Serializes connecting (a bounded await), so concurrent batches open
    /// one connection, not one each.
    connecting: tokio::sync::Mutex<()>,
}

impl fmt::Debug for LapinPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        f.debug_struct("LapinPublisher")
            .field("urls", &inner.settings.urls)
            .field("exchange", &inner.settings.exchange)
            .field("source", &inner.settings.source)
            .field("confirm_timeout", &inner.settings.confirm_timeout)
            .field("operation_timeout", &inner.settings.operation_timeout)
            .field("connection_name", &inner.settings.connection_name)
            .finish_non_exhaustive()
    }
}

impl LapinPublisher {
    /// Connects now (and declares the exchange if configured), so
    /// configuration errors show at start rather than at the first publish.
    ///
    /// # Errors
    /// [`Error::Connect`], [`Error::ConnectTimeout`], [`Error::Timeout`] or
    /// [`Error::Amqp`].
    ///
    /// [`Error::Connect`]: crate::Error::Connect
    /// [`Error::ConnectTimeout`]: crate::Error::ConnectTimeout
    /// [`Error::Timeout`]: crate::Error::Timeout
    /// [`Error::Amqp`]: crate::Error::Amqp
    pub async fn connect(&self) -> Result<()> {
        self.connection().await.map(|_| ())
    }
}
