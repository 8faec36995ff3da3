//! The storage side: [`OutboxStore`] (what a relay needs) and [`Claim`] (a
//! batch a relay holds) here, [`DeliveryOrder`] in `order`, what a relay
//! registers and learns in `relays`, [`InboxStore`] and [`InboxDatabase`]
//! (consumer-side dedup) in `inbox`.

mod inbox;
mod order;
mod relays;

pub use inbox::{InboxDatabase, InboxOutcome, InboxStore};
pub use order::DeliveryOrder;
pub(crate) use relays::host_name;
pub use relays::{RelayControl, RelayRegistration};

use std::future::Future;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures_util::Stream;
use uuid::Uuid;

use crate::{NextStep, OutboxRecord};

/// Numbers an operator watches; the relay exports them as gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxStats {
    /// Events waiting to be published (`Pending` and `Retry`).
    pub backlog: u64,
    /// Age of the oldest unsent event, `None` when the backlog is empty.
    pub oldest_unsent_age: Option<Duration>,
    /// Events parked as `Dead`.
    pub dead: u64,
    /// Aggregates whose oldest unsent event is `Dead` or waiting for a retry,
    /// so their later events are held back (ordered mode; 0 when unordered).
    pub blocked_aggregates: u64,
    /// Events held because the broker returned them as unroutable (no
    /// binding for their routing key), across every relay of the outbox.
    pub unroutable: u64,
    /// Relays that deliver: a recent heartbeat (within three of their
    /// heartbeat intervals) and not paused by an operator, across the
    /// outbox; 0 for a store that does not keep relays.
    pub relays_live: u64,
}

/// What [`OutboxStore::claim_for`] found.
#[derive(Debug)]
#[non_exhaustive]
pub enum Claimed<C> {
    /// A batch, held until it is finished or dropped.
    Batch(C),
    /// Nothing is claimable now.
    Empty,
    /// An operator paused the claiming relay: nothing was claimed.
    Paused,
}

/// A failed publish attempt, ready to be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedAttempt {
    /// The event, by its key: the record's [`seq`](OutboxRecord::seq), as in
    /// [`Claim::records`].
    pub seq: i64,
    /// Attempts spent so far, this one included.
    pub attempts: u32,
    /// Why it failed (stored as `last_error`).
    pub error: String,
    /// Retry later, or park as `Dead`.
    pub next: NextStep,
    /// Set while the event is held because it is unroutable (see
    /// [`UnroutablePolicy::Hold`](crate::UnroutablePolicy)): since when.
    /// `None` clears it.
    pub unroutable_since: Option<DateTime<Utc>>,
}

impl FailedAttempt {
    /// The `attempts`-th failed attempt of event `seq`, going `next`, not
    /// held as unroutable.
    ///
    /// ```
    /// use outbox_core::{FailedAttempt, NextStep};
    ///
    /// let failed = FailedAttempt::new(7, 5, "nack", NextStep::Dead);
    /// assert_eq!((failed.seq, failed.attempts, failed.unroutable_since), (7, 5, None));
    /// ```
    pub fn new(seq: i64, attempts: u32, error: impl Into<String>, next: NextStep) -> Self {
        FailedAttempt {
            seq,
            attempts,
            error: error.into(),
            next,
            unroutable_since: None,
        }
    }
}

/// Which `Dead` events an operator replays.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadSelector {
    /// One event.
    Id(Uuid),
    /// Every dead event of one aggregate.
    Aggregate {
        /// Aggregate type.
        aggregate_type: String,
        /// Aggregate id.
        aggregate_id: String,
    },
    /// Every dead event.
    All,
}

