//! [`DeadLetterQueue`]: replay a consumer's dead letters back to the queue
//! they came from, or purge them.
//!
//! Listing is not here: getting messages and requeueing them reorders them
//! (and on some queue types drops them), so dead letters are listed from the
//! database the consumer records them in
//! ([`InboxDatabase::record_dead_letter`](outbox_core::InboxDatabase::record_dead_letter);
//! in PostgreSQL `outbox_diesel::PgDeadLetters`).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, Consumer};
use outbox_core::admin::{
    DeadLetterBroker, DeadLetterSession, DlqReplay, DlqReplayReport, QueueDepth, ReplayedMessage,
    SkippedMessage, StopCause,
};
use uuid::Uuid;

use crate::consumer::republish::{RepublishError, Republisher};
use crate::error::{bounded, connect, redact_url};
use crate::topology::short_string;
use crate::wire::header_str;
use crate::{
    ATTEMPT_HEADER, DEAD_LETTER_ID_HEADER, DEAD_REASON_HEADER, ORIGINAL_ROUTING_KEY_HEADER,
    QUEUE_HEADER, Result,
};

/// Header: on a replayed message, why it had been dead-lettered (the
/// `x-outbox-dead-reason` it carried).
pub const REPLAYED_REASON_HEADER: &str = "x-outbox-replayed-reason";

/// The default bound of each broker call: 10 s.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// A dead-letter queue (e.g. [`QueueTopology`](crate::QueueTopology)'s
/// `<queue>.dead`), to replay or purge.
///
/// ```no_run
/// use outbox_lapin::DeadLetterQueue;
///
/// # async fn run() -> outbox_lapin::Result<()> {
/// let mut dlq =
///     DeadLetterQueue::connect("amqp://guest:guest@127.0.0.1:5672/%2f", "loyalty.orders.dead")
///         .await?;
/// println!("{} dead letters", dlq.depth().await?);
/// let report = dlq.replay(Some(100), &|n| eprintln!("{n} taken")).await?;
/// if let Some(error) = &report.error {
///     eprintln!("stopped: {error}");
/// }
/// dlq.close().await?;
/// # Ok(()) }
/// ```
///
/// To mark the records of what moved and write an audit row, replay
/// through [`outbox_core::admin::DeadLetters`] over [`DeadLetterQueues`]
/// instead (what the `outbox` CLI and the admin router do).
///
/// # Replay
/// The replay first becomes the queue's only reader: an exclusive consumer
/// with a prefetch of one, held until [`close`](Self::close), so two
/// replays of one queue never run at once (the second is refused) and
/// nothing else takes messages meanwhile. Then one message at a time: it
/// publishes a copy through the default exchange straight to the queue the
/// message was dead-lettered from (`mandatory`, on a confirm channel),
/// waits for the broker's confirm, and only then acks the dead letter.
/// Never to the original exchange, which would fan it out to every other
/// subscriber again. The origin is the [`QUEUE_HEADER`] the consumer sets,
/// else the first `x-death` entry's queue (messages the broker itself
/// dead-lettered). The copy keeps body and properties but for the headers:
/// no `x-outbox-attempt` (the consumer starts over at attempt 1), and
/// `x-outbox-dead-reason` moved to [`REPLAYED_REASON_HEADER`].
///
/// **Nothing is lost if it dies half way**: a message is acked only after
/// its copy is confirmed, so a crash leaves each message either in the
/// dead-letter queue, or in its origin queue, or (crash between confirm and
/// ack) in both: the consumer's inbox drops the second copy. The dead
/// letters that go back arrive in their origin queue in dead-letter-queue
/// order.
///
/// A message that cannot go back stops the replay there, returned to the
/// dead-letter queue at its place (the replay lets the queue go), with the
/// reason in
/// [`DlqReplayReport::error`] and [`StopCause::Unreplayable`]: one without
/// an origin, or whose copy the broker returns as unroutable (origin queue
/// gone). With
/// [`skip_unreplayable`](Self::skip_unreplayable) such a message moves to
/// the queue's tail instead (confirmed, then acked) and the replay goes on.
/// A message that carries no sign of having been dead-lettered (none of
/// [`QUEUE_HEADER`], `x-death`, [`DEAD_REASON_HEADER`]) always stops it:
/// the queue may be a live one. A broker failure (connection, channel, a
/// nack, no confirm in time, no delivery in time while messages are ready)
/// stops it with [`StopCause::Broker`].
///
/// On a quorum queue with a delivery limit, each stop returns the message
/// it stopped at, which may count as a delivery: fix the cause rather than
/// replaying into the same stop many times. (Quorum queues also take no
/// exclusive consumers: see [`claim`](Self::claim).)
pub struct DeadLetterQueue {
    connection: Arc<Connection>,
    republisher: Republisher,
    queue: String,
    url: String,
    timeout: Duration,
    skip_unreplayable: bool,
    /// The exclusive consumer, once the queue is claimed.
    reader: Option<Reader>,
}

