//! The admin API: see, fix and clean an outbox.
//!
//! One API for every way in: the `outbox` CLI and the admin router of
//! `outbox-axum` are thin shells over [`Admin`], which drives any store
//! implementing [`OutboxAdmin`] (the PostgreSQL store, and
//! [`InMemoryStore`](crate::testing::InMemoryStore) for tests).
//!
//! | Verb | Call | Notes |
//! |------|------|-------|
//! | status | [`Admin::status`] | counts, oldest unsent age, blocked, unroutable, per event type, relays |
//! | list | [`Admin::list`] | an [`EventFilter`], cursor pages in `seq` order |
//! | show | [`Admin::show`] | every column, payload, headers, the last failed attempts |
//! | failure groups | [`Admin::failure_groups`] | dead and retrying events by event type and [normalized](normalize_error) error |
//! | replay | [`Admin::replay`] | dead events back to pending, in bounded chunks, `seq` kept |
//! | skip | [`Admin::skip`] | a dead or retrying event, or an aggregate's head |
//! | retry now | [`Admin::retry_now`] | makes waiting retries due at once |
//! | purge | [`Admin::purge`] | sent events or inbox entries older than a duration |
//! | relays | [`Admin::relays`], [`Admin::set_paused`] | registered relays, pause and resume |
//!
//! Consumers' dead letters are recorded by the inbox consumer
//! ([`InboxDatabase::record_dead_letter`](crate::InboxDatabase::record_dead_letter))
//! as [`DeadLetter`]s; a database lists them as [`DeadLetterRecord`]s and
//! groups them with [`group_dead_letters`] (in PostgreSQL,
//! `outbox_diesel::PgDeadLetters`). [`DeadLetters`] lists, groups, replays
//! and purges them, over such a store and the broker's dead-letter queues
//! (`outbox_lapin::DeadLetterQueues`).
//!
//! Retention runs by itself: a [`Janitor`] beside each relay purges sent
//! events and inbox entries past their retention (dead events are kept
//! until an operator acts).
//!
//! Every mutation needs a [`Caller`] with [`Role::Operator`], writes an
//! [`AuditEntry`] before its first change (each chunk adds its count in its
//! own transaction) and a `tracing` event.
//!
//! # Runs are bounded when they start
//! A chunked run ([`Admin::replay`], [`Admin::skip`], [`Admin::retry_now`])
//! reads the highest `seq` of the outbox when it starts
//! ([`OutboxAdmin::last_seq`]) and adds it to its selection as
//! [`EventFilter::seq_at_most`] (recorded in its audit row), for its count
//! (`matched`, also in a dry run) and inside every chunk's statement. An
//! event recorded after the run began is never changed, even when it comes
//! to match while the run goes (it dies during a long replay of every dead
//! event): the run changes at most what it counted, and ends. An event
//! recorded before the run began that comes to match while it goes (a
//! pending event that dies during the replay), with a `seq` the run has
//! not passed yet, is changed too: then `changed` can exceed `matched`. An
//! event a transaction recorded before the run began but committed after
//! it has a `seq` below the bound, and counts as recorded before.
//! [`Admin::purge`] is bounded by its cutoff time instead.
//!
//! # Replays and consumers' deduplication
//! A replayed event keeps its id and its `seq`: per-aggregate order stays
//! the claim's job (a replayed event behind an earlier dead one of its
//! aggregate is held until that one is replayed or skipped), and consumers
//! drop it as a duplicate only while their inbox still holds its id. Past
//! the inbox retention a consumer that already processed it processes it
//! again, so [`Admin::replay`] warns when it replays events older than the
//! configured [`dedup_window`](Admin::dedup_window).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_core::admin::{Admin, Caller, EventFilter};
//! use outbox_core::testing::InMemoryStore;
//! use outbox_core::EventStatus;
//!
//! let admin = Admin::new(InMemoryStore::new());
//! let every_dead = EventFilter::new().with_status(EventStatus::Dead);
//! let dead = admin.list(&every_dead, None, 50).await?;
//! assert!(dead.items.is_empty());
//! // A dry run counts what a replay would change.
//! let report = admin
//!     .replay(&Caller::operator("alice"), &every_dead, true, &|_| {})
//!     .await?;
//! assert_eq!(report.matched, 0);
//! # Ok(())
//! # }
//! ```

use std::future::Future;

use chrono::{DateTime, Utc};
use uuid::Uuid;

mod audit;
mod dead_letter;
mod dlq;
mod filter;
mod group;
mod janitor;
mod report;
mod service;

pub use audit::{AuditEntry, AuditRecord, Caller, Role};
pub use dead_letter::{
    DeadLetter, DeadLetterGroup, DeadLetterRecord, DlqReplayReport, ReplayedMessage,
    SkippedMessage, StopCause, group_dead_letters,
};
pub use dlq::{
    DeadLetterBroker, DeadLetterQuery, DeadLetterSession, DeadLetterStore, DeadLetters, DlqPurge,
    DlqPurgeOutcome, DlqReplay, DlqReplayOutcome, QueueDepth,
};
pub use filter::{EventFilter, Page};
pub use group::{MAX_NORMALIZED_BYTES, group_id, normalize_error};
pub use janitor::{Janitor, JanitorReport};
pub use report::{
    Attempt, AttemptOutcome, EventDetail, EventSummary, EventTypeCounts, FailureGroup, RelayInfo,
    StatusCounts, StatusReport, group_failures,
};
pub use service::{ActionReport, Admin, AdminError, PurgeTarget};

