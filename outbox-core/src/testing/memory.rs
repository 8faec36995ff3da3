//! [`InMemoryStore`]: an [`OutboxStore`] in a mutex.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::admin::{Attempt, AttemptOutcome, AuditRecord, RelayInfo};
use crate::{
    Claim, Claimed, DeadSelector, DeliveryOrder, DomainEvent, Error, EventEnvelope, EventStatus,
    FailedAttempt, NextStep, OutboxRecord, OutboxStats, OutboxStore, RelayControl,
    RelayRegistration, Transition,
};

/// Errors of the in-memory store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A mark for an event this claim does not hold (fencing).
    #[error("event {0} is not held by this claim")]
    NotClaimed(Uuid),
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

    fn is_due(record: &OutboxRecord, now: DateTime<Utc>) -> bool {
        match record.status {
            EventStatus::Pending => true,
            EventStatus::Retry => record.next_attempt_at.is_none_or(|at| at <= now),
            _ => false,
        }
    }

    /// Claims up to `limit` events in `state` (locked by the caller).
    fn claim_locked(&self, state: &mut State, limit: usize) -> Option<InMemoryClaim> {
        state.next_claim += 1;
        let claim_id = state.next_claim;
        let now = Utc::now();
        let mut blocked: HashSet<(String, String)> = HashSet::new();
        let mut taken = Vec::new();
        for row in state.rows.values_mut() {
            if taken.len() >= limit {
                break;
            }
            let record = &row.record;
            if !record.status.blocks_aggregate() {
                continue;
            }
            let ordered = self.order == DeliveryOrder::PerAggregate;
            let key = || {
                (
                    record.envelope.aggregate_type.clone(),
                    record.envelope.aggregate_id.clone(),
                )
            };
            if ordered && blocked.contains(&key()) {
                continue;
            }
            if row.claimed_by.is_some() || !Self::is_due(record, now) {
                if ordered {
                    blocked.insert(key());
                }
                continue;
            }
            row.claimed_by = Some(claim_id);
            taken.push(row.record.clone());
        }
        if taken.is_empty() {
            return None;
        }
        Some(InMemoryClaim {
            state: Arc::clone(&self.state),
            id: claim_id,
            records: taken,
            order: self.order,
            valid_until: self
                .claim_timeout
                .and_then(|t| std::time::Instant::now().checked_add(t)),
        })
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

/// A batch claimed from an [`InMemoryStore`]. Dropping it releases its events.
#[derive(Debug)]
pub struct InMemoryClaim {
    state: Arc<Mutex<State>>,
    id: u64,
    records: Vec<OutboxRecord>,
    order: DeliveryOrder,
    valid_until: Option<std::time::Instant>,
}

impl InMemoryClaim {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies `f` to the rows of `ids`, all or nothing: every id must be held
    /// by this claim and every transition legal.
    fn update(
        &self,
        ids: impl Iterator<Item = Uuid> + Clone,
        f: impl Fn(&mut OutboxRecord, usize) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut state = self.lock();
        InMemoryStore::injected(&mut state)?;
        let wanted: Vec<Uuid> = ids.collect();
        let mut rows: Vec<(usize, &mut Row)> = Vec::with_capacity(wanted.len());
        for row in state.rows.values_mut() {
            if let Some(pos) = wanted.iter().position(|id| *id == row.record.id()) {
                rows.push((pos, row));
            }
        }
        if let Some(missing) = wanted.iter().find(|id| {
            !rows
                .iter()
                .any(|(_, r)| r.record.id() == **id && r.claimed_by == Some(self.id))
        }) {
            return Err(StoreError::NotClaimed(*missing));
        }
        // Validate every transition before changing anything.
        let mut updated = Vec::with_capacity(rows.len());
        for (pos, row) in &rows {
            let mut record = row.record.clone();
            f(&mut record, *pos)?;
            updated.push(record);
        }
        for ((_, row), record) in rows.into_iter().zip(updated) {
            row.record = record;
        }
        Ok(())
    }

    fn release(&self) {
        for row in self.lock().rows.values_mut() {
            if row.claimed_by == Some(self.id) {
                row.claimed_by = None;
            }
        }
    }
}

impl Claim for InMemoryClaim {
    type Error = StoreError;

    fn records(&self) -> &[OutboxRecord] {
        &self.records
    }

    fn delivery_order(&self) -> DeliveryOrder {
        self.order
    }

    fn valid_until(&self) -> Option<std::time::Instant> {
        self.valid_until
    }

    async fn mark_sent(&mut self, ids: &[Uuid]) -> Result<(), StoreError> {
        let now = Utc::now();
        self.update(ids.iter().copied(), |record, _| {
            record.status = record.status.apply(Transition::Publish)?;
            record.published_at = Some(now);
            Ok(())
        })
    }

    async fn mark_suspect(&mut self, ids: &[Uuid], reason: &str) -> Result<(), StoreError> {
        self.update(ids.iter().copied(), |record, _| {
            record.suspect_count = record.suspect_count.saturating_add(1);
            record.last_error = Some(reason.to_owned());
            Ok(())
        })?;
        let mut state = self.lock();
        for id in ids {
            if let Some(seq) = state.seq_of(*id) {
                state.record_attempt(seq, AttemptOutcome::Suspect, reason);
            }
        }
        Ok(())
    }

    async fn mark_failed(&mut self, failures: &[FailedAttempt]) -> Result<(), StoreError> {
        self.update(failures.iter().map(|f| f.id), |record, pos| {
            let failure = &failures[pos];
            let (transition, next_at) = match failure.next {
                NextStep::RetryAt(at) => (Transition::Retry, Some(at)),
                NextStep::Dead => (Transition::Kill, None),
            };
            record.status = record.status.apply(transition)?;
            record.attempts = failure.attempts;
            record.next_attempt_at = next_at;
            record.last_error = Some(failure.error.clone());
            record.unroutable_since = failure.unroutable_since;
            Ok(())
        })?;
        let mut state = self.lock();
        for failure in failures {
            let outcome = match failure.next {
                NextStep::RetryAt(_) => AttemptOutcome::Retry,
                NextStep::Dead => AttemptOutcome::Dead,
            };
            if let Some(seq) = state.seq_of(failure.id) {
                state.record_attempt(seq, outcome, &failure.error);
            }
        }
        Ok(())
    }

    async fn finish(self) -> Result<(), StoreError> {
        // Drop releases every event this claim still holds.
        Ok(())
    }
}

impl Drop for InMemoryClaim {
    fn drop(&mut self) {
        self.release();
    }
}