/// An exclusive consumer of the queue, prefetch 1.
struct Reader {
    channel: Channel,
    consumer: Consumer,
}

impl fmt::Debug for DeadLetterQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetterQueue")
            .field("url", &redact_url(&self.url))
            .field("queue", &self.queue)
            .field("timeout", &self.timeout)
            .field("skip_unreplayable", &self.skip_unreplayable)
            .field("claimed", &self.reader.is_some())
            .finish_non_exhaustive()
    }
}

impl DeadLetterQueue {
    /// Connects to the broker at `url` for the dead-letter queue `queue`.
    /// The connection is named `outbox-dlq.<queue>`.
    ///
    /// # Errors
    /// [`Error::Connect`](crate::Error::Connect),
    /// [`Error::ConnectTimeout`](crate::Error::ConnectTimeout),
    /// [`Error::Config`](crate::Error::Config) for an invalid queue name,
    /// [`Error::Amqp`](crate::Error::Amqp) when the confirm channel cannot
    /// be opened.
    pub async fn connect(url: &str, queue: impl Into<String>) -> Result<Self> {
        let queue = queue.into();
        short_string("dead-letter queue name", &queue)?;
        let name = connection_name(&queue);
        let connection = Arc::new(connect(url, &name).await?);
        let republisher = Republisher::open(connection.clone(), DEFAULT_TIMEOUT).await?;
        Ok(DeadLetterQueue {
            connection,
            republisher,
            queue,
            url: url.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            skip_unreplayable: false,
            reader: None,
        })
    }

    /// Whether a [replay](Self::replay) moves a message it cannot send back
    /// (no known origin; its origin queue refuses it or is gone) to this
    /// queue's tail and goes on (reported in [`DlqReplayReport::skipped`]),
    /// instead of stopping there (default). The move is confirmed before
    /// the message is acked, as a replay is.
    #[must_use]
    pub fn skip_unreplayable(mut self, skip: bool) -> Self {
        self.skip_unreplayable = skip;
        self
    }

    /// The dead-letter queue's name.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The messages ready in the queue (a passive `queue.declare`).
    ///
    /// # Errors
    /// [`Error::Amqp`](crate::Error::Amqp) (`404` when the queue does not
    /// exist), [`Error::Timeout`](crate::Error::Timeout).
    pub async fn depth(&self) -> Result<u32> {
        Ok(u32::try_from(self.inspect().await?.ready).unwrap_or(u32::MAX))
    }

    /// The messages ready in the queue and its consumers (a passive
    /// `queue.declare`).
    ///
    /// # Errors
    /// [`Error::Amqp`](crate::Error::Amqp) (`404` when the queue does not
    /// exist), [`Error::Timeout`](crate::Error::Timeout).
    pub async fn inspect(&self) -> Result<QueueDepth> {
        let channel = self.channel().await?;
        let declared = bounded(
            &format!("read the depth of `{}` (passive queue.declare)", self.queue),
            self.timeout,
            channel.queue_declare(
                short_string("dead-letter queue name", &self.queue)?,
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            ),
        )
        .await?;
        close(channel, self.timeout).await;
        Ok(QueueDepth::new(
            u64::from(declared.message_count()),
            declared.consumer_count(),
        ))
    }

