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

use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicGetOptions, BasicNackOptions, QueueDeclareOptions, QueuePurgeOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection};
use outbox_core::admin::{DeadLetterBroker, DlqReplayReport, ReplayedMessage, SkippedMessage};
use uuid::Uuid;

use crate::consumer::republish::Republisher;
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
/// let dlq = DeadLetterQueue::connect("amqp://guest:guest@127.0.0.1:5672/%2f", "loyalty.orders.dead")
///     .await?;
/// println!("{} dead letters", dlq.depth().await?);
/// let report = dlq.replay(Some(100), &|n| eprintln!("{n} taken")).await?;
/// if let Some(error) = &report.error {
///     eprintln!("stopped: {error}");
/// }
/// # Ok(()) }
/// ```
///
/// To mark the records of what moved and write an audit row, replay
/// through [`outbox_core::admin::DeadLetters`] over [`DeadLetterQueues`]
/// instead (what the `outbox` CLI and the admin router do).
///
/// # Replay
/// One message at a time: `basic.get` (not auto-acked) from the dead-letter
/// queue, then publish a copy through the default exchange straight to the
/// queue it was dead-lettered from (`mandatory`, on a confirm channel) and
/// wait for the broker's confirm, and only then ack the dead letter. Never
/// to the original exchange, which would fan it out to every other
/// subscriber again. The origin is the [`QUEUE_HEADER`] the consumer sets,
/// else the first `x-death` entry's queue (messages the broker itself
/// dead-lettered). The copy keeps body and properties but for the headers:
/// no `x-outbox-attempt` (the consumer starts over at attempt 1), and
/// `x-outbox-dead-reason` moved to [`REPLAYED_REASON_HEADER`].
///
/// **Nothing is lost if it dies half way**: a message is acked only after
/// its copy is confirmed, so a crash leaves each message either in the
/// dead-letter queue, or in its origin queue, or (crash between confirm and
/// ack) in both: the consumer's inbox drops the second copy. Order is kept:
/// the dead letters arrive in their origin queue in dead-letter-queue order.
///
/// A message without an origin, or whose copy the broker does not take
/// (origin queue gone: returned as unroutable; nacked; no confirm in time),
/// is returned to the dead-letter queue (`basic.nack` with requeue) and the
/// replay stops there with the reason in [`DlqReplayReport::error`]; with
/// [`skip_unreplayable`](Self::skip_unreplayable) it is moved to the
/// queue's tail instead (confirmed, then acked) and the replay goes on.
pub struct DeadLetterQueue {
    connection: Arc<Connection>,
    republisher: Republisher,
    queue: String,
    url: String,
    timeout: Duration,
    skip_unreplayable: bool,
}

