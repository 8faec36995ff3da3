//! Consumers' dead letters: what an inbox consumer gave up on, recorded in
//! its database when the broker confirmed the copy in the dead-letter
//! exchange, so operators can list and group them without touching the
//! queue (getting and requeueing messages reorders them, or drops them, on
//! some queue types).

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A message a consumer dead-lettered, as it records it
/// ([`InboxDatabase::record_dead_letter`](crate::InboxDatabase::record_dead_letter)).
///
/// The broker's copy (in the dead-letter queue) is the message itself; this
/// is its index entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The consumer's name (its inbox key).
    pub consumer: String,
    /// The queue the consumer read it from (where a replay sends it back).
    pub queue: String,
    /// The dead-letter exchange it was republished to.
    pub exchange: String,
    /// The routing key it was dead-lettered with (its original one).
    pub routing_key: String,
    /// The event id, when the message could be decoded.
    pub event_id: Option<Uuid>,
    /// The AMQP `message_id`, if any.
    pub message_id: Option<String>,
    /// The event type, when known (decoded, or the AMQP `type`).
    pub event_type: Option<String>,
    /// Attempts spent on it (1 for a message dead-lettered at once).
    pub attempts: u32,
    /// Why: the decode error or the last handler error.
    pub reason: String,
    /// When the consumer dead-lettered it.
    pub dead_lettered_at: DateTime<Utc>,
    /// The headers of the dead-lettered copy, as text.
    pub headers: BTreeMap<String, String>,
    /// The body as text (lossy UTF-8), at most
    /// [`MAX_PAYLOAD_BYTES`](Self::MAX_PAYLOAD_BYTES).
    pub payload: String,
    /// Whether [`payload`](Self::payload) was cut.
    pub payload_truncated: bool,
}

impl DeadLetter {
    /// The most of a body kept in [`payload`](Self::payload), in bytes: 64 KiB.
    pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;

    /// A dead letter of `body` dead-lettered now, with no event id, message
    /// id, event type or headers (set those fields), attempts 1.
    pub fn new(
        consumer: impl Into<String>,
        queue: impl Into<String>,
        exchange: impl Into<String>,
        routing_key: impl Into<String>,
        reason: impl Into<String>,
        body: &[u8],
    ) -> Self {
        let (payload, payload_truncated) = payload_text(body);
        DeadLetter {
            consumer: consumer.into(),
            queue: queue.into(),
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            event_id: None,
            message_id: None,
            event_type: None,
            attempts: 1,
            reason: reason.into(),
            dead_lettered_at: Utc::now(),
            headers: BTreeMap::new(),
            payload,
            payload_truncated,
        }
    }
}

/// `body` as text: lossy UTF-8, cut at a character boundary to at most
/// [`DeadLetter::MAX_PAYLOAD_BYTES`]; `true` when cut.
fn payload_text(body: &[u8]) -> (String, bool) {
    let text = String::from_utf8_lossy(body);
    if text.len() <= DeadLetter::MAX_PAYLOAD_BYTES {
        return (text.into_owned(), false);
    }
    let mut end = DeadLetter::MAX_PAYLOAD_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (text[..end].to_owned(), true)
}

/// A recorded [`DeadLetter`] as a store lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeadLetterRecord {
    /// The record's id: grows with each recorded dead letter (the page
    /// cursor).
    pub id: i64,
    /// The dead letter.
    #[serde(flatten)]
    pub letter: DeadLetter,
    /// When a replay sent it back to its queue.
    pub replayed_at: Option<DateTime<Utc>>,
    /// When its dead-letter queue was purged.
    pub purged_at: Option<DateTime<Utc>>,
    /// Payload and headers left out ([`redacted`](Self::redacted)).
    #[serde(default)]
    pub redacted: bool,
}

