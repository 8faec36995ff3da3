//! The admin API of the [`InMemoryStore`] (the reference semantics; the
//! in-memory store keeps no inbox, so inbox purges delete nothing).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{InMemoryStore, State, StoreError};
use crate::admin::{
    AuditEntry, AuditRecord, Chunk, EventDetail, EventFilter, EventSummary, EventTypeCounts,
    FailureGroup, OutboxAdmin, Page, RelayInfo, StatusCounts, StatusReport, group_failures,
};
use crate::{EventStatus, OutboxRecord, OutboxStore, RelayControl, RelayRegistration, Transition};

impl State {
    /// Rows matching `filter` with `seq > after`, in `seq` order, not held
    /// by a claim, at most `limit`.
    fn select(&self, filter: &EventFilter, after: Option<i64>, limit: usize) -> Vec<i64> {
        self.rows
            .range(after.map_or(i64::MIN, |a| a.saturating_add(1))..)
            .filter(|(_, row)| row.claimed_by.is_none() && filter.matches(&row.record))
            .take(limit)
            .map(|(seq, _)| *seq)
            .collect()
    }

    fn add_to_audit(&mut self, audit: Option<i64>, n: u64) {
        if let Some(row) = audit.and_then(|id| self.audit.iter_mut().find(|r| r.id == id)) {
            row.count += n;
        }
    }

    /// Applies `f` to the selected rows; counts those it changed.
    fn change(
        &mut self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
        f: impl Fn(&mut OutboxRecord) -> Result<bool, StoreError>,
    ) -> Result<Chunk, StoreError> {
        let seqs = self.select(filter, after, limit);
        let mut changed = 0;
        for seq in &seqs {
            if let Some(row) = self.rows.get_mut(seq)
                && f(&mut row.record)?
            {
                changed += 1;
            }
        }
        self.add_to_audit(Some(audit), changed);
        Ok(Chunk {
            changed,
            last: seqs.last().copied(),
        })
    }

    fn relay_infos(&self) -> Vec<RelayInfo> {
        let now = Utc::now();
        self.relays
            .values()
            .map(|(info, interval)| {
                let mut info = info.clone();
                let age = (now - info.heartbeat_at).to_std().unwrap_or(Duration::ZERO);
                info.live = age <= *interval * 3;
                info
            })
            .collect()
    }
}

impl OutboxAdmin for InMemoryStore {
    type Error = StoreError;

    async fn status(&self) -> Result<StatusReport, StoreError> {
        let stats = self.stats().await?;
        let state = self.lock();
        let mut counts = StatusCounts::default();
        let mut by_type: BTreeMap<String, StatusCounts> = BTreeMap::new();
        for row in state.rows.values() {
            let status = row.record.status;
            counts.add(status, 1);
            if status.is_unsent() || status == EventStatus::Dead {
                by_type
                    .entry(row.record.envelope.event_type.clone())
                    .or_default()
                    .add(status, 1);
            }
        }
        let mut by_event_type: Vec<EventTypeCounts> = by_type
            .into_iter()
            .map(|(t, c)| EventTypeCounts::new(t, c))
            .collect();
        by_event_type.sort_by_key(|t| std::cmp::Reverse(t.counts.unsent() + t.counts.dead));
        Ok(StatusReport {
            counts,
            oldest_unsent_age_seconds: stats.oldest_unsent_age.map(|a| a.as_secs_f64()),
            blocked_aggregates: stats.blocked_aggregates,
            unroutable: stats.unroutable,
            by_event_type,
            relays: state.relay_infos(),
            delivery_order: self.order,
        })
    }

