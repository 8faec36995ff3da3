//! [`InMemoryClaim`]: a batch claimed from an [`InMemoryStore`], and how
//! the store picks it (per-aggregate order, due retries, claims excluding
//! each other).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};

use super::{InMemoryStore, State, StoreError};
use crate::admin::AttemptOutcome;
use crate::{Claim, DeliveryOrder, EventStatus, FailedAttempt, NextStep, OutboxRecord, Transition};

impl InMemoryStore {
    fn is_due(record: &OutboxRecord, now: DateTime<Utc>) -> bool {
        match record.status {
            EventStatus::Pending => true,
            EventStatus::Retry => record.next_attempt_at.is_none_or(|at| at <= now),
            _ => false,
        }
    }

    /// Claims up to `limit` events in `state` (locked by the caller).
    pub(super) fn claim_locked(&self, state: &mut State, limit: usize) -> Option<InMemoryClaim> {
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

    /// Applies `f` to the rows of `seqs`, all or nothing: every seq must be
    /// one of [`records`](Claim::records) (found by binary search, they are
    /// in seq order), still held by this claim, and every transition legal.
    fn update(
        &self,
        seqs: impl Iterator<Item = i64>,
        f: impl Fn(&mut OutboxRecord, usize) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let mut state = self.lock();
        InMemoryStore::injected(&mut state)?;
        let wanted: Vec<i64> = seqs.collect();
        // One pass in call order, as the PostgreSQL store checks: the first
        // seq not held by this claim, or the first named again, refuses
        // the whole call.
        let mut named = vec![false; self.records.len()];
        for &seq in &wanted {
            let held = state
                .rows
                .get(&seq)
                .is_some_and(|row| row.claimed_by == Some(self.id));
            let at = self
                .records
                .binary_search_by_key(&seq, |r| r.seq)
                .ok()
                .filter(|_| held)
                .ok_or(StoreError::NotInClaim { seq })?;
            if std::mem::replace(&mut named[at], true) {
                return Err(StoreError::DuplicateSeq { seq });
            }
        }
        // Validate every transition before changing anything.
        let mut updated = Vec::with_capacity(wanted.len());
        for (pos, seq) in wanted.iter().enumerate() {
            if let Some(row) = state.rows.get(seq) {
                let mut record = row.record.clone();
                f(&mut record, pos)?;
                updated.push((*seq, record));
            }
        }
        for (seq, record) in updated {
            if let Some(row) = state.rows.get_mut(&seq) {
                row.record = record;
            }
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

    async fn mark_sent(&mut self, seqs: &[i64]) -> Result<(), StoreError> {
        let now = Utc::now();
        self.update(seqs.iter().copied(), |record, _| {
            record.status = record.status.apply(Transition::Publish)?;
            record.published_at = Some(now);
            Ok(())
        })
    }

    async fn mark_suspect(&mut self, seqs: &[i64], reason: &str) -> Result<(), StoreError> {
        self.update(seqs.iter().copied(), |record, _| {
            record.suspect_count = record.suspect_count.saturating_add(1);
            record.last_error = Some(reason.to_owned());
            Ok(())
        })?;
        let mut state = self.lock();
        for &seq in seqs {
            state.record_attempt(seq, AttemptOutcome::Suspect, reason);
        }
        Ok(())
    }

    async fn mark_failed(&mut self, failures: &[FailedAttempt]) -> Result<(), StoreError> {
        self.update(failures.iter().map(|f| f.seq), |record, pos| {
            let failure = &failures[pos];
            record.status = record.status.apply(failure.next.transition())?;
            record.attempts = failure.attempts;
            record.next_attempt_at = failure.next.next_attempt_at();
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
            state.record_attempt(failure.seq, outcome, &failure.error);
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