impl DeadLetterRecord {
    /// A record.
    pub fn new(
        id: i64,
        letter: DeadLetter,
        replayed_at: Option<DateTime<Utc>>,
        purged_at: Option<DateTime<Utc>>,
    ) -> Self {
        DeadLetterRecord {
            id,
            letter,
            replayed_at,
            purged_at,
            redacted: false,
        }
    }

    /// Without payload and headers (empty, [`redacted`](Self::redacted)
    /// set), for callers not allowed to see them.
    #[must_use]
    pub fn redacted(mut self) -> Self {
        self.letter.payload = String::new();
        self.letter.payload_truncated = false;
        self.letter.headers.clear();
        self.redacted = true;
        self
    }

    /// Neither replayed nor purged: still in the dead-letter queue, as far
    /// as the database knows.
    pub fn is_open(&self) -> bool {
        self.replayed_at.is_none() && self.purged_at.is_none()
    }
}

/// What a replay of a dead-letter queue did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DlqReplayReport {
    /// Messages sent back to their queue (confirmed there, then acked in
    /// the dead-letter queue).
    pub replayed: u64,
    /// Each replayed message, in order.
    pub messages: Vec<ReplayedMessage>,
    /// Messages that could not be sent back (no known origin, or the
    /// origin refused them) and were moved to the dead-letter queue's tail
    /// instead, when the replay was asked to skip them.
    pub skipped: Vec<SkippedMessage>,
    /// Why the replay stopped before the queue was empty or the limit
    /// reached; `None` when it finished.
    pub error: Option<String>,
    /// What stopped it, with [`error`](Self::error).
    pub stopped_by: Option<StopCause>,
}

/// What stopped a dead-letter replay early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StopCause {
    /// A message cannot go back: no known origin, the origin queue is gone
    /// or refuses it, or it carries no sign of having been dead-lettered.
    /// It stays in the dead-letter queue.
    Unreplayable,
    /// The broker failed (connection, channel, a confirm or an ack in
    /// time).
    Broker,
    /// Marking the moved messages' records failed (they stay listed open).
    Store,
}

impl DlqReplayReport {
    /// Messages taken from the dead-letter queue: replayed and skipped.
    pub fn handled(&self) -> usize {
        self.messages.len() + self.skipped.len()
    }

    /// The event ids of the replayed messages (those that had one).
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

    /// Adds `part` (a later chunk of the same replay).
    pub fn extend(&mut self, part: DlqReplayReport) {
        self.replayed += part.replayed;
        self.messages.extend(part.messages);
        self.skipped.extend(part.skipped);
        if part.error.is_some() {
            self.error = part.error;
            self.stopped_by = part.stopped_by;
        }
    }

    /// Records why it stopped.
    pub fn stop(&mut self, cause: StopCause, error: impl Into<String>) {
        self.stopped_by = Some(cause);
        self.error = Some(error.into());
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
    /// The id the consumer gave the dead letter (header
    /// `x-outbox-dead-letter-id`), if it has one: marks exactly its record
    /// replayed.
    pub dead_letter_id: Option<Uuid>,
}

impl ReplayedMessage {
    /// A message sent back to `queue`; its event id is `message_id` when
    /// that is a UUID.
    pub fn new(
        queue: impl Into<String>,
        message_id: Option<String>,
        dead_letter_id: Option<Uuid>,
    ) -> Self {
        let event_id = message_id
            .as_deref()
            .and_then(|id| Uuid::parse_str(id).ok());
        ReplayedMessage {
            queue: queue.into(),
            message_id,
            event_id,
            dead_letter_id,
        }
    }
}

/// A message a replay could not send back and moved to the dead-letter
/// queue's tail (its record stays open).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SkippedMessage {
    /// Its AMQP `message_id`, if any.
    pub message_id: Option<String>,
    /// The id the consumer gave the dead letter, if any.
    pub dead_letter_id: Option<Uuid>,
    /// Why it could not be sent back.
    pub reason: String,
}

