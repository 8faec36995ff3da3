//! [`InMemoryStore`]: an [`OutboxStore`] in a mutex.
//!
//! The claim ([`InMemoryClaim`], and how the store makes one) is in
//! `memory/claim.rs`; the admin store in `memory/admin.rs`.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::admin::{Attempt, AttemptOutcome, AuditRecord, RelayInfo};
use crate::{
    Claimed, DeadSelector, DeliveryOrder, DomainEvent, Error, EventEnvelope, EventStatus,
    OutboxRecord, OutboxStats, OutboxStore, RelayControl, RelayRegistration, Transition,
};

pub use claim::InMemoryClaim;

/// Errors of the in-memory store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A mark for an event (by its `seq`) this claim does not hold
    /// (fencing): nothing of the call was marked.
    #[error(
        "event seq {seq} is not part of this claim, nothing was marked: mark only the seqs of \
         the claim's own records()"
    )]
    NotInClaim {
        /// The seq that was refused.
        seq: i64,
    },
    /// A mark named an event's `seq` more than once: nothing of the call
    /// was marked.
    #[error(
        "event seq {seq} is named more than once in one mark, nothing was marked: name each of \
         the claim's records at most once per mark"
    )]
    DuplicateSeq {
        /// The seq named twice.
        seq: i64,
    },
    /// An illegal status change.
    #[error(transparent)]
    Transition(#[from] Error),
    /// A failure injected with [`InMemoryStore::fail_next`].
    #[error("injected store failure")]
    Injected,
}

#[derive(Debug, Default)]
struct State {
    rows: BTreeMap<i64, Row>,
    next_seq: i64,
    next_claim: u64,
    fail_next: usize,
    /// Failed attempts per `seq`, the last [`ATTEMPTS_KEPT`](crate::admin::ATTEMPTS_KEPT).
    attempts: BTreeMap<i64, Vec<Attempt>>,
    audit: Vec<AuditRecord>,
    /// Registered relays with their heartbeat interval.
    relays: BTreeMap<String, (RelayInfo, Duration)>,
}

impl State {
    fn record_attempt(&mut self, seq: i64, outcome: AttemptOutcome, error: &str) {
        let kept = self.attempts.entry(seq).or_default();
        kept.push(Attempt::new(Utc::now(), None, outcome, error));
        let excess = kept.len().saturating_sub(crate::admin::ATTEMPTS_KEPT);
        kept.drain(..excess);
    }

    fn seq_of(&self, id: Uuid) -> Option<i64> {
        self.rows
            .iter()
            .find(|(_, r)| r.record.id() == id)
            .map(|(seq, _)| *seq)
    }
}

mod admin;
mod claim;

#[derive(Debug)]
struct Row {
    record: OutboxRecord,
    claimed_by: Option<u64>,
}

/// An in-memory outbox with the claim semantics of the PostgreSQL store.
///
/// Cloning gives another handle to the same store.
#[derive(Debug, Clone, Default)]
pub struct InMemoryStore {
    state: Arc<Mutex<State>>,
    order: DeliveryOrder,
    claim_timeout: Option<Duration>,
}

impl InMemoryStore {
    /// An empty store in [`DeliveryOrder::PerAggregate`] mode.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store in [`DeliveryOrder::Unordered`] mode.
    pub fn unordered() -> Self {
        InMemoryStore {
            state: Arc::default(),
            order: DeliveryOrder::Unordered,
            claim_timeout: None,
        }
    }

    /// Gives every claim a [`Claim::valid_until`] `timeout` after it was
    /// taken (as a store whose claims lapse does; the in-memory claim
    /// itself never lapses). Default: no deadline.
    ///
    /// [`Claim::valid_until`]: crate::Claim::valid_until
    #[must_use]
    pub fn with_claim_timeout(mut self, timeout: Duration) -> Self {
        self.claim_timeout = Some(timeout);
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock only happens in a failing test; the
        // state is still consistent (every mutation is a single assignment).
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records `event` as `Pending` (as if its transaction committed).
    ///
    /// # Errors
    /// The errors of [`EventEnvelope::from_event`].
    pub fn record<E: DomainEvent + ?Sized>(&self, event: &E) -> Result<Uuid, Error> {
        let envelope = EventEnvelope::from_event(event)?;
        let id = envelope.id;
        self.record_envelope(envelope)?;
        Ok(id)
    }

    /// Records a prepared envelope as `Pending`.
    ///
    /// # Errors
    /// [`Error::InvalidEvent`] if the envelope is invalid.
    pub fn record_envelope(&self, envelope: EventEnvelope) -> Result<i64, Error> {
        envelope.validate()?;
        let mut state = self.lock();
        state.next_seq += 1;
        let seq = state.next_seq;
        state.rows.insert(
            seq,
            Row {
                record: OutboxRecord::pending(seq, envelope),
                claimed_by: None,
            },
        );
        Ok(seq)
    }

    /// Every record, in `seq` order.
    pub fn records(&self) -> Vec<OutboxRecord> {
        self.lock()
            .rows
            .values()
            .map(|r| r.record.clone())
            .collect()
    }

    /// The record of event `id`.
    pub fn get(&self, id: Uuid) -> Option<OutboxRecord> {
        self.lock()
            .rows
            .values()
            .find(|r| r.record.id() == id)
            .map(|r| r.record.clone())
    }

    /// How many events are currently held by a claim.
    pub fn claimed(&self) -> usize {
        self.lock()
            .rows
            .values()
            .filter(|r| r.claimed_by.is_some())
            .count()
    }

    /// Makes every `Retry` event due now, so tests need not wait for backoff.
    pub fn expedite_retries(&self) {
        let now = Utc::now();
        for row in self.lock().rows.values_mut() {
            if row.record.status == EventStatus::Retry {
                row.record.next_attempt_at = Some(now);
            }
        }
    }

    /// Makes the next `n` store calls fail with [`StoreError::Injected`].
    pub fn fail_next(&self, n: usize) {
        self.lock().fail_next = n;
    }

    fn injected(state: &mut State) -> Result<(), StoreError> {
        if state.fail_next > 0 {
            state.fail_next -= 1;
            return Err(StoreError::Injected);
        }
        Ok(())
    }
}

impl OutboxStore for InMemoryStore {
    type Error = StoreError;
    type Claim = InMemoryClaim;

