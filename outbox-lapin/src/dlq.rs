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
use serde::{Deserialize, Serialize};
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
/// let report = dlq.replay(Some(100), &|n| eprintln!("{n} replayed")).await?;
/// if let Some(error) = &report.error {
///     eprintln!("stopped: {error}");
/// }
/// // Mark them replayed in the database, e.g.
/// // PgDeadLetters::mark_replayed(None, &report.event_ids()).
/// # Ok(()) }
/// ```
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
/// replay stops there with the reason in [`DlqReplayReport::error`].
pub struct DeadLetterQueue {
    connection: Arc<Connection>,
    republisher: Republisher,
    queue: String,
    url: String,
    timeout: Duration,
}

impl fmt::Debug for DeadLetterQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetterQueue")
            .field("url", &redact_url(&self.url))
            .field("queue", &self.queue)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// What a [replay](DeadLetterQueue::replay) did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DlqReplayReport {
    /// Messages sent back to their queue (confirmed, and acked in the
    /// dead-letter queue).
    pub replayed: u64,
    /// Each replayed message, in order.
    pub messages: Vec<ReplayedMessage>,
    /// Why the replay stopped before the queue was empty or the limit
    /// reached; `None` when it finished.
    pub error: Option<String>,
}

impl DlqReplayReport {
    /// The event ids of the replayed messages (those that had one), to
    /// mark their database records replayed.
    pub fn event_ids(&self) -> Vec<Uuid> {
        self.messages.iter().filter_map(|m| m.event_id).collect()
    }

    /// The consumer-given ids of the replayed dead letters that have one.
    pub fn dead_letter_ids(&self) -> Vec<Uuid> {
        self.messages
            .iter()
            .filter_map(|m| m.dead_letter_id)
            .collect()
    }
}

/// One replayed message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ReplayedMessage {
    /// The queue it was sent back to.
    pub queue: String,
    /// Its AMQP `message_id`, if any.
    pub message_id: Option<String>,
    /// The event id: the `message_id` when it is a UUID.
    pub event_id: Option<Uuid>,
    /// The id the consumer gave the dead letter
    /// ([`DEAD_LETTER_ID_HEADER`](crate::DEAD_LETTER_ID_HEADER)), if it has
    /// one: marks exactly its record replayed.
    pub dead_letter_id: Option<Uuid>,
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
        })
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
    /// `progress` gets the number replayed so far after each one.
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
        while report.messages.len() < limit {
            match self.replay_one(&channel, confirmed, &report).await {
                Ok(Some(message)) => {
                    report.replayed += 1;
                    report.messages.push(message);
                    progress(report.replayed);
                }
                Ok(None) => break,
                Err(error) => {
                    tracing::warn!(queue = %self.queue, %error, "dead-letter replay stopped");
                    report.error = Some(error);
                    break;
                }
            }
        }
        close(channel, self.timeout).await;
        tracing::info!(
            queue = %self.queue,
            replayed = report.replayed,
            stopped = report.error.is_some(),
            "dead-letter replay done"
        );
        Ok(report)
    }

    /// Replays the next message; `None` when the queue is empty.
    async fn replay_one(
        &self,
        channel: &Channel,
        confirmed: &(dyn Fn(u64) + Sync),
        report: &DlqReplayReport,
    ) -> std::result::Result<Option<ReplayedMessage>, String> {
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
        let named = message_id.as_deref().unwrap_or("without message_id");
        let empty = FieldTable::default();
        let headers = delivery.properties.headers().as_ref().unwrap_or(&empty);
        let dead_letter_id =
            header_str(headers, DEAD_LETTER_ID_HEADER).and_then(|id| Uuid::parse_str(id).ok());
        let Some(origin) = origin_queue(headers) else {
            self.requeue(&delivery).await;
            return Err(format!(
                "message {named} in `{dlq}` has neither an `{QUEUE_HEADER}` header nor an \
                 `x-death` entry: where it came from is unknown, so it was left in `{dlq}` \
                 (move it by hand)"
            ));
        };
        let properties = replay_properties(&delivery);
        if let Err(error) = self
            .republisher
            .publish("", &origin, &delivery.data, properties)
            .await
        {
            self.requeue(&delivery).await;
            return Err(format!(
                "cannot replay message {named} to queue `{origin}` (does it still exist?): \
                 {error}; it was left in `{dlq}`"
            ));
        }
        confirmed(report.replayed + 1);
        bounded(
            &format!("ack the replayed message in `{dlq}`"),
            self.timeout,
            delivery.acker.ack(BasicAckOptions::default()),
        )
        .await
        .map_err(|error| {
            format!(
                "message {named} was replayed to `{origin}` but its ack failed ({error}): it is \
                 also still in `{dlq}`; a later replay sends it again and the consumer's inbox \
                 drops the duplicate"
            )
        })?;
        let event_id = message_id
            .as_deref()
            .and_then(|id| Uuid::parse_str(id).ok());
        Ok(Some(ReplayedMessage {
            queue: origin,
            message_id,
            event_id,
            dead_letter_id,
        }))
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
