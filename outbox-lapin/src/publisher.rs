//! [`LapinPublisher`]: the relay's [`Publisher`] on RabbitMQ, with publisher
//! confirms.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPHardError};
use lapin::types::FieldTable;
use lapin::{
    Channel, Confirmation, Connection, ConnectionStatus, ErrorKind, ExchangeKind, PublisherConfirm,
};
use outbox_core::{EventEnvelope, PublishOutcome, Publisher, failpoints};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::error::{bounded, connect, redact_url};
use crate::{Error, Result, wire};

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
#[derive(Clone)]
pub struct LapinPublisher {
    inner: Arc<Inner>,
}

struct Inner {
    url: String,
    exchange: String,
    kind: ExchangeKind,
    declare: bool,
    source: String,
    routing_key: Option<Arc<RoutingKeyFn>>,
    exchange_for: Option<Arc<ExchangeFn>>,
    confirm_timeout: Duration,
    operation_timeout: Duration,
    connection_name: String,
    /// The connection and idle channels. Never held across an await: every
    /// broker call runs outside it, bounded.
    state: std::sync::Mutex<State>,
    /// Serializes connecting (a bounded await), so concurrent batches open
    /// one connection, not one each.
    connecting: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    session: Option<Session>,
    /// Counts connections: a channel goes back to the idle ones only if it
    /// belongs to the current one.
    generation: u64,
}

struct Session {
    connection: Arc<Connection>,
    /// The [`State::generation`] of this connection.
    generation: u64,
    /// Confirm-mode channels not in use by a batch right now.
    idle: Vec<Channel>,
}

/// Idle channels kept per connection; more are closed when returned.
const MAX_IDLE_CHANNELS: usize = 8;

impl fmt::Debug for LapinPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &self.inner;
        f.debug_struct("LapinPublisher")
            .field("url", &redact_url(&inner.url))
            .field("exchange", &inner.exchange)
            .field("source", &inner.source)
            .field("confirm_timeout", &inner.confirm_timeout)
            .field("operation_timeout", &inner.operation_timeout)
            .field("connection_name", &inner.connection_name)
            .finish_non_exhaustive()
    }
}

/// Settings of a [`LapinPublisher`].
///
/// | setting | default |
/// |---|---|
/// | [`exchange`](Self::exchange) | `outbox.events` |
/// | [`exchange_kind`](Self::exchange_kind) | topic |
/// | [`declare_exchange`](Self::declare_exchange) | yes (durable) |
/// | [`source`](Self::source) | `/outbox` (`cloudEvents:source`) |
/// | [`routing_key`](Self::routing_key) | the event type |
/// | [`confirm_timeout`](Self::confirm_timeout) | 10 s |
/// | [`operation_timeout`](Self::operation_timeout) | 10 s |
/// | [`connection_name`](Self::connection_name) | `outbox-relay` |
#[must_use]
pub struct LapinPublisherBuilder {
    url: String,
    exchange: String,
    kind: ExchangeKind,
    declare: bool,
    source: String,
    routing_key: Option<Arc<RoutingKeyFn>>,
    exchange_for: Option<Arc<ExchangeFn>>,
    confirm_timeout: Duration,
    operation_timeout: Duration,
    connection_name: String,
}

impl fmt::Debug for LapinPublisherBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LapinPublisherBuilder")
            .field("url", &redact_url(&self.url))
            .field("exchange", &self.exchange)
            .finish_non_exhaustive()
    }
}

impl LapinPublisherBuilder {
    /// The exchange to publish to. Default `outbox.events`.
    pub fn exchange(mut self, name: impl Into<String>) -> Self {
        self.exchange = name.into();
        self
    }

    /// The exchange's kind, when the publisher declares it. Default topic.
    pub fn exchange_kind(mut self, kind: ExchangeKind) -> Self {
        self.kind = kind;
        self
    }

    /// Whether to declare the exchange (durable) on connect. Default yes;
    /// turn it off when the exchange is managed elsewhere.
    pub fn declare_exchange(mut self, declare: bool) -> Self {
        self.declare = declare;
        self
    }