/// Storage the [`Relay`](crate::Relay) works on.
///
/// Implementations: `outbox-diesel` (PostgreSQL) and, for tests,
/// `testing::InMemoryStore` (feature `test-util`).
///
/// Contract:
/// - [`claim`](Self::claim) returns claimable events in `seq` order and holds
///   them so no other claimer gets them until the claim is finished, released
///   or lapses (a crashed relay's claim must lapse within a bounded time).
/// - In [`DeliveryOrder::PerAggregate`] an event is claimable only when no
///   earlier (by `seq`) unsent or `Dead` event of its aggregate exists, except
///   earlier events taken by the same claim.
/// - `Retry` events are claimable only once their `next_attempt_at` is past.
pub trait OutboxStore: Send + Sync + 'static {
    /// The store's error.
    type Error: std::error::Error + Send + Sync + 'static;
    /// A batch held by one relay.
    type Claim: Claim<Error = Self::Error>;

    /// Claims up to `limit` events, or `None` when nothing is claimable.
    /// Claims regardless of any relay's pause: the relay claims through
    /// [`claim_for`](Self::claim_for).
    fn claim(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Option<Self::Claim>, Self::Error>> + Send;

    /// Claims as [`claim`](Self::claim) for the relay named `relay`, unless
    /// an operator paused it ([`Claimed::Paused`], nothing claimed): what
    /// the relay calls, so that a pause takes effect at its next claim, not
    /// at its next [`heartbeat`](Self::heartbeat). A store that keeps a
    /// registry of relays reads the pause in the claim itself, atomically
    /// with it: a claim that starts after the pause was stored claims
    /// nothing (the PostgreSQL store: a primary-key probe of the relay's row
    /// in the claim's one statement; the in-memory store: under the lock of
    /// the claim). A relay without a registry entry is not paused.
    ///
    /// The default claims whatever the pause (the relay then learns of it
    /// from its heartbeat).
    fn claim_for(
        &self,
        relay: &str,
        limit: usize,
    ) -> impl Future<Output = Result<Claimed<Self::Claim>, Self::Error>> + Send {
        let _ = relay;
        let claim = self.claim(limit);
        async move {
            Ok(match claim.await? {
                Some(batch) => Claimed::Batch(batch),
                None => Claimed::Empty,
            })
        }
    }

    /// Current [`OutboxStats`].
    fn stats(&self) -> impl Future<Output = Result<OutboxStats, Self::Error>> + Send;

    /// Deletes up to `limit` `Sent` (and `Skipped`) events published before
    /// `before`; returns how many were deleted. Dead events are kept. Call it
    /// repeatedly until it returns less than `limit` to purge in bounded chunks.
    fn purge_sent(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send;

    /// Turns the selected `Dead` events back to `Pending` (keeping their `seq`,
    /// so order is preserved) with their attempts and suspect counts reset;
    /// returns how many.
    fn replay_dead(
        &self,
        selector: DeadSelector,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send;

    /// Marks a `Dead` event `Skipped` (it will never be published) and so
    /// unblocks its aggregate; returns `false` if no dead event has that id.
    fn skip_dead(&self, id: Uuid) -> impl Future<Output = Result<bool, Self::Error>> + Send;

    /// Housekeeping the relay runs every
    /// [`stats_interval`](crate::RelayBuilder::stats_interval), after reading
    /// the stats: e.g. repairing bookkeeping a race may leave behind. The
    /// default does nothing.
    fn maintain(&self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        std::future::ready(Ok(()))
    }

    /// Registers a relay when it starts (replacing a registration of the same
    /// name). The default keeps no registry.
    fn register_relay(
        &self,
        relay: &RelayRegistration,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let _ = relay;
        std::future::ready(Ok(()))
    }

    /// Records that relay `name` is alive with `in_flight` batches, every
    /// [`stats_interval`](crate::RelayBuilder::stats_interval) (at most every
    /// 5 s); returns whether an operator paused it (how a paused relay
    /// learns that it was resumed; a pause itself is seen by the next
    /// [`claim_for`](Self::claim_for) already). The default never pauses.
    fn heartbeat(
        &self,
        name: &str,
        in_flight: u32,
    ) -> impl Future<Output = Result<RelayControl, Self::Error>> + Send {
        let _ = (name, in_flight);
        std::future::ready(Ok(RelayControl::default()))
    }

    /// Removes relay `name` from the registry when it stops cleanly, unless
    /// an operator paused it (its entry stays, so that the next instance
    /// under that name starts paused). The default does nothing.
    fn deregister_relay(&self, name: &str) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let _ = name;
        std::future::ready(Ok(()))
    }

    /// A stream with an item whenever new events may have been recorded
    /// (e.g. on PostgreSQL `NOTIFY`, and once after each (re)connect so the
    /// backlog is rescanned). The relay takes it once when it starts, wakes
    /// itself on each item and drops the stream when it stops: dropping must
    /// release what the stream holds (e.g. close its `LISTEN` connection).
    ///
    /// Items may be coalesced or spurious: each only makes the relay claim
    /// sooner. If the stream ends, the relay logs it once and relies on
    /// polling and in-process notifications
    /// ([`RelayHandle::notify`](crate::RelayHandle::notify)). The default
    /// never yields (and never ends).
    fn wakeups(&self) -> impl Stream<Item = ()> + Send + 'static {
        futures_util::stream::pending()
    }
}

