//! [`InboxConsumer`]: consumes a queue and runs a handler per event inside a
//! database transaction that also records the event in the inbox, so each
//! event takes effect once even though RabbitMQ delivers at least once.
//!
//! This file holds the type, what it promises (its docs), its settings and
//! the header names it writes; the parts:
//! - `run.rs`: [`InboxConsumer::run`]: the workers, sessions opened again
//!   with a backoff after a loss, and the graceful shutdown;
//! - `session.rs`: one connection's worth of consuming, opened (topology
//!   declared, dead-letter exchange checked, subscription made);
//! - `dispatch.rs`: deliveries decoded and handed to the worker of their
//!   aggregate;
//! - `worker/`: one delivery handled (inbox, handler, commit, ack), or in
//!   batch mode several in one transaction;
//! - `handler.rs`, `builder.rs`: [`EventHandler`] and
//!   [`InboxConsumerBuilder`];
//! - `republish.rs`, `dead_letter.rs`: retries and dead letters republished
//!   with confirms, and dead letters recorded;
//! - `depth.rs`, [`metrics`]: the dead-letter queue's depth and the metric
//!   names.

mod builder;
mod dead_letter;
mod depth;
mod dispatch;
mod handler;
pub mod metric_names;
pub(crate) mod republish;
mod run;
mod session;
mod worker;

use std::fmt;
use std::time::Duration;

use outbox_core::InboxDatabase;

pub use builder::InboxConsumerBuilder;
pub use handler::{EventHandler, HandlerError, HandlerFn, HandlerFuture, handler_fn};

use crate::AmqpUrls;
use crate::QueueTopology;