impl SkippedMessage {
    /// A skipped message.
    pub fn new(
        message_id: Option<String>,
        dead_letter_id: Option<Uuid>,
        reason: impl Into<String>,
    ) -> Self {
        SkippedMessage {
            message_id,
            dead_letter_id,
            reason: reason.into(),
        }
    }
}

/// Dead letters of one consumer and event type that failed the same way
/// (their reasons [normalized](super::normalize_error) are equal).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeadLetterGroup {
    /// Stable id: [`group_id`](super::group_id) of `consumer/event_type`
    /// and the normalized reason.
    pub id: String,
    /// The consumer.
    pub consumer: String,
    /// The event type (`None`: undecodable messages without an AMQP type).
    pub event_type: Option<String>,
    /// The normalized reason.
    pub reason: String,
    /// Dead letters in the group.
    pub count: u64,
    /// When the earliest was dead-lettered.
    pub first_seen: DateTime<Utc>,
    /// When the latest was dead-lettered.
    pub last_seen: DateTime<Utc>,
}

/// Merges rows of (consumer, event type, raw reason, count, first, last)
/// into dead-letter groups, most first: the one place the grouping rule
/// lives, whatever store read the rows.
pub fn group_dead_letters<I>(rows: I) -> Vec<DeadLetterGroup>
where
    I: IntoIterator<
        Item = (
            String,
            Option<String>,
            String,
            u64,
            DateTime<Utc>,
            DateTime<Utc>,
        ),
    >,
{
    let mut groups: HashMap<String, DeadLetterGroup> = HashMap::new();
    for (consumer, event_type, reason, n, first, last) in rows {
        let reason = super::normalize_error(&reason);
        let key = format!("{consumer}/{}", event_type.as_deref().unwrap_or(""));
        let id = super::group_id(&key, &reason);
        let group = groups.entry(id.clone()).or_insert_with(|| DeadLetterGroup {
            id,
            consumer,
            event_type,
            reason,
            count: 0,
            first_seen: first,
            last_seen: last,
        });
        group.count += n;
        group.first_seen = group.first_seen.min(first);
        group.last_seen = group.last_seen.max(last);
    }
    let mut groups: Vec<DeadLetterGroup> = groups.into_values().collect();
    groups.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| a.consumer.cmp(&b.consumer))
            .then_with(|| a.event_type.cmp(&b.event_type))
            .then_with(|| a.reason.cmp(&b.reason))
    });
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_lossy_text_cut_at_a_char_boundary() {
        let letter = DeadLetter::new("c", "q", "q.dlx", "k", "r", b"ok \xff");
        assert_eq!(letter.payload, "ok \u{fffd}");
        assert!(!letter.payload_truncated);
        let long = "é".repeat(DeadLetter::MAX_PAYLOAD_BYTES);
        let letter = DeadLetter::new("c", "q", "q.dlx", "k", "r", long.as_bytes());
        assert!(letter.payload_truncated);
        assert!(letter.payload.len() <= DeadLetter::MAX_PAYLOAD_BYTES);
        assert!(letter.payload.chars().all(|c| c == 'é'));
    }

    #[test]
    fn the_same_failure_with_other_ids_is_one_group_per_consumer() {
        let t = Utc::now();
        let later = t + chrono::Duration::seconds(5);
        let groups = group_dead_letters([
            (
                "a".into(),
                Some("x".into()),
                "row 17 missing".into(),
                2,
                t,
                t,
            ),
            (
                "a".into(),
                Some("x".into()),
                "row 9 missing".into(),
                1,
                later,
                later,
            ),
            (
                "b".into(),
                Some("x".into()),
                "row 9 missing".into(),
                1,
                t,
                t,
            ),
        ]);
        assert_eq!(groups.len(), 2);
        assert_eq!(groups[0].consumer, "a");
        assert_eq!(groups[0].count, 3);
        assert_eq!(groups[0].reason, "row <n> missing");
        assert_eq!((groups[0].first_seen, groups[0].last_seen), (t, later));
        assert_ne!(groups[0].id, groups[1].id);
    }
}