    /// Becomes the queue's only reader (an exclusive consumer, prefetch 1)
    /// until [`close`](Self::close); `false` when another consumer holds it
    /// (another replay, or a consumer of a queue that is not a dead-letter
    /// queue). RabbitMQ enforces exclusive consumers on classic queues
    /// only; on other queue types the claim checks that it is the queue's
    /// one consumer after it started, which two claims at the same instant
    /// can both pass. A [replay](Self::replay) claims the queue itself.
    ///
    /// # Errors
    /// [`Error::Amqp`](crate::Error::Amqp) (`404` when the queue does not
    /// exist), [`Error::Timeout`](crate::Error::Timeout).
    pub async fn claim(&mut self) -> Result<bool> {
        match self.reader().await {
            Ok(_) => {}
            // `403` also answers a user without the `read` permission: in
            // use only when the queue has a consumer.
            Err(crate::Error::Amqp { source, operation }) if in_use(&source) => {
                return if self.inspect().await?.consumers > 0 {
                    Ok(false)
                } else {
                    Err(crate::Error::Amqp { source, operation })
                };
            }
            Err(error) => return Err(error),
        }
        // Quorum and stream queues take no exclusive consumers: alone only
        // if no other consumer came with it.
        if self.inspect().await?.consumers > 1 {
            self.release().await;
            return Ok(false);
        }
        Ok(true)
    }

    /// The exclusive consumer, started on first use.
    async fn reader(&mut self) -> Result<&mut Reader> {
        if self.reader.is_none() {
            let channel = self.channel().await?;
            if let Err(error) = bounded(
                "set the prefetch of the dead-letter replay (basic.qos)",
                self.timeout,
                channel.basic_qos(1, BasicQosOptions::default()),
            )
            .await
            {
                close(channel, self.timeout).await;
                return Err(error);
            }
            let consumer = bounded(
                &format!("consume `{}` exclusively", self.queue),
                self.timeout,
                channel.basic_consume(
                    short_string("dead-letter queue name", &self.queue)?,
                    ShortString::from("outbox-dlq-replay"),
                    BasicConsumeOptions {
                        exclusive: true,
                        ..BasicConsumeOptions::default()
                    },
                    FieldTable::default(),
                ),
            )
            .await;
            let consumer = match consumer {
                Ok(consumer) => consumer,
                Err(error) => {
                    close(channel, self.timeout).await;
                    return Err(error);
                }
            };
            self.reader = Some(Reader { channel, consumer });
        }
        self.reader
            .as_mut()
            .ok_or_else(|| crate::Error::Config("the dead-letter reader is not open".into()))
    }