    /// The `cloudEvents:source` of every message, a URI naming the producing
    /// service (e.g. `/ecommerce`). Default `/outbox`.
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.source = source.into();
        self
    }

    /// Overrides the routing key (default: the event type, so dotted types
    /// such as `order.placed` route naturally on a topic exchange).
    pub fn routing_key(
        mut self,
        f: impl Fn(&EventEnvelope) -> String + Send + Sync + 'static,
    ) -> Self {
        self.routing_key = Some(Arc::new(f));
        self
    }

    /// Sends some events to another exchange: when `f` returns `Some(name)`,
    /// that exchange is used instead of the configured one (it is not
    /// declared by the publisher). A missing exchange closes the channel
    /// (404); only the events routed there fail.
    pub fn exchange_for(
        mut self,
        f: impl Fn(&EventEnvelope) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.exchange_for = Some(Arc::new(f));
        self
    }

    /// How long to wait for a batch's confirms (sending included); a message
    /// unconfirmed by then is [`PublishOutcome::Unconfirmed`]: no attempt
    /// is spent, and it is published again after the relay's pause or its
    /// destination's circuit breaker. The relay also passes its claim's
    /// deadline ([`Claim::valid_until`](outbox_core::Claim::valid_until)) to
    /// each publish, and the wait ends at whichever comes first, so a wave
    /// started late in a claim never outlives it, whatever this setting.
    /// Default 10 s.
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// How long the broker may take to answer any other operation (opening
    /// a channel, `confirm.select`, declaring the exchange, closing a
    /// channel); connecting is bounded by [`CONNECT_TIMEOUT`](crate::CONNECT_TIMEOUT).
    /// A call not answered in time counts as "broker unavailable" (the
    /// relay pauses, no attempt is spent) and its connection is not used
    /// again. Default 10 s.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// The client-provided connection name (visible in the management UI and
    /// `rabbitmqctl list_connections`). Default `outbox-relay`.
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = name.into();
        self
    }

    /// Validates the settings. Does not connect: the first publish (or
    /// [`LapinPublisher::connect`]) does.
    ///
    /// # Errors
    /// [`Error::Config`] for an empty or over-long exchange name, or a zero
    /// confirm or operation timeout.
    pub fn build(self) -> Result<LapinPublisher> {
        if self.exchange.len() > 255 {
            return Err(Error::Config("exchange name longer than 255 bytes".into()));
        }
        if self.exchange.is_empty() && self.declare {
            return Err(Error::Config(
                "the default exchange (\"\") cannot be declared; set declare_exchange(false)"
                    .into(),
            ));
        }
        if self.confirm_timeout.is_zero() {
            return Err(Error::Config("confirm_timeout must be positive".into()));
        }
        if self.operation_timeout.is_zero() {
            return Err(Error::Config("operation_timeout must be positive".into()));
        }
        Ok(LapinPublisher {
            inner: Arc::new(Inner {
                url: self.url,
                exchange: self.exchange,
                kind: self.kind,
                declare: self.declare,
                source: self.source,
                routing_key: self.routing_key,
                exchange_for: self.exchange_for,
                confirm_timeout: self.confirm_timeout,
                operation_timeout: self.operation_timeout,
                connection_name: self.connection_name,
                state: std::sync::Mutex::default(),
                connecting: Mutex::new(()),
            }),
        })
    }
}

/// What happened to one message in one round.
enum Round {
    Done(PublishOutcome),
    /// The broker closed the channel; the culprit is among these messages.
    ChannelClosed(String),
}

impl LapinPublisher {
    /// Starts configuring a publisher for the broker at `url`.
    pub fn builder(url: impl Into<String>) -> LapinPublisherBuilder {
        LapinPublisherBuilder {
            url: url.into(),
            exchange: "outbox.events".into(),
            kind: ExchangeKind::Topic,
            declare: true,
            source: "/outbox".into(),
            routing_key: None,
            exchange_for: None,
            confirm_timeout: Duration::from_secs(10),
            operation_timeout: Duration::from_secs(10),
            connection_name: "outbox-relay".into(),
        }
    }