/// How many failed attempts a store keeps per event (the latest).
pub const ATTEMPTS_KEPT: usize = 20;

/// What one chunk of a mutation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Chunk {
    /// Events (or entries) changed.
    pub changed: u64,
    /// The cursor after this chunk: the last `seq` it examined (`None` when
    /// it examined nothing: the selection is exhausted).
    pub last: Option<i64>,
}

/// What a store implements for the admin API. [`Admin`] adds chunking,
/// dry runs, the audit trail and permissions on top; call it, not these.
///
/// Chunked methods take a cursor `after` (a `seq`, exclusive) and a `limit`,
/// work in `seq` order, change at most `limit` rows in one transaction that
/// also adds the count to the audit row `audit`. The status-changing ones
/// (replay, skip, retry-now) wait a bounded time for rows another
/// transaction holds (a relay's claim lasts one publish round trip) rather
/// than leave them unchanged without a word; the purges skip such rows (a
/// later run takes them). Every
/// criterion of their `filter` holds inside the chunk's transaction, its
/// [`seq_at_most`](EventFilter::seq_at_most) included: that is how a run
/// started by [`Admin`] leaves alone the events recorded after it began.
pub trait OutboxAdmin: Send + Sync + 'static {
    /// The store's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The state of the outbox ([`StatusReport`]).
    fn status(&self) -> impl Future<Output = Result<StatusReport, Self::Error>> + Send;

    /// Events matching `filter` with `seq > after`, in `seq` order, at most
    /// `limit`.
    fn list(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
    ) -> impl Future<Output = Result<Page<EventSummary>, Self::Error>> + Send;

    /// One event with its attempt history.
    fn show(
        &self,
        id: Uuid,
    ) -> impl Future<Output = Result<Option<EventDetail>, Self::Error>> + Send;

    /// `dead` and `retry` events matching `filter`, grouped.
    fn failure_groups(
        &self,
        filter: &EventFilter,
    ) -> impl Future<Output = Result<Vec<FailureGroup>, Self::Error>> + Send;

    /// How many events match `filter`.
    fn count(&self, filter: &EventFilter) -> impl Future<Output = Result<u64, Self::Error>> + Send;

    /// The highest `seq` in the outbox now (`None` when it holds no event):
    /// [`Admin`]'s chunked runs read it when they start and bound their
    /// count and every chunk by it ([`EventFilter::seq_at_most`]).
    fn last_seq(&self) -> impl Future<Output = Result<Option<i64>, Self::Error>> + Send;

    /// What holds an aggregate back: its first `retry` or `dead` event, when
    /// that is its first event still to publish or dead; `None` when nothing
    /// holds it back.
    fn head(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> impl Future<Output = Result<Option<EventSummary>, Self::Error>> + Send;

    /// Writes an audit row with a count of 0; returns its id.
    fn begin_audit(
        &self,
        entry: &AuditEntry,
    ) -> impl Future<Output = Result<i64, Self::Error>> + Send;

    /// Records how the run of audit row `audit` ended (`done`, or
    /// `failed: <why>`).
    fn finish_audit(
        &self,
        audit: i64,
        outcome: &str,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// The audit trail, newest first: rows with `id < before`.
    fn audit_log(
        &self,
        before: Option<i64>,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<AuditRecord>, Self::Error>> + Send;

    /// Replays (`dead` → `pending`, attempts reset, `seq` kept) the `dead`
    /// events matching `filter`.
    fn replay_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> impl Future<Output = Result<Chunk, Self::Error>> + Send;

    /// Skips (`dead` or `retry` → `skipped`) the events matching `filter`,
    /// releasing what they held back.
    fn skip_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> impl Future<Output = Result<Chunk, Self::Error>> + Send;

    /// Makes the `retry` events matching `filter` due now.
    fn retry_now_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> impl Future<Output = Result<Chunk, Self::Error>> + Send;

    /// Deletes `sent` and `skipped` events published (or skipped) before
    /// `before`, with their attempt history. `dead` events are never purged.
    fn purge_sent_chunk(
        &self,
        before: DateTime<Utc>,
        after: Option<i64>,
        limit: usize,
        audit: Option<i64>,
    ) -> impl Future<Output = Result<Chunk, Self::Error>> + Send;

    /// Deletes up to `limit` inbox entries received before `before`;
    /// returns how many (0: nothing left).
    fn purge_inbox_chunk(
        &self,
        before: DateTime<Utc>,
        limit: usize,
        audit: Option<i64>,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send;

    /// Deletes up to `limit` records of consumer dead letters that were
    /// replayed or purged before `before` (open ones, still in a dead-letter
    /// queue, are kept); returns how many (0: nothing left). The default
    /// keeps no such records and deletes nothing.
    fn purge_dead_letter_records_chunk(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send {
        let _ = (before, limit);
        std::future::ready(Ok(0))
    }

    /// Removes relays whose last heartbeat is older than `before` (crashed
    /// relays that never deregistered), except paused ones (an operator's
    /// pause outlives the process); returns how many.
    fn purge_stale_relays(
        &self,
        before: DateTime<Utc>,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send;

    /// Registered relays.
    fn relays(&self) -> impl Future<Output = Result<Vec<RelayInfo>, Self::Error>> + Send;

    /// Pauses or resumes a relay; `false` if no relay has that name.
    fn set_paused(
        &self,
        relay: &str,
        paused: bool,
        audit: i64,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send;
}