/// A batch of events claimed by one relay.
///
/// Dropping a claim without [`finish`](Self::finish) must release its events
/// (as a rolled-back transaction or lapsed lease does), never mark them.
pub trait Claim: Send {
    /// The store's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The claimed events, in `seq` order.
    fn records(&self) -> &[OutboxRecord];

    /// The ordering setting in force for this batch.
    fn delivery_order(&self) -> DeliveryOrder;

    /// The last instant at which the relay may still publish from this
    /// batch and mark it: stores set it with a margin before the claim may
    /// lapse, so that marking still fits (the PostgreSQL store: 80 % of its
    /// claim timeout). The relay starts no wave after it, and passes it to
    /// [`Publisher::publish`](crate::Publisher::publish) so that a wave's
    /// confirm wait ends by then too (the shorter of the publisher's
    /// confirm timeout and the time left). `None`: no deadline.
    fn valid_until(&self) -> Option<Instant> {
        None
    }

    /// Marks events of this claim `Sent` (broker-confirmed), in one statement.
    ///
    /// Events are named by their key, the record's
    /// [`seq`](OutboxRecord::seq), as in [`records`](Self::records) (so are
    /// those of [`mark_suspect`](Self::mark_suspect) and
    /// [`mark_failed`](Self::mark_failed)). A seq that is not part of this
    /// claim is refused with an error and nothing is marked: a claim never
    /// marks another claim's event. Each call names an event at most once:
    /// a seq repeated within one `mark_sent`, `mark_suspect` or
    /// `mark_failed` call is refused with an error and nothing of that call
    /// is marked (different calls may name the same seq, e.g.
    /// `mark_suspect` then `mark_failed`).
    fn mark_sent(&mut self, seqs: &[i64]) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Counts the connection's death against each of these events of the
    /// claim, by their [`seq`](OutboxRecord::seq) (they were in flight when the broker connection died, see
    /// [`PublishOutcome::ConnectionDied`](crate::PublishOutcome::ConnectionDied)):
    /// `suspect_count + 1` and `last_error = reason`, nothing else (status,
    /// attempts and retry time unchanged). The count is kept in the row so
    /// that every relay sees it. The relay calls it before
    /// [`mark_failed`](Self::mark_failed) in the same claim.
    fn mark_suspect(
        &mut self,
        seqs: &[i64],
        reason: &str,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Stores failed attempts: `Retry` with its next attempt time, or `Dead`
    /// (see [`NextStep::transition`]); each names its event by
    /// [`FailedAttempt::seq`].
    fn mark_failed(
        &mut self,
        failures: &[FailedAttempt],
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Makes the marks durable and releases every event not marked.
    fn finish(self) -> impl Future<Output = Result<(), Self::Error>> + Send;
}