    /// Sends up to `limit` dead letters (when `None`, as many as the queue
    /// holds when it starts: copies that fail again and come back to its
    /// tail are not replayed again in the same run) back to the queues they
    /// came from, one at a time, as the type's docs describe; `progress`
    /// gets the number taken (replayed or skipped) so far after each one.
    ///
    /// # Errors
    /// Only when it cannot start (no channel, the queue held by another
    /// consumer: `403`); a replay that stops on a message says why in
    /// [`DlqReplayReport::error`].
    pub async fn replay(
        &mut self,
        limit: Option<usize>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<DlqReplayReport> {
        self.replay_with_hook(limit, progress, &|_| {}).await
    }

    /// [`replay`](Self::replay) calling `confirmed(n)` after the `n`-th copy
    /// is confirmed and before its dead letter is acked: tests crash there.
    #[doc(hidden)]
    pub async fn replay_with_hook(
        &mut self,
        limit: Option<usize>,
        progress: &(dyn Fn(u64) + Sync),
        confirmed: &(dyn Fn(u64) + Sync),
    ) -> Result<DlqReplayReport> {
        // At most what the queue held at the start: a copy that fails again
        // at once is dead-lettered back to the tail and must not be replayed
        // forever in one run.
        let limit = match limit {
            Some(limit) => limit,
            None => self.depth().await? as usize,
        };
        self.reader().await?;
        let mut report = DlqReplayReport::default();
        while report.handled() < limit {
            match self.replay_one(confirmed, &report).await {
                Ok(Some(Taken::Replayed(message))) => {
                    report.replayed += 1;
                    report.messages.push(message);
                }
                Ok(Some(Taken::Skipped(message))) => {
                    tracing::warn!(
                        queue = %self.queue,
                        message_id = ?message.message_id,
                        reason = %message.reason,
                        "dead-letter replay: moved a message it cannot send back to the queue's tail"
                    );
                    report.skipped.push(message);
                }
                Ok(None) => break,
                Err((cause, error)) => {
                    tracing::warn!(queue = %self.queue, ?cause, %error, "dead-letter replay stopped");
                    report.stop(cause, error);
                    break;
                }
            }
            progress(report.handled() as u64);
        }
        if report.error.is_some() {
            // Nothing more this run: the message it stopped at, still
            // unacked, goes back to the queue at its place when the channel
            // closes (once: not nacked first, which a quorum queue would
            // count as a failed delivery).
            self.release().await;
        }
        tracing::info!(
            queue = %self.queue,
            replayed = report.replayed,
            skipped = report.skipped.len(),
            stopped = report.error.is_some(),
            "dead-letter replay done"
        );
        Ok(report)
    }

    /// Stops being the queue's reader: what it holds unacked returns to
    /// the queue.
    async fn release(&mut self) {
        if let Some(reader) = self.reader.take() {
            close(reader.channel, self.timeout).await;
        }
    }

    /// The next message of the exclusive consumer; `None` when none comes
    /// within the timeout (the queue is empty).
    async fn next(&mut self) -> std::result::Result<Option<Delivery>, (StopCause, String)> {
        let timeout = self.timeout;
        let queue = self.queue.clone();
        let reader = self
            .reader()
            .await
            .map_err(|e| (StopCause::Broker, e.to_string()))?;
        match tokio::time::timeout(timeout, reader.consumer.next()).await {
            Err(_) => match self.inspect().await {
                Ok(depth) if depth.ready == 0 => Ok(None),
                Ok(depth) => Err((
                    StopCause::Broker,
                    format!(
                        "no message of `{queue}` delivered within {timeout:?} though {} are \
                         ready: the broker is slow or blocked",
                        depth.ready
                    ),
                )),
                Err(error) => Err((StopCause::Broker, error.to_string())),
            },
            Ok(Some(Ok(delivery))) => Ok(Some(delivery)),
            Ok(Some(Err(error))) => Err((
                StopCause::Broker,
                format!("consuming `{queue}` failed: {error}"),
            )),
            Ok(None) => Err((
                StopCause::Broker,
                format!("the broker cancelled the replay's consumer of `{queue}` (queue deleted?)"),
            )),
        }
    }

    /// Takes the next message: replayed, or skipped; `None` when the queue
    /// is empty.
    async fn replay_one(
        &mut self,
        confirmed: &(dyn Fn(u64) + Sync),
        report: &DlqReplayReport,
    ) -> std::result::Result<Option<Taken>, (StopCause, String)> {
        let Some(delivery) = self.next().await? else {
            return Ok(None);
        };
        let dlq = self.queue.clone();
        let message_id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.to_string());
        let named = message_id
            .clone()
            .unwrap_or_else(|| "without message_id".to_owned());
        let empty = FieldTable::default();
        let headers = delivery.properties.headers().as_ref().unwrap_or(&empty);
        if !dead_lettered(headers) {
            return Err((
                StopCause::Unreplayable,
                format!(
                    "message {named} in `{dlq}` carries no sign of having been dead-lettered \
                     (no `{QUEUE_HEADER}`, `x-death` or `{DEAD_REASON_HEADER}` header): is \
                     `{dlq}` a dead-letter queue? It was left in place"
                ),
            ));
        }
        let dead_letter_id =
            header_str(headers, DEAD_LETTER_ID_HEADER).and_then(|id| Uuid::parse_str(id).ok());
        let sent = match origin_queue(headers).filter(|origin| *origin != dlq) {
            None => Err(RepublishError::Refused(format!(
                "message {named} in `{dlq}` has neither an `{QUEUE_HEADER}` header nor an \
                 `x-death` entry naming another queue: where it came from is unknown"
            ))),
            Some(origin) => self
                .republisher
                .publish("", &origin, &delivery.data, replay_properties(&delivery))
                .await
                .map(|()| origin.clone())
                .map_err(|error| match error {
                    RepublishError::Refused(why) => RepublishError::Refused(format!(
                        "cannot replay message {named} to queue `{origin}` (does it still \
                         exist?): {why}"
                    )),
                    RepublishError::Failed(why) => RepublishError::Failed(format!(
                        "replaying message {named} to queue `{origin}` failed: {why}"
                    )),
                }),
        };
        let taken = match sent {
            Ok(origin) => {
                confirmed(report.replayed + 1);
                Taken::Replayed(ReplayedMessage::new(origin, message_id, dead_letter_id))
            }
            Err(RepublishError::Refused(reason)) if self.skip_unreplayable => {
                // To this queue's tail, as it is: confirmed before the ack,
                // so a crash leaves it here (once or twice), never nowhere.
                if let Err(error) = self
                    .republisher
                    .publish("", &dlq, &delivery.data, delivery.properties.clone())
                    .await
                {
                    return Err((
                        StopCause::Broker,
                        format!(
                            "{reason}; moving it to the tail of `{dlq}` failed ({error}): it \
                             was left in place"
                        ),
                    ));
                }
                Taken::Skipped(SkippedMessage::new(message_id, dead_letter_id, reason))
            }
            Err(RepublishError::Refused(reason)) => {
                return Err((
                    StopCause::Unreplayable,
                    format!(
                        "{reason}; it was left in `{dlq}` (replay with skip_unreplayable to \
                         move such messages aside and go on)"
                    ),
                ));
            }
            Err(RepublishError::Failed(reason)) => {
                return Err((
                    StopCause::Broker,
                    format!("{reason}; it was left in `{dlq}`"),
                ));
            }
        };
        bounded(
            &format!("ack the replayed message in `{dlq}`"),
            self.timeout,
            delivery.acker.ack(BasicAckOptions::default()),
        )
        .await
        .map_err(|error| {
            (
                StopCause::Broker,
                format!(
                    "message {named} was copied but its ack in `{dlq}` failed ({error}): it is \
                     still there too; a later replay sends it again and the consumer's inbox \
                     drops the duplicate"
                ),
            )
        })?;
        Ok(Some(taken))
    }