    async fn claim(&self, limit: usize) -> Result<Option<InMemoryClaim>, StoreError> {
        let mut state = self.lock();
        Self::injected(&mut state)?;
        Ok(self.claim_locked(&mut state, limit))
    }

    /// Reads the relay's pause under the same lock as the claim, as the
    /// PostgreSQL store reads it in the claim's statement.
    async fn claim_for(
        &self,
        relay: &str,
        limit: usize,
    ) -> Result<Claimed<InMemoryClaim>, StoreError> {
        let mut state = self.lock();
        Self::injected(&mut state)?;
        if state.relays.get(relay).is_some_and(|(info, _)| info.paused) {
            return Ok(Claimed::Paused);
        }
        Ok(match self.claim_locked(&mut state, limit) {
            Some(claim) => Claimed::Batch(claim),
            None => Claimed::Empty,
        })
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        let mut state = self.lock();
        Self::injected(&mut state)?;
        let now = Utc::now();
        let mut stats = OutboxStats::default();
        let mut seen_head: HashSet<(&str, &str)> = HashSet::new();
        for row in state.rows.values() {
            let record = &row.record;
            if record.status.is_unsent() {
                stats.backlog += 1;
                let age = (now - record.envelope.occurred_at)
                    .to_std()
                    .unwrap_or(Duration::ZERO);
                stats.oldest_unsent_age = Some(stats.oldest_unsent_age.map_or(age, |a| a.max(age)));
            }
            if record.status == EventStatus::Dead {
                stats.dead += 1;
            }
            if record.status == EventStatus::Retry && record.unroutable_since.is_some() {
                stats.unroutable += 1;
            }
            if self.order == DeliveryOrder::PerAggregate
                && record.status.blocks_aggregate()
                && seen_head.insert(record.envelope.aggregate_key())
                && matches!(record.status, EventStatus::Dead | EventStatus::Retry)
            {
                stats.blocked_aggregates += 1;
            }
        }
        stats.relays_live = Self::live_relays(&state);
        Ok(stats)
    }

    async fn register_relay(&self, relay: &RelayRegistration) -> Result<(), StoreError> {
        self.register(relay);
        Ok(())
    }

    async fn heartbeat(&self, name: &str, in_flight: u32) -> Result<RelayControl, StoreError> {
        Ok(self.beat(name, in_flight))
    }

    async fn deregister_relay(&self, name: &str) -> Result<(), StoreError> {
        // A paused relay's entry stays, so that it restarts paused.
        self.lock()
            .relays
            .retain(|n, (info, _)| n != name || info.paused);
        Ok(())
    }

    async fn purge_sent(&self, before: DateTime<Utc>, limit: usize) -> Result<u64, StoreError> {
        let mut state = self.lock();
        Self::injected(&mut state)?;
        let doomed: Vec<i64> = state
            .rows
            .iter()
            .filter(|(_, row)| match row.record.status {
                EventStatus::Sent => row.record.published_at.is_some_and(|at| at < before),
                EventStatus::Skipped => row.record.envelope.occurred_at < before,
                _ => false,
            })
            .map(|(seq, _)| *seq)
            .take(limit)
            .collect();
        for seq in &doomed {
            state.rows.remove(seq);
            state.attempts.remove(seq);
        }
        Ok(doomed.len() as u64)
    }

    async fn replay_dead(&self, selector: DeadSelector) -> Result<u64, StoreError> {
        let mut state = self.lock();
        Self::injected(&mut state)?;
        let mut replayed = 0;
        for row in state.rows.values_mut() {
            let env = &row.record.envelope;
            let selected = match &selector {
                DeadSelector::Id(id) => env.id == *id,
                DeadSelector::Aggregate {
                    aggregate_type,
                    aggregate_id,
                } => env.aggregate_type == *aggregate_type && env.aggregate_id == *aggregate_id,
                DeadSelector::All => true,
            };
            if selected && row.record.status == EventStatus::Dead {
                row.record.status = row.record.status.apply(Transition::Replay)?;
                row.record.attempts = 0;
                row.record.suspect_count = row.record.suspect_count.min(1);
                row.record.next_attempt_at = None;
                replayed += 1;
            }
        }
        Ok(replayed)
    }

    async fn skip_dead(&self, id: Uuid) -> Result<bool, StoreError> {
        let mut state = self.lock();
        Self::injected(&mut state)?;
        match state
            .rows
            .values_mut()
            .find(|r| r.record.id() == id && r.record.status == EventStatus::Dead)
        {
            Some(row) => {
                row.record.status = row.record.status.apply(Transition::Skip)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}