    /// Connects now (and declares the exchange if configured), so
    /// configuration errors show at start rather than at the first publish.
    ///
    /// # Errors
    /// [`Error::Connect`], [`Error::ConnectTimeout`], [`Error::Timeout`] or
    /// [`Error::Amqp`].
    pub async fn connect(&self) -> Result<()> {
        self.connection().await.map(|_| ())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update of the state is a single assignment or push: a
        // panic elsewhere cannot leave it half-changed.
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The current connection and its generation, if it is still open.
    fn current(&self) -> Option<(Arc<Connection>, u64)> {
        let mut state = self.state();
        let usable = state
            .session
            .as_ref()
            .is_some_and(|s| s.connection.status().connected());
        if !usable {
            state.session = None;
            return None;
        }
        state
            .session
            .as_ref()
            .map(|s| (Arc::clone(&s.connection), s.generation))
    }

    /// The current connection, or a new one (with the exchange declared).
    /// Every step is bounded, and the state lock is never held across one.
    async fn connection(&self) -> Result<(Arc<Connection>, u64)> {
        if let Some(current) = self.current() {
            return Ok(current);
        }
        // One batch connects while the others wait for it (a bounded wait:
        // connecting is bounded) and then use its connection.
        let _connecting = self.inner.connecting.lock().await;
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let connection = connect(&self.inner.url, &self.inner.connection_name).await?;
        let channel = self.open_channel(&connection).await?;
        if self.inner.declare {
            bounded(
                &format!("declare exchange {}", self.inner.exchange),
                self.inner.operation_timeout,
                channel.exchange_declare(
                    self.inner.exchange.as_str().into(),
                    self.inner.kind.clone(),
                    ExchangeDeclareOptions {
                        durable: true,
                        ..ExchangeDeclareOptions::default()
                    },
                    FieldTable::default(),
                ),
            )
            .await?;
        }
        tracing::info!(
            connection = %self.inner.connection_name,
            exchange = %self.inner.exchange,
            "outbox publisher connected"
        );
        let connection = Arc::new(connection);
        let mut state = self.state();
        state.generation += 1;
        let generation = state.generation;
        state.session = Some(Session {
            connection: Arc::clone(&connection),
            generation,
            idle: vec![channel],
        });
        Ok((connection, generation))
    }

    /// Stops using connection `generation` (a call on it timed out): the
    /// next batch connects anew. Batches still using it finish on it,
    /// bounded; the last one to drop it closes it without waiting.
    fn discard(&self, generation: u64, why: &str) {
        let mut state = self.state();
        if state
            .session
            .as_ref()
            .is_some_and(|s| s.generation == generation)
        {
            tracing::warn!(
                connection = %self.inner.connection_name,
                reason = why,
                "outbox publisher drops its RabbitMQ connection; the next batch reconnects"
            );
            state.session = None;
        }
    }

    /// A new confirm-mode channel, each step bounded.
    async fn open_channel(&self, connection: &Connection) -> Result<Channel> {
        let limit = self.inner.operation_timeout;
        let channel = bounded("open channel", limit, connection.create_channel()).await?;
        bounded(
            "confirm.select",
            limit,
            channel.confirm_select(ConfirmSelectOptions::default()),
        )
        .await?;
        Ok(channel)
    }

    fn exchange(&self, envelope: &EventEnvelope) -> String {
        self.inner
            .exchange_for
            .as_ref()
            .and_then(|f| f(envelope))
            .unwrap_or_else(|| self.inner.exchange.clone())
    }

    fn routing_key(&self, envelope: &EventEnvelope) -> String {
        match &self.inner.routing_key {
            Some(f) => f(envelope),
            None => envelope.event_type.clone(),
        }
    }

    /// Where `envelope` goes (its exchange and routing key, computed once
    /// per publish), or why it cannot be put on the wire: it breaks
    /// [`EventEnvelope::validate_wire`] (an envelope stored by another
    /// writer, or before the limits were enforced), or its exchange name or
    /// routing key is longer than an AMQP short string holds (255 bytes).
    fn target(&self, envelope: &EventEnvelope) -> std::result::Result<(String, String), String> {
        envelope.validate_wire().map_err(|err| err.to_string())?;
        let fits = |what: &str, value: String| {
            if value.len() > EventEnvelope::MAX_SHORT_BYTES {
                Err(format!(
                    "{what} is {} bytes long; AMQP allows at most {}",
                    value.len(),
                    EventEnvelope::MAX_SHORT_BYTES
                ))
            } else {
                Ok(value)
            }
        };
        Ok((
            fits("the exchange name", self.exchange(envelope))?,
            fits("the routing key", self.routing_key(envelope))?,
        ))
    }

    /// A fresh channel after the broker closed the last one. While the old
    /// channel is still closing (another batch's message closed it a moment
    /// ago), lapin refuses to open one: retry for up to a second as long as
    /// the connection is up. A call that times out ends it at once: the
    /// broker is not answering.
    async fn reopen_channel(&self, connection: &Connection) -> std::result::Result<Channel, Error> {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            match self.open_channel(connection).await {
                Ok(channel) => return Ok(channel),
                Err(err @ Error::Timeout { .. }) => return Err(err),
                Err(err) if connection.status().connected() && Instant::now() < deadline => {
                    tracing::debug!(error = %err, "channel not reopened yet; retrying");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// Sends `events` pipelined on `channel`; returns each publish's
    /// confirm (or the error of sending it), and whether it may have been
    /// partly on the wire: only the first publish that fails, and only if
    /// it began on an open channel (lapin resolves a publish once its last
    /// frame is written, so that one may have been cut mid-write; every
    /// later one is refused before anything of it is written). Awaits no
    /// confirm. Sending is
    /// bounded by `deadline`: under TCP backpressure (a broker that stopped
    /// reading, e.g. for a resource alarm raised mid-batch) `basic_publish`
    /// blocks, and the events not sent by then are left out (the result is
    /// shorter than `events`).
    async fn send(
        &self,
        channel: &Channel,
        events: &[&EventEnvelope],
        targets: &[&(String, String)],
        deadline: Instant,
    ) -> Vec<(lapin::Result<PublisherConfirm>, bool)> {
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let mut pending = Vec::with_capacity(events.len());
        let mut failed = false;
        for (envelope, (exchange, routing_key)) in events.iter().zip(targets) {
            let began_open = !failed && channel.status().connected();
            let publishing = channel.basic_publish(
                exchange.as_str().into(),
                routing_key.as_str().into(),
                options,
                envelope.payload.as_bytes(),
                wire::properties(envelope, &self.inner.source),
            );
            match tokio::time::timeout_at(deadline, publishing).await {
                Ok(sent) => {
                    failed |= sent.is_err();
                    pending.push((sent, began_open));
                }
                Err(_) => break,
            }
        }
        pending
    }

    /// Awaits the confirms of a [`send`](Self::send) of `events`, until
    /// `deadline`. Returns each event's round, and whether the channel is
    /// clean (every message answered, none timed out or closed the channel)
    /// and may serve another batch.
    ///
    /// Unroutable messages are matched by their returned `message_id`, not
    /// by the confirm a return came with: lapin hands a `basic.return` to
    /// whichever confirm completes next, which with a broker's multiple-ack
    /// may be an earlier message's. Every return precedes its own message's
    /// ack, so a return is attached to a confirm that completed no later
    /// than its message's own.
    ///
    /// At the deadline no confirm is dropped unseen (a return attached to
    /// a dropped confirm would be lost, and its message could be taken as
    /// sent): every confirm still pending is polled once (what is complete
    /// counts), then those still pending are polled once more, only to
    /// collect returns (whatever completes then is
    /// [`Unconfirmed`](PublishOutcome::Unconfirmed): its return may sit on
    /// a confirm seen pending a moment before). What is left is
    /// `Unconfirmed`, and the channel is not used again, so no later ack on
    /// it is ever trusted.
    async fn confirm(
        &self,
        connection: &ConnectionStatus,
        events: &[&EventEnvelope],
        pending: Vec<(lapin::Result<PublisherConfirm>, bool)>,
        deadline: Instant,
    ) -> (Vec<Round>, bool) {
        let mut clean = true;
        let mut returned: HashMap<String, PublishOutcome> = HashMap::new();
        let mut rounds: Vec<Option<Round>> = Vec::with_capacity(pending.len());
        let mut confirms: Vec<Option<PublisherConfirm>> = Vec::with_capacity(pending.len());
        for (sent, began_open) in pending {
            match sent {
                Ok(confirm) => {
                    rounds.push(None);
                    confirms.push(Some(confirm));
                }
                Err(err) => {
                    clean = false;
                    rounds.push(Some(classify(connection, &err, began_open)));
                    confirms.push(None);
                }
            }
        }
        let mut answer = |answered: lapin::Result<Confirmation>, clean: &mut bool| match answered {
            Err(err) => {
                *clean = false;
                classify(connection, &err, true)
            }
            Ok(Confirmation::Ack(message)) => {
                note_return(&mut returned, message);
                Round::Done(PublishOutcome::Acked)
            }
            Ok(Confirmation::Nack(message)) => {
                note_return(&mut returned, message);
                Round::Done(PublishOutcome::rejected(
                    "negatively acknowledged (basic.nack) by the broker",
                ))
            }
            Ok(Confirmation::NotRequested) => {
                *clean = false;
                Round::Done(PublishOutcome::rejected(
                    "the channel is not in confirm mode",
                ))
            }
        };
        let mut timed_out = false;
        for (round, slot) in rounds.iter_mut().zip(confirms.iter_mut()) {
            let Some(confirm) = slot.as_mut() else {
                continue;
            };
            // By reference: a confirm still pending at the deadline is kept.
            match tokio::time::timeout_at(deadline, confirm).await {
                Ok(answered) => {
                    *slot = None;
                    *round = Some(answer(answered, &mut clean));
                }
                Err(_) => {
                    timed_out = true;
                    break;
                }
            }
        }
        if timed_out {
            clean = false;
            // What is complete now counts.
            for (round, slot) in rounds.iter_mut().zip(confirms.iter_mut()) {
                if let Some(answered) = slot.as_mut().and_then(FutureExt::now_or_never) {
                    *slot = None;
                    *round = Some(answer(answered, &mut clean));
                }
            }
            // Completed since: only their returns count.
            for slot in &mut confirms {
                if let Some(Ok(Confirmation::Ack(message) | Confirmation::Nack(message))) =
                    slot.as_mut().and_then(FutureExt::now_or_never)
                {
                    note_return(&mut returned, message);
                }
            }
        }
        let rounds: Vec<Round> = rounds
            .into_iter()
            .map(|round| {
                round.unwrap_or_else(|| {
                    Round::Done(PublishOutcome::unconfirmed(format!(
                        "no publisher confirm in time (confirm timeout {:?}, or the claim's \
                         deadline if sooner)",
                        self.inner.confirm_timeout
                    )))
                })
            })
            .zip(events)
            .map(|(round, event)| match returned.get(&event.id.to_string()) {
                Some(outcome) if matches!(round, Round::Done(_)) => Round::Done(outcome.clone()),
                _ => round,
            })
            .collect();
        (rounds, clean)
    }

    /// Connects if needed, checks for a blocked connection, and hands out a
    /// confirm-mode channel for one batch's exclusive use: an idle one, or
    /// a `fresh` one. Every broker call is bounded and none runs under the
    /// state lock. `Err` is the reason every event of the batch counts as
    /// connection lost.
    async fn checkout(&self, fresh: bool) -> std::result::Result<Checkout, String> {
        let (connection, generation) = match self.connection().await {
            Ok(current) => current,
            Err(err) => {
                tracing::warn!(error = %err, "outbox publisher cannot connect");
                return Err(err.to_string());
            }
        };
        let blocked = connection.status().blocked();
        metrics::gauge!(BLOCKED_GAUGE).set(if blocked { 1.0 } else { 0.0 });
        if blocked {
            tracing::warn!("RabbitMQ blocked the publisher (resource alarm); pausing");
            return Err(
                "RabbitMQ blocked publishing (connection.blocked: a memory or disk alarm)".into(),
            );
        }
        if !fresh {
            let mut state = self.state();
            if let Some(session) = state
                .session
                .as_mut()
                .filter(|s| s.generation == generation)
            {
                while let Some(channel) = session.idle.pop() {
                    if channel.status().connected() {
                        return Ok(Checkout {
                            connection,
                            channel,
                            generation,
                            fresh: false,
                        });
                    }
                }
            }
        }
        match self.reopen_channel(&connection).await {
            Ok(channel) => Ok(Checkout {
                connection,
                channel,
                generation,
                fresh: true,
            }),
            Err(err) => {
                if matches!(err, Error::Timeout { .. }) {
                    self.discard(generation, &err.to_string());
                }
                Err(format!("cannot open a channel: {err}"))
            }
        }
    }

    /// Returns a batch's channel to the idle ones if it is `clean` (every
    /// message answered), still open and of the current connection;
    /// otherwise closes it in the background (bounded), so that no batch
    /// waits for a broker that does not answer.
    fn checkin(&self, checkout: Checkout, clean: bool) {
        let channel = checkout.channel;
        if !channel.status().connected() {
            return;
        }
        if clean {
            let mut state = self.state();
            if let Some(session) = state.session.as_mut()
                && session.generation == checkout.generation
                && session.connection.status().connected()
                && session.idle.len() < MAX_IDLE_CHANNELS
            {
                session.idle.push(channel);
                return;
            }
        }
        let limit = self.inner.operation_timeout;
        tokio::spawn(async move {
            if let Err(error) = bounded(
                "close channel",
                limit,
                channel.close(200, "not needed".into()),
            )
            .await
            {
                tracing::debug!(%error, "closing a spare channel failed");
            }
        });
    }
}

/// A channel handed to one batch.
struct Checkout {
    connection: Arc<Connection>,
    channel: Channel,
    /// The [`Session::generation`] it belongs to.
    generation: u64,
    /// Opened for this batch (not reused): a channel error on it can only
    /// come from this batch's messages.
    fresh: bool,
}

/// Notes a `basic.return` by the message id it carries: its outcome.
/// `312 NO_ROUTE` is [`PublishOutcome::Unroutable`] (the relay's
/// `UnroutablePolicy` decides what it costs); any other code is
/// `Rejected`.
fn note_return(
    returned: &mut HashMap<String, PublishOutcome>,
    message: Option<lapin::message::BasicReturnMessage>,
) {
    if let Some(message) = message
        && let Some(id) = message.properties.message_id()
    {
        let outcome = if message.reply_code == NO_ROUTE {
            PublishOutcome::unroutable(format!(
                "returned by the broker as unroutable: {} {} (no queue is bound for routing \
                 key `{}` on exchange `{}`)",
                message.reply_code, message.reply_text, message.routing_key, message.exchange
            ))
        } else {
            PublishOutcome::rejected(format!(
                "returned by the broker: {} {} (exchange `{}`, routing key `{}`)",
                message.reply_code, message.reply_text, message.exchange, message.routing_key
            ))
        };
        returned.insert(id.to_string(), outcome);
    }
}

/// AMQP reply code of a mandatory message no queue is bound for.
const NO_ROUTE: u16 = 312;

/// Checks that `envelope`'s content header frame (its properties, headers
/// included, exactly as they are sent) fits `frame_max`.
fn header_frame_fits(
    envelope: &EventEnvelope,
    source: &str,
    frame_max: u32,
) -> std::result::Result<(), String> {
    let properties = wire::properties(envelope, source);
    let encoded = lapin::protocol::basic::gen_properties(&properties)(Vec::new().into())
        .map(|written| written.position)
        .map_err(|err| format!("its properties cannot be encoded: {err}"))?;
    // Frame type (1), channel (2), size (4), class (2), weight (2), body
    // size (8), the properties, frame end (1).
    let frame = encoded.saturating_add(20);
    if frame > u64::from(frame_max) {
        return Err(format!(
            "its header frame (properties and headers) is {frame} bytes; the connection's \
             frame_max is {frame_max}: fewer or shorter headers are needed"
        ));
    }
    Ok(())
}

/// Sorts a lapin error into "connection lost" (spends nothing), "the
/// connection died under this message" (spends nothing, but makes it a
/// suspect) or "the broker closed the channel" (a message caused it: narrow
/// it down). `sent` tells whether the message went out (the error is its
/// confirm's) or not (the error is its `basic.publish`'s).
///
/// A connection closed by the broker is sorted by its reply code: 501
/// (frame error), 502 (syntax error) and 505 (unexpected frame) are about
/// a frame this publisher sent, so about a message (narrow it down, as for
/// a channel error); 541 (internal error) may be a message's too (a broker
/// plugin failing on it), so the messages in flight are
/// [`PublishOutcome::ConnectionDied`]; 320 (forced: an operator or a
/// broker shutting down) and the other codes are the broker's (connection
/// lost). A connection that ended without a reply code (an I/O error, an
/// abrupt close: e.g. a proxy that drops it on a message) is
/// `ConnectionDied` for the messages in flight, except when heartbeats
/// stopped (the broker or the network went silent, as for a confirm
/// timeout: connection lost).
fn classify(connection: &ConnectionStatus, err: &lapin::Error, sent: bool) -> Round {
    let lost = |reason: String| Round::Done(PublishOutcome::connection_lost(reason));
    let died = |reason: String| {
        if sent {
            Round::Done(PublishOutcome::connection_died(reason))
        } else {
            lost(reason)
        }
    };
    if let ErrorKind::ProtocolError(amqp) = err.kind()
        && let AMQPErrorKind::Hard(hard) = amqp.kind()
    {
        return match hard {
            AMQPHardError::FRAMEERROR
            | AMQPHardError::SYNTAXERROR
            | AMQPHardError::UNEXPECTEDFRAME => Round::ChannelClosed(format!(
                "the broker closed the connection because of a frame sent for this message: \
                 {} {}",
                amqp.get_id(),
                amqp.get_message()
            )),
            AMQPHardError::INTERNALERROR => died(format!(
                "the broker closed the connection with an internal error while this message \
                 was in flight: {amqp}"
            )),
            _ => lost(format!("connection closed by the broker: {amqp}")),
        };
    }
    if matches!(err.kind(), ErrorKind::MissingHeartbeatError) {
        return lost(format!("connection to RabbitMQ lost: {err}"));
    }
    // The broker's verdict on a channel (404, 406, ...) is about a message
    // even when the connection went down right after (lapin's close race,
    // see the type's docs): narrow it down, do not count it a suspect.
    if let ErrorKind::ProtocolError(amqp) = err.kind()
        && let AMQPErrorKind::Soft(_) = amqp.kind()
    {
        return Round::ChannelClosed(format!(
            "channel closed by the broker: {} {}",
            amqp.get_id(),
            amqp.get_message()
        ));
    }
    if !connection.connected() {
        return died(format!(
            "the connection to RabbitMQ died while this message was in flight: {err}"
        ));
    }
    match err.kind() {
        ErrorKind::ProtocolError(amqp) => match amqp.kind() {
            AMQPErrorKind::Soft(_) => Round::ChannelClosed(format!(
                "channel closed by the broker: {} {}",
                amqp.get_id(),
                amqp.get_message()
            )),
            AMQPErrorKind::Hard(_) => lost(format!("connection closed by the broker: {amqp}")),
        },
        ErrorKind::InvalidChannelState(..) | ErrorKind::InvalidChannel(_) => {
            Round::ChannelClosed(format!("channel closed by the broker: {err}"))
        }
        ErrorKind::IOError(_) => died(format!(
            "the connection to RabbitMQ failed while this message was in flight: {err}"
        )),
        _ => lost(format!("connection to RabbitMQ failed: {err}")),
    }
}

impl Publisher for LapinPublisher {
    async fn publish(
        &self,
        events: &[&EventEnvelope],
        deadline: Option<std::time::Instant>,
    ) -> Vec<PublishOutcome> {
        // Confirms are awaited until the confirm timeout, or the claim's
        // deadline if that comes first (past it, nothing could be marked).
        let claim_deadline = deadline.map(Instant::from_std);
        let mut outcomes: Vec<Option<PublishOutcome>> = vec![None; events.len()];
        // What cannot go on the wire at all is rejected without sending.
        let mut targets: Vec<(String, String)> = Vec::with_capacity(events.len());
        let mut sendable: Vec<usize> = Vec::with_capacity(events.len());
        for (i, envelope) in events.iter().enumerate() {
            match self.target(envelope) {
                Ok(target) => {
                    targets.push(target);
                    sendable.push(i);
                }
                Err(reason) => {
                    tracing::warn!(event_id = %envelope.id, %reason, "event cannot be published");
                    outcomes[i] = Some(PublishOutcome::unpublishable(reason));
                    targets.push(Default::default());
                }
            }
        }
        // Groups of indexes still to publish; the first is the whole batch.
        let mut groups: Vec<Vec<usize>> = vec![sendable];
        let mut first = true;
        while let Some(group) = groups.pop() {
            if group.is_empty() {
                continue;
            }
            // Each batch in flight has a channel of its own, so the relay's
            // concurrent batches overlap (one sends while another awaits
            // confirms) and a message that makes the broker close a channel
            // fails only its own batch. Narrowing such a failure down runs
            // on fresh channels. Batches in flight together never share an
            // aggregate (claims lock them), so per-aggregate order holds.
            let narrowing = !std::mem::replace(&mut first, false);
            let checkout = match self.checkout(narrowing).await {
                Ok(checkout) => checkout,
                Err(reason) => {
                    for i in groups.iter().flatten().chain(&group) {
                        outcomes[*i] = Some(PublishOutcome::connection_lost(reason.clone()));
                    }
                    break;
                }
            };
            // The header frame must fit the frame size negotiated on this
            // connection: a larger one makes RabbitMQ close the whole
            // connection (501), for every batch on it.
            let frame_max = checkout.connection.configuration().frame_max();
            let (group, oversized): (Vec<usize>, Vec<usize>) = group.into_iter().partition(|&i| {
                header_frame_fits(events[i], &self.inner.source, frame_max).is_ok()
            });
            for i in oversized {
                if let Err(reason) = header_frame_fits(events[i], &self.inner.source, frame_max) {
                    tracing::warn!(event_id = %events[i].id, %reason, "event cannot be published");
                    outcomes[i] = Some(PublishOutcome::unpublishable(reason));
                }
            }
            if group.is_empty() {
                self.checkin(checkout, true);
                continue;
            }
            let batch: Vec<&EventEnvelope> = group.iter().map(|&i| events[i]).collect();
            let batch_targets: Vec<&(String, String)> =
                group.iter().map(|&i| &targets[i]).collect();
            // Sending and confirming share one deadline.
            let deadline = claim_deadline
                .map_or(Instant::now() + self.inner.confirm_timeout, |claim| {
                    claim.min(Instant::now() + self.inner.confirm_timeout)
                });
            let pending = self
                .send(&checkout.channel, &batch, &batch_targets, deadline)
                .await;
            failpoints::hit(failpoints::AFTER_PUBLISH_BEFORE_CONFIRM);
            let sent = pending.len();
            let (mut rounds, mut clean) = self
                .confirm(
                    checkout.connection.status(),
                    &batch[..sent],
                    pending,
                    deadline,
                )
                .await;
            if sent < batch.len() {
                // The broker stopped reading: this connection is not used
                // again, and what was not sent spends nothing.
                let reason = format!(
                    "publishing did not complete within {:?}: RabbitMQ stopped reading \
                     (TCP backpressure, e.g. a memory or disk alarm raised mid-batch)",
                    self.inner.confirm_timeout
                );
                self.discard(checkout.generation, &reason);
                clean = false;
                rounds.extend(
                    (sent..batch.len())
                        .map(|_| Round::Done(PublishOutcome::connection_lost(reason.clone()))),
                );
            }
            let fresh = checkout.fresh;
            self.checkin(checkout, clean);
            let mut closed = Vec::new();
            let mut closed_reason = String::new();
            for (&i, round) in group.iter().zip(rounds) {
                match round {
                    Round::Done(outcome) => outcomes[i] = Some(outcome),
                    Round::ChannelClosed(reason) => {
                        closed.push(i);
                        closed_reason = reason;
                    }
                }
            }
            match closed.len() {
                0 => {}
                1 => {
                    // Alone on a fresh channel and still closing it: the
                    // culprit. (On a reused channel, try it once more on a
                    // fresh one.)
                    if group.len() == 1 && fresh {
                        outcomes[closed[0]] = Some(PublishOutcome::rejected(closed_reason));
                    } else {
                        groups.push(closed);
                    }
                }
                n => {
                    let right = closed.split_off(n / 2);
                    groups.push(right);
                    groups.push(closed);
                }
            }
        }
        outcomes
            .into_iter()
            .map(|o| o.unwrap_or_else(|| PublishOutcome::connection_lost("not published")))
            .collect()
    }

    /// The exchange and routing key: the relay's circuit breaker for
    /// unconfirmed messages works per exchange and routing key, so one
    /// stuck queue delays only the events routed to it.
    fn destination(&self, event: &EventEnvelope) -> String {
        format!(
            "exchange `{}` routing key `{}`",
            self.exchange(event),
            self.routing_key(event)
        )
    }
}