impl fmt::Debug for DeadLetterQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetterQueue")
            .field("url", &redact_url(&self.url))
            .field("queue", &self.queue)
            .field("timeout", &self.timeout)
            .field("skip_unreplayable", &self.skip_unreplayable)
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
        Ok(declared.message_count())
    }

    /// Sends up to `limit` dead letters (when `None`, as many as the queue
    /// holds when it starts: copies that fail again and come back to its
    /// tail are not replayed again in the same run) back to the queues they
    /// came from, one at a time, as the type's docs describe;
    /// `progress` gets the number taken (replayed or skipped) so far after
    /// each one.
    ///
    /// # Errors
    /// Only when it cannot start (no channel); a replay that stops on a
    /// message says why in [`DlqReplayReport::error`].
    pub async fn replay(
        &self,
        limit: Option<usize>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<DlqReplayReport> {
        self.replay_with_hook(limit, progress, &|_| {}).await
    }

    /// [`replay`](Self::replay) calling `confirmed(n)` after the `n`-th copy
    /// is confirmed and before its dead letter is acked: tests crash there.
    #[doc(hidden)]
    pub async fn replay_with_hook(
        &self,
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
        let channel = self.channel().await?;
        let mut report = DlqReplayReport::default();
        while report.handled() < limit {
            match self.replay_one(&channel, confirmed, &report).await {
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
                Err(error) => {
                    tracing::warn!(queue = %self.queue, %error, "dead-letter replay stopped");
                    report.error = Some(error);
                    break;
                }
            }
            progress(report.handled() as u64);
        }
        close(channel, self.timeout).await;
        tracing::info!(
            queue = %self.queue,
            replayed = report.replayed,
            skipped = report.skipped.len(),
            stopped = report.error.is_some(),
            "dead-letter replay done"
        );
        Ok(report)
    }

    /// Takes the next message: replayed, or skipped; `None` when the queue
    /// is empty.
    async fn replay_one(
        &self,
        channel: &Channel,
        confirmed: &(dyn Fn(u64) + Sync),
        report: &DlqReplayReport,
    ) -> std::result::Result<Option<Taken>, String> {
        let dlq = &self.queue;
        let queue = short_string("dead-letter queue name", dlq).map_err(|e| e.to_string())?;
        let got = bounded(
            &format!("basic.get from `{dlq}`"),
            self.timeout,
            channel.basic_get(queue, BasicGetOptions { no_ack: false }),
        )
        .await
        .map_err(|e| e.to_string())?;
        let Some(got) = got else {
            return Ok(None);
        };
        let delivery = got.delivery;
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
        let dead_letter_id =
            header_str(headers, DEAD_LETTER_ID_HEADER).and_then(|id| Uuid::parse_str(id).ok());
        let sent = match origin_queue(headers) {
            None => Err(format!(
                "message {named} in `{dlq}` has neither an `{QUEUE_HEADER}` header nor an \
                 `x-death` entry: where it came from is unknown"
            )),
            Some(origin) => self
                .republisher
                .publish("", &origin, &delivery.data, replay_properties(&delivery))
                .await
                .map(|()| origin.clone())
                .map_err(|error| {
                    format!(
                        "cannot replay message {named} to queue `{origin}` (does it still \
                         exist?): {error}"
                    )
                }),
        };
        let taken = match sent {
            Ok(origin) => {
                confirmed(report.replayed + 1);
                Taken::Replayed(ReplayedMessage::new(origin, message_id, dead_letter_id))
            }
            Err(reason) if self.skip_unreplayable => {
                // To this queue's tail, as it is: confirmed before the ack,
                // so a crash leaves it here (once or twice), never nowhere.
                if let Err(error) = self
                    .republisher
                    .publish("", dlq, &delivery.data, delivery.properties.clone())
                    .await
                {
                    self.requeue(&delivery).await;
                    return Err(format!(
                        "{reason}; moving it to the tail of `{dlq}` failed too ({error}): it \
                         was left in place"
                    ));
                }
                Taken::Skipped(SkippedMessage::new(message_id, dead_letter_id, reason))
            }
            Err(reason) => {
                self.requeue(&delivery).await;
                return Err(format!(
                    "{reason}; it was left in `{dlq}` (replay with skip_unreplayable to move \
                     such messages aside and go on)"
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
            format!(
                "message {named} was copied but its ack in `{dlq}` failed ({error}): it is \
                 still there too; a later replay sends it again and the consumer's inbox \
                 drops the duplicate"
            )
        })?;
        Ok(Some(taken))
    }

    /// Returns `delivery` to the dead-letter queue, at its place.
    async fn requeue(&self, delivery: &Delivery) {
        let requeue = BasicNackOptions {
            requeue: true,
            multiple: false,
        };
        if let Err(error) = bounded(
            "return a dead letter to its queue (basic.nack)",
            self.timeout,
            delivery.acker.nack(requeue),
        )
        .await
        {
            tracing::warn!(
                %error,
                "nack failed: the broker returns the message to the dead-letter queue when the \
                 channel closes"
            );
        }
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

    /// Closes the connection.
    ///
    /// # Errors
    /// [`Error::Amqp`](crate::Error::Amqp), [`Error::Timeout`](crate::Error::Timeout).
    pub async fn close(self) -> Result<()> {
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
/// [`DeadLetters`](outbox_core::admin::DeadLetters): each call connects
/// (a [`DeadLetterQueue`]) and closes again, so a long-lived admin router
/// holds no connection and survives broker restarts.
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

    async fn open(&self, queue: &str) -> Result<DeadLetterQueue> {
        DeadLetterQueue::connect(&self.url, queue).await
    }
}

impl DeadLetterBroker for DeadLetterQueues {
    type Error = crate::Error;

    async fn depth(&self, queue: &str) -> Result<Option<u32>> {
        let dlq = self.open(queue).await?;
        let depth = dlq.depth().await;
        let _ = dlq.close().await;
        match depth {
            Ok(depth) => Ok(Some(depth)),
            Err(crate::Error::Amqp { source, .. }) if no_such_queue(&source) => Ok(None),
            Err(error) => Err(error),
        }
    }

    async fn replay(
        &self,
        queue: &str,
        limit: usize,
        skip_unreplayable: bool,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<DlqReplayReport> {
        let dlq = self.open(queue).await?.skip_unreplayable(skip_unreplayable);
        let report = dlq.replay(Some(limit), progress).await;
        let _ = dlq.close().await;
        report
    }

    async fn purge(&self, queue: &str) -> Result<u64> {
        let dlq = self.open(queue).await?;
        let purged = dlq.purge().await;
        let _ = dlq.close().await;
        purged
    }
}

/// The broker's `404` on a passive declare: the queue does not exist.
fn no_such_queue(error: &lapin::Error) -> bool {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    matches!(
        error.kind(),
        lapin::ErrorKind::ProtocolError(amqp)
            if matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
    )
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