    /// Deletes every message ready in the queue; returns how many.
    ///
    /// # Errors
    /// [`Error::Amqp`](crate::Error::Amqp) (`404` when the queue does not
    /// exist), [`Error::Timeout`](crate::Error::Timeout).
    pub async fn purge(&self) -> Result<u64> {
        let channel = self.channel().await?;
        let purged = bounded(
            &format!("purge `{}`", self.queue),
            self.timeout,
            channel.queue_purge(
                short_string("dead-letter queue name", &self.queue)?,
                QueuePurgeOptions::default(),
            ),
        )
        .await?;
        close(channel, self.timeout).await;
        tracing::info!(queue = %self.queue, purged, "dead-letter queue purged");
        Ok(u64::from(purged))
    }

    /// Closes the connection (letting the queue go).
    ///
    /// # Errors
    /// [`Error::Amqp`](crate::Error::Amqp), [`Error::Timeout`](crate::Error::Timeout).
    pub async fn close(mut self) -> Result<()> {
        self.release().await;
        bounded(
            "close the dead-letter queue's connection",
            self.timeout,
            self.connection.close(200, "OK".into()),
        )
        .await
    }

    /// A channel of its own per call: a failed call (a missing queue)
    /// closes only it.
    async fn channel(&self) -> Result<Channel> {
        bounded(
            "open a channel for the dead-letter queue",
            self.timeout,
            self.connection.create_channel(),
        )
        .await
    }
}

