//! RabbitMQ adapter of the `outbox` transactional outbox, on lapin: the
//! relay's [`LapinPublisher`] (publisher confirms) and the inbox-aware
//! [`InboxConsumer`].
//!
//! # Relay: PostgreSQL outbox → RabbitMQ
//! ```no_run
//! use outbox_core::Relay;
//! use outbox_diesel::PgOutboxStore;
//! use outbox_lapin::LapinPublisher;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let db = "postgres://postgres@127.0.0.1:5432/shop";
//! let store = PgOutboxStore::builder(outbox_diesel::pool(db, 4)?)
//!     .listen(db) // wake on NOTIFY (direct connection)
//!     .build()?;
//! let publisher = LapinPublisher::builder("amqp://guest:guest@127.0.0.1:5672/%2f")
//!     .exchange("shop.events") // durable topic exchange, declared on connect
//!     .source("/shop") // cloudEvents:source
//!     .build()?;
//! publisher.connect().await?; // fail fast on a bad URL
//! let relay = Relay::builder(store, publisher).build()?;
//! let handle = relay.handle(); // notify() after commits; shutdown() on SIGTERM
//! tokio::spawn(relay.run());
//! # let _ = handle; Ok(()) }
//! ```
//!
//! # Consumer: RabbitMQ → handler, once per event
//! Declare a queue with its bindings and dead-letter queue with
//! [`QueueTopology`], and run an [`InboxConsumer`] with an
//! [`EventHandler`]; see its docs for a complete example. With
//! `outbox-diesel`, the database is `PgInboxDatabase` and handlers get a
//! `PgTransaction` (a `&mut AsyncPgConnection`) on which they can also record
//! new outbox events: those inherit `causation_id` = the incoming event id,
//! and its correlation id and trace context (with the `opentelemetry`
//! feature, the context of the consumer's `process` span, a child of the
//! producer's; see [`InboxConsumer`]'s *Observability*).
//!
//! Each delivery is one transaction (inbox entry, handler, commit) and then
//! an ack, so a consumer applies at most about as many events per second as
//! its database commits transactions, whatever its concurrency. Past that,
//! turn on [batch mode](InboxConsumerBuilder::batch)
//! (`.batch(max_deliveries, max_wait)`): a worker applies the deliveries
//! waiting for it in one transaction and acks them after the commit, each
//! event still deduplicated by the inbox. Handlers must then not assume one
//! transaction per event, and a failure in a batch costs a rollback and a
//! replay of its deliveries one at a time (which gives the failing one its
//! usual retry or dead letter).
//!
//! # RabbitMQ cluster
//! Give the publisher and the consumer every node's URL: a comma-separated
//! string (`AMQP_URL=amqp://…@rabbit-1/%2f,amqp://…@rabbit-2/%2f`), a
//! `Vec` or an array; see [`AmqpUrls`] for the order they are tried in.
//! Declare the queues as quorum queues
//! ([`QueueTopology::queue_type`]`(`[`QueueType::Quorum`]`)`), the
//! recommended type: replicated, they survive the loss of a minority of
//! nodes. Publisher confirms stay the only proof of delivery: with a quorum
//! queue the broker confirms once a majority of its members has the
//! message. The repository's `docs/clusters.md` ("RabbitMQ cluster") says
//! what a node loss costs, as measured by the fault suite.
//!
//! # Dead letters
//! What the consumer gives up on (an undecodable message, a permanent
//! error, `max_attempts` spent) goes to its dead-letter exchange with
//! `x-outbox-dead-reason` and `x-outbox-queue` (its queue), and is recorded
//! in its database
//! ([`InboxDatabase::record_dead_letter`](outbox_core::InboxDatabase::record_dead_letter);
//! with `outbox-diesel`, the table `inbox_dead_letters`, read with
//! `PgDeadLetters`) once the broker confirmed the copy, before the ack.
//! List and group them from the database: getting and requeueing messages
//! reorders them, or drops them on some queue types.
//!
//! [`DeadLetterQueue::replay`] sends them back, one at a time, through the
//! default exchange to the queue each came from (never to the original
//! exchange, which would deliver it again to every other subscriber), with
//! the attempt count reset. **A replay never loses a message, even if it
//! dies half way**: each dead letter is acked only after the broker
//! confirmed its copy in the origin queue, so every message is in the
//! dead-letter queue, in its origin queue, or (killed between the two) in
//! both, and the consumer's inbox drops the second copy. A message that
//! cannot go back (no known origin, origin queue deleted) stays where it is
//! and the replay stops, saying which and why. [`DeadLetterQueue::purge`]
//! empties the queue.
//!
//! # Guarantees and failure behaviour
//! | situation | publisher | consumer |
//! |---|---|---|
//! | broker confirms (`basic.ack`) | event marked `Sent` | – |
//! | unroutable (`312 NO_ROUTE` return: no queue bound for the routing key) | the relay's `UnroutablePolicy` for its event type: by default held (`Retry`, no attempt spent, tried again with a capped backoff, `Dead` after 7 days), or attempts spent, or accepted as sent. For "publish before anyone subscribes", give the exchange an alternate exchange bound to a parking queue | – |
//! | `basic.nack` | attempt spent, retried with backoff, `Dead` at the limit | – |
//! | no confirm in time | no attempt spent: the relay pauses, or holds that destination back behind a circuit breaker | – |
//! | channel closed by the broker for a message (404 exchange, 406) | narrowed to that message (bisect), attempt spent; the rest of the batch is published | – |
//! | connection lost or `connection.blocked` | no attempt spent; relay pauses, reconnects on the next batch | reconnects with backoff; unacked deliveries come back and dedup in the inbox |
//! | connection dies under messages in flight without a reply code (I/O error, abrupt close: e.g. a proxy dropping it on one message) | no attempt spent; relay pauses as above, and counts those messages as suspects: each is then published alone, and one the connection dies with alone ends `Dead` at the relay's `suspect_limit` (default 3) | – |
//! | duplicate delivery | – | inbox says duplicate: acked, handler not run |
//! | handler error | – | rolled back; republished with `x-outbox-attempt` + 1 after `retry_delay`; dead-lettered after `max_attempts` with `x-outbox-dead-reason` and `x-outbox-queue`, and recorded in the database |
//! | undecodable message | – | dead-lettered at once with the reason, and recorded |
//! | dead-letter replay killed half way | – | nothing lost: a message is acked in the dead-letter queue only after its copy is confirmed in its queue; one caught in between is in both, the inbox drops the duplicate |
//! | crash between commit and ack | – | redelivered, detected as duplicate |
//! | failure in a [batch](InboxConsumerBuilder::batch) (handler error or panic, inbox, commit) | – | the batch's transaction rolled back; its deliveries applied again one at a time, each as without batching (no attempt spent for the batch) |
//! | shutdown with a batch open | – | rolled back before its next event; its deliveries returned to the queue unacked |
//!
//! Delivery is at least once; with the inbox, effects are exactly once.
//! Keep inbox rows at least as long as the broker may redeliver a message
//! (see `outbox_diesel::PgInbox`).
//!
//! The wire format is in [`wire`].
//!
//! # Tracing (feature `opentelemetry`)
//! With an OpenTelemetry layer (`tracing-opentelemetry`) installed, the
//! relay and the publisher make one trace of each event, from the request
//! that recorded it to the broker:
//!
//! ```text
//! POST /orders (the request; its context is recorded with the event)
//! └── publish shop.events        producer, one per message, child of the recorded context
//!                                 links: the recorded context, the relay's batch span
//! send                            client, the relay's batch (outbox.relay.batch), a trace of its own
//! ```
//!
//! - **`publish {exchange}`** (kind producer): opened when the relay hands
//!   the message over, closed when its outcome is known (across the
//!   narrowing rounds of a channel error); any outcome but a confirm sets
//!   `otel.status_code = ERROR` with the reason. Its parent is the context
//!   recorded with the event, so sampling follows the request's decision;
//!   it is linked to that context and to the relay's batch span (current
//!   while the relay publishes). Attributes: `messaging.system = rabbitmq`,
//!   `messaging.operation.name = publish`, `messaging.operation.type = send`,
//!   `messaging.destination.name` (the exchange),
//!   `messaging.rabbitmq.destination.routing_key`, `messaging.message.id`
//!   (the event id) and `messaging.message.conversation_id` (the correlation
//!   id, when set).
//! - **The message carries the `publish` span's context** (`traceparent`,
//!   `tracestate`; the recorded baggage), not the recorded one, so the
//!   consumer's span is a child of the publish.
//! - **`send`** (kind client): the relay's `outbox.relay.batch` span, with
//!   `messaging.operation.type = send` and `messaging.batch.message_count`.
//!
//! Without an OpenTelemetry layer (or without the feature) the recorded
//! trace context is forwarded unchanged, and without the feature nothing of
//! OpenTelemetry is compiled and no span is opened per message. With or
//! without it, a malformed `traceparent`, `tracestate` or `baggage` is never
//! forwarded (see [`wire`]).
//!
//! # Feature flags
//! | feature | default | enables |
//! |---|---|---|
//! | `tls` | no | `amqps://` with rustls and the `ring` provider |
//! | `opentelemetry` | no | a `publish` span per message (see above), its context sent with the message (`outbox-core/opentelemetry`) |

