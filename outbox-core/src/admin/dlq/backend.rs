//! What [`DeadLetters`](super::DeadLetters) runs on: the store of
//! dead-letter records, and the broker's dead-letter queues with a
//! replay's session on one of them.

use std::future::Future;

use serde::{Deserialize, Serialize};

use super::{DeadLetterQuery, DlqReplay};
use crate::admin::{
    AuditEntry, DeadLetterGroup, DeadLetterRecord, DlqReplayReport, Page, ReplayedMessage,
};

/// Where inbox consumers record the messages they dead-letter
/// ([`InboxDatabase::record_dead_letter`](crate::InboxDatabase::record_dead_letter)),
/// with the audit trail of the verbs that act on them.
pub trait DeadLetterStore: Send + Sync + 'static {
    /// The store's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// A page of records in `id` (recording) order.
    fn list(
        &self,
        query: &DeadLetterQuery,
    ) -> impl Future<Output = Result<Page<DeadLetterRecord>, Self::Error>> + Send;

    /// One record, open or not.
    fn show(
        &self,
        id: i64,
    ) -> impl Future<Output = Result<Option<DeadLetterRecord>, Self::Error>> + Send;

    /// Open records of `queue` (or of every queue) grouped by consumer,
    /// event type and normalized reason
    /// ([`group_dead_letters`](crate::admin::group_dead_letters)).
    fn groups(
        &self,
        queue: Option<&str>,
    ) -> impl Future<Output = Result<Vec<DeadLetterGroup>, Self::Error>> + Send;

    /// Marks the open records of `messages` replayed: by the dead letter's
    /// own id where it has one; otherwise one open record without such an
    /// id, of its event in the queue it went back to, per message. Returns
    /// how many records.
    fn mark_replayed(
        &self,
        messages: &[ReplayedMessage],
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send;

    /// The greatest record id so far: read before a purge, the records up
    /// to it are of messages that were in the queue when it was purged.
    fn watermark(&self) -> impl Future<Output = Result<i64, Self::Error>> + Send;

    /// Marks the open records of the consumer queues `queues` with an id up
    /// to `watermark` purged. Returns how many records.
    fn mark_purged(
        &self,
        queues: &[String],
        watermark: i64,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send;

    /// Writes the audit row of a verb about to act; returns its id.
    fn begin_audit(
        &self,
        entry: &AuditEntry,
    ) -> impl Future<Output = Result<i64, Self::Error>> + Send;

    /// Sets the audit row's count (messages moved so far) and, when
    /// `outcome` is given, ends it with that outcome.
    fn record_audit(
        &self,
        audit: i64,
        count: u64,
        outcome: Option<&str>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// A queue as the broker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct QueueDepth {
    /// Messages ready to be taken.
    pub ready: u64,
    /// Consumers attached: a dead-letter queue has none, unless a replay of
    /// it is running.
    pub consumers: u32,
}

impl QueueDepth {
    /// A depth.
    pub fn new(ready: u64, consumers: u32) -> Self {
        QueueDepth { ready, consumers }
    }
}

/// The broker side: dead-letter queues to inspect, replay and purge.
pub trait DeadLetterBroker: Send + Sync + 'static {
    /// The broker's error.
    type Error: std::error::Error + Send + Sync + 'static;
    /// A replay's hold on one queue.
    type Session: DeadLetterSession<Error = Self::Error>;

    /// The queue's depth and consumers; `None` when there is no such queue.
    fn inspect(
        &self,
        queue: &str,
    ) -> impl Future<Output = Result<Option<QueueDepth>, Self::Error>> + Send;

    /// Takes `queue` for a replay: its only reader until the session is
    /// closed. `None` when another reader holds it (e.g. another replay).
    fn open(
        &self,
        queue: &str,
    ) -> impl Future<Output = Result<Option<Self::Session>, Self::Error>> + Send;

    /// Deletes every message ready in `queue`; returns how many.
    fn purge(&self, queue: &str) -> impl Future<Output = Result<u64, Self::Error>> + Send;
}

/// A replay's exclusive hold on a dead-letter queue
/// ([`DeadLetterBroker::open`]).
pub trait DeadLetterSession: Send {
    /// The broker's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Takes up to `limit` messages, one at a time, and sends each back to
    /// the queue it was dead-lettered from, confirmed there before it is
    /// acked. A message that cannot go back stops the replay (it stays in
    /// the queue), or, with [`DlqReplay::skip_unreplayable`], moves to the
    /// queue's tail (confirmed, then acked) and the replay goes on; a
    /// message with no sign of having been dead-lettered always stops it.
    /// `progress` gets the count of messages taken so far.
    ///
    /// An `Err` means nothing was taken; a stop on a message is
    /// [`DlqReplayReport::error`].
    fn replay(
        &mut self,
        limit: usize,
        request: &DlqReplay,
        progress: &(dyn Fn(u64) + Sync),
    ) -> impl Future<Output = Result<DlqReplayReport, Self::Error>> + Send;

    /// Lets the queue go.
    fn close(self) -> impl Future<Output = ()> + Send;
}