impl Drop for DeadLetterQueue {
    /// Dropped without [`close`](Self::close) (e.g. a cancelled replay):
    /// the connection is closed in the background, so the queue is not held
    /// by a consumer nobody reads.
    fn drop(&mut self) {
        if !self.connection.status().connected() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let connection = self.connection.clone();
            let timeout = self.timeout;
            runtime.spawn(async move {
                let _ = bounded(
                    "close a dropped dead-letter queue's connection",
                    timeout,
                    connection.close(200, "OK".into()),
                )
                .await;
            });
        }
    }
}

async fn close(channel: Channel, timeout: Duration) {
    if channel.status().connected() {
        let _ = bounded(
            "close a dead-letter queue channel",
            timeout,
            channel.close(200, "OK".into()),
        )
        .await;
    }
}

/// The dead-letter queues of one broker, for
/// [`DeadLetters`](outbox_core::admin::DeadLetters): each inspection and
/// purge connects and closes again, and each replay holds its own
/// connection (its [`DeadLetterQueue`]) until it ends, so a long-lived admin
/// router holds no connection between calls and survives broker restarts.
#[derive(Clone)]
pub struct DeadLetterQueues {
    url: String,
}

impl fmt::Debug for DeadLetterQueues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetterQueues")
            .field("url", &redact_url(&self.url))
            .finish()
    }
}

impl DeadLetterQueues {
    /// The dead-letter queues of the broker at `url` (not connected yet).
    pub fn new(url: impl Into<String>) -> Self {
        DeadLetterQueues { url: url.into() }
    }

    async fn connect(&self, queue: &str) -> Result<DeadLetterQueue> {
        DeadLetterQueue::connect(&self.url, queue).await
    }
}

impl DeadLetterBroker for DeadLetterQueues {
    type Error = crate::Error;
    type Session = DeadLetterQueue;

    async fn inspect(&self, queue: &str) -> Result<Option<QueueDepth>> {
        let dlq = self.connect(queue).await?;
        let depth = dlq.inspect().await;
        let _ = dlq.close().await;
        match depth {
            Ok(depth) => Ok(Some(depth)),
            Err(crate::Error::Amqp { source, .. }) if no_such_queue(&source) => Ok(None),
            Err(error) => Err(error),
        }
    }

    async fn open(&self, queue: &str) -> Result<Option<DeadLetterQueue>> {
        let mut dlq = self.connect(queue).await?;
        match dlq.claim().await {
            Ok(true) => Ok(Some(dlq)),
            Ok(false) => {
                let _ = dlq.close().await;
                Ok(None)
            }
            Err(error) => {
                let _ = dlq.close().await;
                Err(error)
            }
        }
    }

    async fn purge(&self, queue: &str) -> Result<u64> {
        let dlq = self.connect(queue).await?;
        let purged = dlq.purge().await;
        let _ = dlq.close().await;
        purged
    }
}

impl DeadLetterSession for DeadLetterQueue {
    type Error = crate::Error;

