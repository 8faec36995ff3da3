//! [`DeadLetterQueue`]: replay a consumer's dead letters back to the queue
//! they came from, or purge them.
//!
//! Listing is not here: getting messages and requeueing them reorders them
//! (and on some queue types drops them), so dead letters are listed from the
//! database the consumer records them in
//! ([`InboxDatabase::record_dead_letter`](outbox_core::InboxDatabase::record_dead_letter);
//! in PostgreSQL `outbox_diesel::PgDeadLetters`).
//!
//! This file holds [`DeadLetterQueue`], its connection, its exclusive
//! reader, depth and purge; the parts:
//! - `replay.rs`: the replay, one message at a time;
//! - `headers.rs`: what a dead letter's headers say (whether it was
//!   dead-lettered, where it came from) and the replayed copy's properties;
//! - `broker.rs`: [`DeadLetterQueues`], the broker behind
//!   [`DeadLetters`](outbox_core::admin::DeadLetters).

mod broker;
mod headers;
mod replay;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{
    BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{Channel, Connection, Consumer};
use outbox_core::admin::QueueDepth;

pub use broker::DeadLetterQueues;

use crate::AmqpUrls;
use crate::Result;
use crate::connection::{bounded, connect_to_node};
use crate::consumer::republish::Republisher;
use crate::topology::short_string;
use broker::in_use;

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
/// `x-outbox-dead-reason` moved to [`REPLAYED_REASON_HEADER`](crate::REPLAYED_REASON_HEADER).
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
///
/// [`QUEUE_HEADER`]: crate::QUEUE_HEADER
/// [`DEAD_REASON_HEADER`]: crate::DEAD_REASON_HEADER
/// [`DlqReplayReport::error`]: outbox_core::admin::DlqReplayReport::error
/// [`StopCause::Unreplayable`]: outbox_core::admin::StopCause::Unreplayable
/// [`StopCause::Broker`]: outbox_core::admin::StopCause::Broker
pub struct DeadLetterQueue {
    connection: Arc<Connection>,
    republisher: Republisher,
    queue: String,
    urls: AmqpUrls,
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
            .field("urls", &self.urls)
            .field("queue", &self.queue)
            .field("timeout", &self.timeout)
            .field("skip_unreplayable", &self.skip_unreplayable)
            .field("claimed", &self.reader.is_some())
            .finish_non_exhaustive()
    }
}

impl DeadLetterQueue {
    /// Connects to the broker at `urls` (one URL, or one per cluster node:
    /// see [`AmqpUrls`](crate::AmqpUrls)) for the dead-letter queue `queue`.
    /// The connection is named `outbox-dlq.<queue>`.
    ///
    /// # Errors
    /// [`Error::NoUrls`](crate::Error::NoUrls),
    /// [`Error::Connect`](crate::Error::Connect),
    /// [`Error::Unreachable`](crate::Error::Unreachable),
    /// [`Error::ConnectTimeout`](crate::Error::ConnectTimeout),
    /// [`Error::Config`](crate::Error::Config) for an invalid queue name,
    /// [`Error::Amqp`](crate::Error::Amqp) when the confirm channel cannot
    /// be opened.
    pub async fn connect(urls: impl Into<AmqpUrls>, queue: impl Into<String>) -> Result<Self> {
        let urls = urls.into();
        let queue = queue.into();
        short_string("dead-letter queue name", &queue)?;
        let name = connection_name(&queue);
        let (connection, node) = connect_to_node(&urls, &name).await?;
        let connection = Arc::new(connection);
        let republisher = match Republisher::open(connection.clone(), DEFAULT_TIMEOUT).await {
            Ok(republisher) => {
                urls.worked(node);
                republisher
            }
            Err(error) => {
                urls.failed(node);
                return Err(error);
            }
        };
        Ok(DeadLetterQueue {
            connection,
            republisher,
            queue,
            urls,
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
    ///
    /// [`DlqReplayReport::skipped`]: outbox_core::admin::DlqReplayReport::skipped
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

/// `outbox-dlq.<queue>`, cut to fit a short string.
fn connection_name(queue: &str) -> String {
    let mut end = queue.len().min(200);
    while !queue.is_char_boundary(end) {
        end -= 1;
    }
    format!("outbox-dlq.{}", &queue[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_names_fit_a_short_string() {
        assert_eq!(connection_name("q.dead"), "outbox-dlq.q.dead");
        assert!(connection_name(&"é".repeat(200)).len() <= 255);
    }
}
