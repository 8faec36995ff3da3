//! Suspects: events in flight when the broker connection died. Each is
//! published alone (a call of its own, nothing else of the relay in
//! flight), counted in its row, and parked `Dead` at the suspect limit.

use std::time::Instant;

use tracing::{info, warn};

use super::Relay;
use super::batch::BatchReport;
use super::metric_names;
use crate::trace_context::trace_id;
use crate::{EventEnvelope, FailedAttempt, NextStep, OutboxStore, PublishOutcome, Publisher};

impl<S: OutboxStore, P: Publisher> Relay<S, P> {
    /// Publishes one call's events. A call of a suspect (`alone`) holds the
    /// relay's publisher exclusively: no other batch of this relay is in
    /// flight meanwhile, so if the connection dies, it died with the
    /// suspect alone. `None` when the claim's deadline passed while the
    /// call waited for the publisher (a suspect for the batches in flight,
    /// a batch for a suspect's call).
    pub(super) async fn publish_call(
        &self,
        batch: &[&crate::OutboxRecord],
        alone: bool,
        deadline: Option<Instant>,
    ) -> Option<Vec<PublishOutcome>> {
        let envelopes: Vec<&EventEnvelope> = batch.iter().map(|r| &r.envelope).collect();
        if alone {
            let _alone = before(deadline, self.solo.write()).await?;
            for record in batch {
                info!(
                    event_id = %record.id(),
                    trace_id = trace_id(&record.envelope.headers).as_deref(),
                    suspect_count = record.suspect_count,
                    suspect_limit = self.settings.suspect_limit,
                    "outbox relay: publishing a suspect event alone (the broker connection died \
                     while it was in flight before)",
                );
            }
            Some(self.publisher.publish(&envelopes, deadline).await)
        } else {
            // Queued behind a suspect's call, the wait may outlast the claim.
            let _shared = before(deadline, self.solo.read()).await?;
            Some(self.publisher.publish(&envelopes, deadline).await)
        }
    }

    /// Counts the events that were in flight when the connection died
    /// (`died`: batch index, whether it was alone, the cause) as suspects;
    /// one that was alone and reaches the suspect limit is parked `Dead`
    /// with the reason (no attempt spent). Returns the seqs for
    /// [`Claim::mark_suspect`] and the reason to store, if any died.
    ///
    /// [`Claim::mark_suspect`]: crate::Claim::mark_suspect
    pub(super) fn judge_suspects(
        &self,
        records: &[crate::OutboxRecord],
        died: Vec<(usize, bool, String)>,
        report: &mut BatchReport,
        failures: &mut Vec<FailedAttempt>,
    ) -> Option<(Vec<i64>, String)> {
        let cause = died.first().map(|(_, _, reason)| reason.clone())?;
        let limit = self.settings.suspect_limit;
        ::metrics::counter!(metric_names::SUSPECT_EVENTS_TOTAL).increment(died.len() as u64);
        let mut seqs = Vec::with_capacity(died.len());
        for (i, alone, reason) in died {
            let record = &records[i];
            let count = record.suspect_count.saturating_add(1);
            seqs.push(record.seq);
            if alone && count >= limit {
                let error = format!(
                    "the connection to the broker died {count} times while this event was in \
                     flight, the last time with it alone: {reason}; replay it once the broker \
                     (or a proxy in front of it) accepts it"
                );
                warn!(
                    event_id = %record.id(),
                    event_type = %record.envelope.event_type,
                    trace_id = trace_id(&record.envelope.headers).as_deref(),
                    suspect_count = count,
                    suspect_limit = limit,
                    %reason,
                    "outbox relay: the broker connection died with this event alone in flight \
                     too often; parked dead (no attempt spent)",
                );
                report.dead += 1;
                report.parked += 1;
                failures.push(FailedAttempt::new(
                    record.seq,
                    record.attempts,
                    error,
                    NextStep::Dead,
                ));
            } else {
                warn!(
                    event_id = %record.id(),
                    event_type = %record.envelope.event_type,
                    trace_id = trace_id(&record.envelope.headers).as_deref(),
                    suspect_count = count,
                    suspect_limit = limit,
                    alone,
                    %reason,
                    "outbox relay: the broker connection died while this event was in flight; \
                     it is a suspect and will be published alone (no attempt spent)",
                );
            }
        }
        let reason = format!(
            "suspect: the connection to the broker died while this event was in flight \
             ({cause}); it is published alone from now on and parked dead once the connection \
             dies with it alone {limit} times in all (no attempt spent)"
        );
        Some((seqs, reason))
    }
}

/// Splits a wave's events to send (batch index, destination) into publish
/// calls: one per suspect (an event in flight when the connection died
/// before), flagged `alone`, then one for the events that are not suspects.
/// Each is the head of its aggregate in the batch, so the order of the
/// calls does not matter for per-aggregate order.
pub(super) fn publish_calls(
    records: &[crate::OutboxRecord],
    sending: Vec<(usize, String)>,
) -> Vec<(Vec<(usize, String)>, bool)> {
    let (solos, shared): (Vec<_>, Vec<_>) = sending
        .into_iter()
        .partition(|(i, _)| records[*i].suspect_count > 0);
    // Suspects first: a shared call whose connection dies ends the wave,
    // and a suspect behind it would never get its call alone. (A wave
    // holds one event per aggregate, so the order of its calls keeps
    // per-aggregate order.)
    let mut calls: Vec<_> = solos.into_iter().map(|solo| (vec![solo], true)).collect();
    if !shared.is_empty() {
        calls.push((shared, false));
    }
    calls
}

/// Awaits `lock` until `deadline`, if any: `None` once it has passed (a
/// call that got the publisher only then must not publish).
async fn before<T>(
    deadline: Option<Instant>,
    lock: impl std::future::Future<Output = T>,
) -> Option<T> {
    let Some(deadline) = deadline else {
        return Some(lock.await);
    };
    let at = tokio::time::Instant::from_std(deadline);
    let guard = tokio::time::timeout_at(at, lock).await.ok()?;
    (Instant::now() < deadline).then_some(guard)
}