    async fn replay(
        &mut self,
        limit: usize,
        request: &DlqReplay,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<DlqReplayReport> {
        self.skip_unreplayable = request.skip_unreplayable;
        DeadLetterQueue::replay(self, Some(limit), progress).await
    }

    async fn close(self) {
        if let Err(error) = DeadLetterQueue::close(self).await {
            tracing::warn!(%error, "closing a dead-letter replay's connection failed");
        }
    }
}

/// The broker's `404` on a passive declare: the queue does not exist.
fn no_such_queue(error: &lapin::Error) -> bool {
    soft_error(error, &[AMQPSoftError::NOTFOUND])
}

/// The broker's `403`/`405` on an exclusive consume: another consumer holds
/// the queue.
fn in_use(error: &lapin::Error) -> bool {
    soft_error(
        error,
        &[AMQPSoftError::ACCESSREFUSED, AMQPSoftError::RESOURCELOCKED],
    )
}

fn soft_error(error: &lapin::Error, kinds: &[AMQPSoftError]) -> bool {
    matches!(
        error.kind(),
        lapin::ErrorKind::ProtocolError(amqp)
            if matches!(amqp.kind(), AMQPErrorKind::Soft(kind) if kinds.contains(kind))
    )
}

/// Whether the headers show the message was dead-lettered (by a consumer,
/// or by the broker).
fn dead_lettered(headers: &FieldTable) -> bool {
    let inner = headers.inner();
    [
        QUEUE_HEADER,
        "x-death",
        DEAD_REASON_HEADER,
        DEAD_LETTER_ID_HEADER,
    ]
    .iter()
    .any(|name| inner.contains_key(*name))
}

/// What a replay did with one message.
enum Taken {
    Replayed(ReplayedMessage),
    Skipped(SkippedMessage),
}

/// `outbox-dlq.<queue>`, cut to fit a short string.
fn connection_name(queue: &str) -> String {
    let mut end = queue.len().min(200);
    while !queue.is_char_boundary(end) {
        end -= 1;
    }
    format!("outbox-dlq.{}", &queue[..end])
}

/// The queue a dead letter came from: its [`QUEUE_HEADER`], else the queue
/// of the first (latest) `x-death` entry.
fn origin_queue(headers: &FieldTable) -> Option<String> {
    if let Some(queue) = header_str(headers, QUEUE_HEADER).filter(|q| valid_queue(q)) {
        return Some(queue.to_owned());
    }
    let Some(AMQPValue::FieldArray(deaths)) = headers.inner().get("x-death") else {
        return None;
    };
    let Some(AMQPValue::FieldTable(first)) = deaths.as_slice().first() else {
        return None;
    };
    header_str(first, "queue")
        .filter(|q| valid_queue(q))
        .map(str::to_owned)
}

fn valid_queue(queue: &str) -> bool {
    !queue.is_empty() && queue.len() <= 255
}

/// The replayed copy's properties: the dead letter's, with the attempt
/// header removed, the dead reason moved to [`REPLAYED_REASON_HEADER`], and
/// the original routing key kept (the copy travels keyed by queue name).
fn replay_properties(delivery: &Delivery) -> BasicProperties {
    let mut headers: BTreeMap<ShortString, AMQPValue> = delivery
        .properties
        .headers()
        .as_ref()
        .map(|table| table.inner().clone())
        .unwrap_or_default();
    headers.remove(ATTEMPT_HEADER);
    // Where it came from is told again by whoever dead-letters the copy:
    // stale origins would send a later dead letter back to the wrong queue.
    headers.remove(QUEUE_HEADER);
    headers.remove(DEAD_LETTER_ID_HEADER);
    headers.remove("x-death");
    if let Some(reason) = headers.remove(DEAD_REASON_HEADER) {
        headers.insert(ShortString::from(REPLAYED_REASON_HEADER), reason);
    }
    if !headers.contains_key(ORIGINAL_ROUTING_KEY_HEADER) {
        headers.insert(
            ShortString::from(ORIGINAL_ROUTING_KEY_HEADER),
            AMQPValue::LongString(LongString::from(delivery.routing_key.as_str())),
        );
    }
    delivery
        .properties
        .clone()
        .with_headers(FieldTable::from(headers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::FieldArray;

    fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
        let mut table = FieldTable::default();
        for (k, v) in entries {
            table.insert(ShortString::from(*k), v.clone());
        }
        table
    }

    fn text(s: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(s))
    }

    #[test]
    fn the_origin_is_the_queue_header_else_the_first_x_death() {
        let deaths = AMQPValue::FieldArray(FieldArray::from(vec![
            AMQPValue::FieldTable(table(&[("queue", text("latest"))])),
            AMQPValue::FieldTable(table(&[("queue", text("older"))])),
        ]));
        let both = table(&[(QUEUE_HEADER, text("ours")), ("x-death", deaths.clone())]);
        assert_eq!(origin_queue(&both).as_deref(), Some("ours"));
        let broker = table(&[("x-death", deaths)]);
        assert_eq!(origin_queue(&broker).as_deref(), Some("latest"));
        assert_eq!(origin_queue(&table(&[])), None);
        assert_eq!(origin_queue(&table(&[(QUEUE_HEADER, text(""))])), None);
    }

    #[test]
    fn connection_names_fit_a_short_string() {
        assert_eq!(connection_name("q.dead"), "outbox-dlq.q.dead");
        assert!(connection_name(&"é".repeat(200)).len() <= 255);
    }
}