    async fn list(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Page<EventSummary>, StoreError> {
        let state = self.lock();
        let items: Vec<EventSummary> = state
            .rows
            .range(after.map_or(i64::MIN, |a| a.saturating_add(1))..)
            .filter(|(_, row)| filter.matches(&row.record))
            .take(limit)
            .map(|(_, row)| EventSummary::from(&row.record))
            .collect();
        let next = if items.len() == limit {
            items.last().map(|e| e.seq)
        } else {
            None
        };
        Ok(Page::new(items, next))
    }

    async fn show(&self, id: Uuid) -> Result<Option<EventDetail>, StoreError> {
        let state = self.lock();
        Ok(state.seq_of(id).and_then(|seq| {
            let row = state.rows.get(&seq)?;
            let history = state.attempts.get(&seq).cloned().unwrap_or_default();
            Some(EventDetail::new(&row.record, history))
        }))
    }

    async fn failure_groups(&self, filter: &EventFilter) -> Result<Vec<FailureGroup>, StoreError> {
        let Some(filter) = filter.restricted_to(&[EventStatus::Dead, EventStatus::Retry]) else {
            return Ok(Vec::new());
        };
        let state = self.lock();
        let rows = state
            .rows
            .values()
            .filter(|row| filter.matches(&row.record))
            .filter_map(|row| {
                let r = &row.record;
                let at = r.envelope.occurred_at;
                r.last_error
                    .clone()
                    .map(|e| (r.envelope.event_type.clone(), e, r.status, 1, at, at))
            })
            .collect::<Vec<_>>();
        Ok(group_failures(rows))
    }

    async fn count(&self, filter: &EventFilter) -> Result<u64, StoreError> {
        let state = self.lock();
        Ok(state
            .rows
            .values()
            .filter(|row| filter.matches(&row.record))
            .count() as u64)
    }

    async fn last_seq(&self) -> Result<Option<i64>, StoreError> {
        Ok(self.lock().rows.keys().next_back().copied())
    }

    async fn head(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<Option<EventSummary>, StoreError> {
        let state = self.lock();
        Ok(state
            .rows
            .values()
            .map(|row| &row.record)
            .find(|r| {
                r.envelope.aggregate_key() == (aggregate_type, aggregate_id)
                    && r.status.blocks_aggregate()
            })
            .filter(|r| matches!(r.status, EventStatus::Retry | EventStatus::Dead))
            .map(EventSummary::from))
    }

    async fn begin_audit(&self, entry: &AuditEntry) -> Result<i64, StoreError> {
        let mut state = self.lock();
        let id = state.audit.last().map_or(1, |r| r.id + 1);
        state
            .audit
            .push(AuditRecord::new(id, Utc::now(), entry.clone(), 0));
        Ok(id)
    }

    async fn finish_audit(&self, audit: i64, outcome: &str) -> Result<(), StoreError> {
        let mut state = self.lock();
        if let Some(row) = state.audit.iter_mut().find(|r| r.id == audit) {
            *row = row.clone().finished(Utc::now(), outcome);
        }
        Ok(())
    }

    async fn audit_log(
        &self,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let state = self.lock();
        Ok(state
            .audit
            .iter()
            .rev()
            .filter(|r| before.is_none_or(|b| r.id < b))
            .take(limit)
            .cloned()
            .collect())
    }

    async fn replay_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk, StoreError> {
        let Some(filter) = filter.restricted_to(Transition::Replay.from()) else {
            return Ok(Chunk::default());
        };
        self.lock().change(&filter, after, limit, audit, |record| {
            record.status = record.status.apply(Transition::Replay)?;
            record.attempts = 0;
            record.suspect_count = record.suspect_count.min(1);
            record.next_attempt_at = None;
            Ok(true)
        })
    }

    async fn skip_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk, StoreError> {
        let Some(filter) = filter.restricted_to(Transition::Skip.from()) else {
            return Ok(Chunk::default());
        };
        self.lock().change(&filter, after, limit, audit, |record| {
            record.status = record.status.apply(Transition::Skip)?;
            record.next_attempt_at = None;
            Ok(true)
        })
    }

    async fn retry_now_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk, StoreError> {
        let Some(filter) = filter.restricted_to(&[EventStatus::Retry]) else {
            return Ok(Chunk::default());
        };
        let now = Utc::now();
        self.lock().change(&filter, after, limit, audit, |record| {
            let due = record.next_attempt_at.is_some_and(|at| at <= now);
            record.next_attempt_at = Some(now);
            Ok(!due)
        })
    }

    async fn purge_sent_chunk(
        &self,
        before: DateTime<Utc>,
        after: Option<i64>,
        limit: usize,
        audit: Option<i64>,
    ) -> Result<Chunk, StoreError> {
        let mut state = self.lock();
        let scanned: Vec<(i64, bool)> = state
            .rows
            .range(after.map_or(i64::MIN, |a| a.saturating_add(1))..)
            .take(limit)
            .map(|(seq, row)| {
                let r = &row.record;
                let doomed = row.claimed_by.is_none()
                    && match r.status {
                        EventStatus::Sent => r.published_at.is_some_and(|at| at < before),
                        EventStatus::Skipped => r.envelope.occurred_at < before,
                        _ => false,
                    };
                (*seq, doomed)
            })
            .collect();
        let mut changed = 0;
        for (seq, doomed) in &scanned {
            if *doomed {
                state.rows.remove(seq);
                state.attempts.remove(seq);
                changed += 1;
            }
        }
        state.add_to_audit(audit, changed);
        Ok(Chunk {
            changed,
            last: scanned.last().map(|(seq, _)| *seq),
        })
    }

    async fn purge_inbox_chunk(
        &self,
        _before: DateTime<Utc>,
        _limit: usize,
        _audit: Option<i64>,
    ) -> Result<u64, StoreError> {
        Ok(0)
    }

    async fn purge_stale_relays(&self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        let mut state = self.lock();
        let n = state.relays.len();
        state
            .relays
            .retain(|_, (info, _)| info.heartbeat_at >= before);
        Ok((n - state.relays.len()) as u64)
    }

    async fn relays(&self) -> Result<Vec<RelayInfo>, StoreError> {
        Ok(self.lock().relay_infos())
    }

    async fn set_paused(&self, relay: &str, paused: bool, audit: i64) -> Result<bool, StoreError> {
        let mut state = self.lock();
        let found = match state.relays.get_mut(relay) {
            Some((info, _)) => {
                info.paused = paused;
                true
            }
            None => false,
        };
        state.add_to_audit(Some(audit), u64::from(found));
        Ok(found)
    }
}

impl InMemoryStore {
    pub(super) fn register(&self, relay: &RelayRegistration) {
        let now = Utc::now();
        let mut state = self.lock();
        // Registering again under a name keeps an operator's pause.
        let paused = state.relays.get(&relay.name).is_some_and(|(r, _)| r.paused);
        let info = RelayInfo {
            name: relay.name.clone(),
            host: relay.host.clone(),
            pid: relay.pid,
            version: relay.version.clone(),
            started_at: relay.started_at,
            heartbeat_at: now,
            in_flight: 0,
            paused,
            live: true,
        };
        state
            .relays
            .insert(relay.name.clone(), (info, relay.heartbeat_interval));
    }

    pub(super) fn beat(&self, name: &str, in_flight: u32) -> RelayControl {
        let mut state = self.lock();
        match state.relays.get_mut(name) {
            Some((info, _)) => {
                info.heartbeat_at = Utc::now();
                info.in_flight = in_flight;
                RelayControl::new(info.paused)
            }
            None => RelayControl::default(),
        }
    }

    pub(super) fn live_relays(state: &State) -> u64 {
        state
            .relay_infos()
            .iter()
            .filter(|r| r.live && !r.paused)
            .count() as u64
    }
}