/// Consumes a RabbitMQ queue and applies each event once, in a database
/// transaction with an inbox entry.
///
/// ```no_run
/// use std::time::Duration;
///
/// use outbox_core::testing::{InMemoryInbox, InboxTx};
/// use outbox_lapin::{EventHandler, HandlerError, InboxConsumer, IncomingEvent, QueueTopology};
///
/// // In production the database is `outbox_diesel::PgInboxDatabase` (`outbox::postgres`),
/// // whose transaction (`PgTransaction`) is a `&mut AsyncPgConnection` for your queries.
/// struct AwardPoints;
///
/// impl EventHandler<InboxTx> for AwardPoints {
///     async fn handle(&self, _tx: &mut InboxTx, event: &IncomingEvent) -> Result<(), HandlerError> {
///         #[derive(serde::Deserialize)]
///         struct OrderPlaced { total_cents: i64 }
///         let order: OrderPlaced = event.payload_as().map_err(HandlerError::permanent)?;
///         tracing::info!(points = order.total_cents / 100, "awarding");
///         // ... write the points on the transaction; the consumer commits it ...
///         Ok(())
///     }
/// }
///
/// # async fn run() -> outbox_lapin::Result<()> {
/// let consumer = InboxConsumer::builder(
///     "amqp://guest:guest@127.0.0.1:5672/%2f",
///     "loyalty.orders",  // queue
///     "loyalty",         // consumer name: keys the inbox, names the connection
///     InMemoryInbox::new(),
///     AwardPoints,
/// )
/// .declare(QueueTopology::new("loyalty.orders").exchange("shop").bind("order.placed"))
/// .max_attempts(5)
/// .retry_delay(Duration::from_secs(2))
/// .concurrency(4)
/// .build()?;
///
/// // Runs until `stop` fires (wire it to SIGTERM, e.g. with `tokio::signal`),
/// // then finishes the deliveries in hand and returns.
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let running = tokio::spawn(consumer.run(async {
///     let _ = stopped.await;
/// }));
/// // ...
/// let _ = stop.send(());
/// if let Ok(result) = running.await {
///     result?;
/// }
/// # Ok(())
/// # }
/// ```
///
/// # Per delivery
/// 1. **Decode** the message with [`wire::decode`]. One that is not a valid
///    event (not JSON, no `message_id`, missing headers) can never succeed:
///    it is republished unchanged (body and properties) to the dead-letter
///    exchange with the header `x-outbox-dead-reason`, and the original is
///    acked. The handler does not run.
/// 2. **Begin** a transaction and record `(consumer name, event id)` in the
///    inbox ([`InboxDatabase::receive`]).
/// 3. **Duplicate** (already committed earlier): ack without running the
///    handler.
/// 4. **First time**: run the [`EventHandler`] on the transaction, inside
///    [`outbox_core::context::scope`] with `causation_id` = the incoming
///    event id plus its `correlation_id`, `traceparent` and `tracestate`
///    (and `baggage` when this process [carries
///    baggage](outbox_core::trace_context::carry_baggage)), so events the
///    handler records carry them; with the `opentelemetry` feature they carry
///    the `process` span's context instead (see *Observability*). A malformed
///    incoming `traceparent` or `tracestate` is dropped with a warning:
///    neither a parent nor carried on. Then **commit**, and only then
///    **ack**. With `outbox_diesel::PgInboxDatabase` the commit is a real
///    top-level `COMMIT` of a healthy transaction or an error
///    (`outbox_diesel::commit_top_level`): a handler that returned `Ok`
///    after swallowing a failed statement (PostgreSQL aborted the
///    transaction) or with a nested transaction left open is a failed
///    attempt, retried like a handler error, never acked with its effects
///    rolled back.
///
/// A crash (or lost connection) after the commit and before the ack makes
/// the broker redeliver the message; the inbox then says duplicate and the
/// handler does not run again. That is the whole guarantee: **effects in the
/// transaction happen exactly once**, other effects at least once.
///
/// # Retries and dead letters
/// When the handler (or the commit) fails, the
/// transaction rolls back — inbox entry included — and the worker waits
/// [`retry_delay`](InboxConsumerBuilder::retry_delay), then republishes the
/// message (body and properties) to the same queue through the default
/// exchange with `x-outbox-attempt` + 1 and `x-outbox-last-error`, waits for
/// the broker's confirm, and acks the original. After
/// [`max_attempts`](InboxConsumerBuilder::max_attempts), or at once for a
/// [permanent](HandlerError::permanent) error, it republishes to the
/// dead-letter exchange instead (original routing key, see
/// [`ORIGINAL_ROUTING_KEY_HEADER`](crate::ORIGINAL_ROUTING_KEY_HEADER), `x-outbox-dead-reason`,
/// `x-outbox-attempt`, [`QUEUE_HEADER`](crate::QUEUE_HEADER)). Once a dead letter is confirmed,
/// it is recorded with
/// [`InboxDatabase::record_dead_letter`](outbox_core::InboxDatabase::record_dead_letter)
/// before the ack (a failure to record is logged at WARN, and the delivery
/// acked anyway). [`DeadLetterQueue`](crate::DeadLetterQueue) replays them.
/// If a republish is not
/// confirmed (nack, return, timeout, lost channel), the original is not
/// acked but requeued after the delay: a message is never dropped.
///
/// Why a header: classic queues do not count redeliveries (`redelivered` is
/// only a flag), so the attempt travels with the message. Quorum queues
/// count deliveries (`x-delivery-count`), but a retry here is a new message
/// (acked, republished), so the broker's count measures something else:
/// deliveries that came back unacked (lost connections, a killed consumer).
/// A quorum queue's [`QueueTopology::delivery_limit`] is a backstop against
/// a message that crashes the consumer, not the retry accounting; see its
/// docs.
///
/// When the database is unavailable before the handler runs (the
/// transaction cannot begin, or the inbox entry cannot be written), nothing
/// of the message was tried: the worker waits the retry delay and tries the
/// same delivery again, **without spending an attempt** and without
/// republishing, until the database answers (or shutdown returns the
/// message to the queue). A database failover therefore never
/// dead-letters messages; the counter
/// [`DATABASE_UNAVAILABLE_TOTAL`](metric_names::DATABASE_UNAVAILABLE_TOTAL)
/// shows the outage. A database that fails *inside* the handler or at
/// commit spends one attempt per worker.
///
/// The worker waits out the delay itself, so when everything fails the
/// consumer slows to one attempt per delay per worker instead of burning
/// through the attempts of the whole queue. A
/// retried message goes to the back of the queue: later events of the same
/// aggregate may be handled before it. Handlers that must see an
/// aggregate's events in order should check
/// [`aggregate_version`](crate::IncomingEvent::aggregate_version).
///
/// # Concurrency and order
/// By default one delivery is handled at a time, in queue order. With
/// [`concurrency(n)`](InboxConsumerBuilder::concurrency), `n` workers run
/// in parallel and each delivery goes to the worker chosen by a hash of its
/// aggregate type and id: one aggregate's events stay sequential, in queue
/// order, different aggregates overlap. Acks are then individual and out of
/// order (never `multiple`).
///
/// # Batch mode
/// Off by default. With [`batch(max_deliveries, max_wait)`](InboxConsumerBuilder::batch)
/// each worker applies the deliveries waiting for it, up to
/// `max_deliveries` (waiting at most `max_wait` after the first for more),
/// in **one** transaction: the inbox entries of all its events (one
/// [`receive_all`](InboxDatabase::receive_all) call, one statement on
/// PostgreSQL), then the handler for each event seen for the first time,
/// in queue order, then one commit, then an individual ack per delivery.
/// Use it when the consumer must apply events faster than the database
/// commits transactions. An event already in the inbox is skipped as
/// above; the same event twice in one batch is applied once. Any failure
/// (a handler error or panic, the inbox insert, the commit) rolls the whole
/// batch back, and its deliveries then take the per-delivery path above one
/// at a time, each in its own transaction: the healthy ones are applied,
/// the failing one is retried or dead-lettered exactly as without
/// batching. The cost of a failure is one wasted transaction (and the
/// handler calls in it run again). Shutdown rolls an open batch back before
/// its next event and returns its deliveries to the queue.
///
/// # Connection loss
/// The consumer logs the loss, reconnects with a backoff (100 ms doubling to
/// 10 s by default) and resumes. Unacked deliveries are redelivered by the
/// broker and deduplicated by the inbox. At start, a queue or dead-letter
/// exchange that does not exist (`404`), or a refused declaration (`403`,
/// `406`), stops [`run`](Self::run) with the error instead: a configuration
/// mistake does not heal by waiting. Once the consumer has run, the same
/// errors while reconnecting are logged and retried with the backoff: a
/// restarting broker answers `404` for queues it has not recovered yet.
///
/// # Shutdown
/// When the `shutdown` future passed to [`run`](Self::run) completes, the
/// consumer cancels its subscription, lets each worker finish the delivery
/// it is handling (a pending retry delay is cut short), returns deliveries
/// not yet started to the queue, closes the connection and returns. A
/// handler that never returns holds shutdown up: bound slow work (HTTP
/// calls, locks) with timeouts inside the handler. In batch mode the
/// worker does not finish its batch: it rolls it back before the next
/// event and returns the batch's deliveries to the queue.
///
/// # Inbox retention
/// Keep inbox rows at least as long as the broker may deliver a message
/// again: the longest a message can stay unacked or cycle through retries
/// (`max_attempts` × (`retry_delay` + queueing time)), plus how long a
/// producer may publish a duplicate (its relay's claim timeout and retries),
/// plus how long dead letters may be moved back to the queue by an operator
/// (a [replay](crate::DeadLetterQueue::replay) of a message whose inbox
/// entry was purged runs it again if it had succeeded meanwhile).
/// Purge older rows (e.g. `PgInbox::purge`); purge younger ones and a late
/// duplicate is applied twice.
///
/// # Observability
/// Each delivery runs in a `tracing` span `outbox.consume` (consumer, event
/// id and type, aggregate, attempt, and `trace_id`: the trace id of the
/// incoming `traceparent`, so every log line of the handling shows it); in
/// batch mode each handler call has its own `outbox.consume` span, inside
/// one `outbox.consume_batch` span (consumer, deliveries) per batch, whose
/// size is the histogram [`BATCH_SIZE`](metric_names::BATCH_SIZE). Counters
/// and histograms are listed in [`metrics`], among them the handler's
/// duration ([`HANDLER_DURATION_SECONDS`](metric_names::HANDLER_DURATION_SECONDS))
/// and the time from raise to handled
/// ([`RAISE_TO_HANDLED_SECONDS`](metric_names::RAISE_TO_HANDLED_SECONDS),
/// which compares the producer's clock with the consumer's), as is the gauge
/// [`DEAD_LETTERS`](metric_names::DEAD_LETTERS): the depth of the
/// dead-letter queue, read every 15 s when the consumer
/// [declares](InboxConsumerBuilder::declare) a topology with one.
///
/// ## OpenTelemetry
/// With the `opentelemetry` feature and a `tracing-opentelemetry` layer, the
/// `outbox.consume` span is the OpenTelemetry `process` span of the
/// messaging semantic conventions:
///
/// | | |
/// |---|---|
/// | name | `process {queue}` |
/// | kind | consumer |
/// | `messaging.system` | `rabbitmq` |
/// | `messaging.operation.name`, `messaging.operation.type` | `process` |
/// | `messaging.destination.name` | the exchange the message first arrived through |
/// | `messaging.destination.subscription.name` | the queue |
/// | `messaging.rabbitmq.destination.routing_key` | the routing key it first arrived with |
/// | `messaging.message.id` | the event id |
/// | `messaging.message.conversation_id` | the correlation id, when set |
/// | `messaging.consumer.group.name` | the consumer name |
/// | status | error when the handler (or the commit) failed, with the error as description |
///
/// By default it is a child of the producer's context the message carries
/// (`traceparent`, `tracestate`, and `baggage` when carried), so one order
/// is one trace from the HTTP request through the relay's `publish` span to
/// this span and the events the handler records, and sampling follows the
/// producer's decision. With [`trace_links`](InboxConsumerBuilder::trace_links)
/// it starts a new trace linked to that context instead. In batch mode the
/// batch has its own span `outbox.consume_batch` (kind consumer,
/// `messaging.batch.message_count`): each `process` span is a child of its
/// producer linked to the batch's span (a message without a trace context:
/// a child of the batch's span); with `trace_links` each is a child of the
/// batch's span, linked to its producer. Without the feature
/// `trace_links` does nothing, and the spans carry none of these fields.
///
/// ```text
/// POST /orders                        (the producer's request span)
/// └─ publish shop                     (the relay, kind producer)
///    └─ process loyalty.orders        (this consumer, kind consumer)
///       └─ publish shop               (an event the handler recorded, relayed)
///          └─ process …
/// ```
///
/// [`wire::decode`]: crate::wire::decode
pub struct InboxConsumer<D, H> {
    settings: Settings,
    db: D,
    handler: H,
}

/// Validated settings, shared by the run loop and the workers.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) urls: AmqpUrls,
    pub(crate) queue: String,
    pub(crate) name: String,
    pub(crate) prefetch: u16,
    pub(crate) concurrency: usize,
    pub(crate) max_attempts: u32,
    pub(crate) retry_delay: Duration,
    pub(crate) dead_letter_exchange: String,
    /// The queue behind the dead-letter exchange, when the consumer knows
    /// it (from its declared topology): its depth is exported.
    pub(crate) dead_letter_queue: Option<String>,
    pub(crate) confirm_timeout: Duration,
    pub(crate) reconnect_min: Duration,
    pub(crate) reconnect_max: Duration,
    pub(crate) topology: Option<QueueTopology>,
    /// Batch mode ([`InboxConsumerBuilder::batch`]); `None`: one delivery
    /// per transaction.
    pub(crate) batch: Option<Batching>,
    /// [`InboxConsumerBuilder::trace_links`]: the `process` span links to
    /// the producer's context instead of continuing its trace.
    #[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
    pub(crate) trace_links: bool,
}

/// How a worker gathers deliveries into one transaction in batch mode.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Batching {
    /// At most this many deliveries per transaction.
    pub(crate) max_deliveries: usize,
    /// How long a worker waits for more after the first, when fewer than
    /// `max_deliveries` are already in hand.
    pub(crate) max_wait: Duration,
}

impl<D, H> fmt::Debug for InboxConsumer<D, H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        f.debug_struct("InboxConsumer")
            .field("urls", &s.urls)
            .field("queue", &s.queue)
            .field("name", &s.name)
            .field("prefetch", &s.prefetch)
            .field("concurrency", &s.concurrency)
            .field("max_attempts", &s.max_attempts)
            .field("retry_delay", &s.retry_delay)
            .field("dead_letter_exchange", &s.dead_letter_exchange)
            .field("dead_letter_queue", &s.dead_letter_queue)
            .field("batch", &s.batch)
            .field("trace_links", &s.trace_links)
            .finish_non_exhaustive()
    }
}

impl<D, H> InboxConsumer<D, H>
where
    D: InboxDatabase,
    H: EventHandler<D::Tx>,
{
    /// A builder for a consumer of `queue` on the broker at `urls`: one
    /// URL, or one per node of a cluster (a comma-separated string, a `Vec`
    /// or an array; see [`AmqpUrls`] for the order they are tried in).
    /// `consumer_name` keys the inbox (keep it stable across deployments;
    /// two services reading the same events need different names) and names
    /// the AMQP connection.
    pub fn builder(
        urls: impl Into<AmqpUrls>,
        queue: impl Into<String>,
        consumer_name: impl Into<String>,
        db: D,
        handler: H,
    ) -> InboxConsumerBuilder<D, H> {
        InboxConsumerBuilder::new(urls.into(), queue.into(), consumer_name.into(), db, handler)
    }

    /// The consumer name (inbox key and connection name).
    pub fn name(&self) -> &str {
        &self.settings.name
    }

    /// The queue it consumes.
    pub fn queue(&self) -> &str {
        &self.settings.queue
    }
}