mod connection;
mod consumer;
mod dlq;
mod error;
mod headers;
mod publisher;
mod topology;
mod urls;
pub mod wire;

pub use connection::CONNECT_TIMEOUT;
pub use consumer::{
    EventHandler, HandlerError, HandlerFn, HandlerFuture, InboxConsumer, InboxConsumerBuilder,
    handler_fn, metric_names as consumer_metrics,
};
pub use dlq::{DeadLetterQueue, DeadLetterQueues};
pub use error::{Error, Result};
pub use headers::{
    ATTEMPT_HEADER, DEAD_LETTER_ID_HEADER, DEAD_REASON_HEADER, LAST_ERROR_HEADER,
    ORIGINAL_EXCHANGE_HEADER, ORIGINAL_ROUTING_KEY_HEADER, QUEUE_HEADER, REPLAYED_REASON_HEADER,
};
pub use outbox_core::admin::{
    DlqReplayReport, QueueDepth, ReplayedMessage, SkippedMessage, StopCause,
};
pub use publisher::{
    BLOCKED_GAUGE, ExchangeFn, LapinPublisher, LapinPublisherBuilder, RoutingKeyFn,
};
pub use topology::{QueueTopology, QueueType, declare_exchange};
pub use urls::AmqpUrls;
pub use wire::{DecodeError, IncomingEvent};
