//! One claimed batch: published in waves (held back by open circuit
//! breakers), each outcome settled, then marked in the store.

use std::time::Instant;

use chrono::Utc;
use tracing::{debug, warn};

use super::metric_names;
use super::suspect::publish_calls;
use super::waves::Waves;
use super::{Relay, UnroutablePolicy};
use crate::failpoints;
use crate::trace_context::trace_id;
use crate::{Claim, FailedAttempt, NextStep, OutboxStore, PublishOutcome, Publisher};

/// What one batch did.
#[derive(Debug, Default)]
pub(super) struct BatchReport {
    sent: usize,
    failed: usize,
    pub(super) dead: usize,
    released: usize,
    /// Events sent after a failed attempt: the store may have released
    /// events of their aggregates that waited behind them.
    pub(super) sent_retries: usize,
    /// Released with a delay and no attempt spent (unconfirmed, or held by
    /// a destination's open circuit breaker).
    held: usize,
    /// Suspects parked `Dead` (no attempt spent) after the connection died
    /// with them alone in flight once too often.
    pub(super) parked: usize,
    /// Set when the broker is unavailable (connection lost, blocked, or a
    /// whole wave unconfirmed): the relay pauses.
    pub(super) connection_lost: Option<String>,
    /// The claim lapsed before every event was published (the rest was
    /// released): the batch was too large for its lease.
    pub(super) lapsed: bool,
}

impl BatchReport {
    /// Whether every event was published or failed on its own (none held
    /// back by a breaker or an unroutable hold, none released because the
    /// claim lapsed, no connection lost): the next claim may grow.
    pub(super) fn settled(&self) -> bool {
        !self.lapsed && self.held == 0 && self.connection_lost.is_none()
    }
}

impl<S: OutboxStore, P: Publisher> Relay<S, P> {
    /// Processes the batch; once shutdown is requested, gives it
    /// `shutdown_grace` to finish, then drops it (releasing its events).
    pub(super) async fn process_with_grace(
        &self,
        claim: S::Claim,
    ) -> Option<Result<BatchReport, S::Error>> {
        let grace = async {
            self.handle.shutdown_requested().await;
            tokio::time::sleep(self.settings.shutdown_grace).await;
        };
        tokio::select! {
            report = self.process(claim) => Some(report),
            () = grace => {
                warn!(grace = ?self.settings.shutdown_grace, "outbox relay: batch did not finish within the shutdown grace period; releasing it unmarked");
                None
            }
        }
    }

    async fn process(&self, mut claim: S::Claim) -> Result<BatchReport, S::Error> {
        let started = Instant::now();
        let mut report = BatchReport::default();
        let mut sent: Vec<i64> = Vec::new();
        let mut failures: Vec<FailedAttempt> = Vec::new();
        // Events in flight when the connection died: (batch index, whether
        // it was alone, what happened to the connection).
        let mut died: Vec<(usize, bool, String)> = Vec::new();
        let suspects: Option<(Vec<i64>, String)>;
        {
            let records = claim.records();
            let deadline = claim.valid_until();
            let mut waves = Waves::new(records, claim.delivery_order());
            // After a suspect's call the broker did not confirm, the batch's
            // other suspects wait for a later batch (unsent, no attempt
            // spent) instead of each waiting a confirm timeout.
            let mut solos_stalled = false;
            'waves: loop {
                let wave = waves.next_wave();
                if wave.is_empty() {
                    break;
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    warn!(
                        "outbox relay: claim lapsed before the batch was published; releasing the rest"
                    );
                    report.lapsed = true;
                    break;
                }
                // Events whose destination stopped confirming lately wait
                // for its breaker without being sent.
                let now = Utc::now();
                let mut sending = Vec::with_capacity(wave.len());
                for &i in &wave {
                    let record = &records[i];
                    let destination = self.publisher.destination(&record.envelope);
                    match self.breakers.open_until(&destination, now) {
                        Some(until) => {
                            report.held += 1;
                            failures.push(held(
                                record,
                                until,
                                format!(
                                    "held back: the broker confirmed nothing published to \
                                     {destination} lately (circuit breaker open); no attempt spent"
                                ),
                            ));
                            waves.block(i);
                        }
                        None => sending.push((i, destination)),
                    }
                }
                for (sending, alone) in publish_calls(records, sending) {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        warn!(
                            "outbox relay: claim lapsed before the batch was published; releasing the rest"
                        );
                        report.lapsed = true;
                        break 'waves;
                    }
                    // A breaker an earlier call of this wave tripped holds
                    // the later calls' events of that destination too.
                    let now = Utc::now();
                    let mut call = Vec::with_capacity(sending.len());
                    for (i, destination) in sending {
                        if alone && solos_stalled {
                            waves.block(i);
                            continue;
                        }
                        match self.breakers.open_until(&destination, now) {
                            Some(until) => {
                                report.held += 1;
                                failures.push(held(
                                    &records[i],
                                    until,
                                    format!(
                                        "held back: the broker confirmed nothing published to \
                                         {destination} lately (circuit breaker open); no attempt \
                                         spent"
                                    ),
                                ));
                                waves.block(i);
                            }
                            None => call.push((i, destination)),
                        }
                    }
                    let sending = call;
                    if sending.is_empty() {
                        continue;
                    }
                    let batch: Vec<&crate::OutboxRecord> =
                        sending.iter().map(|(i, _)| &records[*i]).collect();
                    let Some(outcomes) = self.publish_call(&batch, alone, deadline).await else {
                        warn!(
                            "outbox relay: claim lapsed while a suspect event waited to be \
                             published alone; releasing the rest"
                        );
                        report.lapsed = true;
                        break 'waves;
                    };
                    // One clock reading per call: what the confirms of this
                    // call are measured against.
                    let confirmed_at = Utc::now();
                    let mut outcomes = outcomes.into_iter();
                    let mut unconfirmed: Vec<(usize, &str, String)> = Vec::new();
                    for (i, destination) in &sending {
                        let i = *i;
                        let record = &records[i];
                        let outcome = outcomes.next().unwrap_or_else(|| {
                            PublishOutcome::connection_lost(
                                "publisher returned no outcome for this event",
                            )
                        });
                        let (reason, hopeless) = match outcome {
                            PublishOutcome::Acked => {
                                self.breakers.confirmed(destination);
                                raise_to_confirm(&record.envelope, confirmed_at);
                                sent.push(record.seq);
                                if record.status == crate::EventStatus::Retry {
                                    report.sent_retries += 1;
                                }
                                continue;
                            }
                            PublishOutcome::ConnectionLost { reason } => {
                                report.connection_lost.get_or_insert(reason);
                                waves.block_all();
                                continue;
                            }
                            PublishOutcome::ConnectionDied { reason } => {
                                report.connection_lost.get_or_insert_with(|| reason.clone());
                                died.push((i, alone, reason));
                                waves.block_all();
                                continue;
                            }
                            PublishOutcome::Unconfirmed { reason } => {
                                unconfirmed.push((i, destination, reason));
                                continue;
                            }
                            PublishOutcome::Unroutable { reason } => {
                                match self.settings.unroutable.policy(&record.envelope.event_type) {
                                    UnroutablePolicy::Accept => {
                                        ::metrics::counter!(
                                            metric_names::UNROUTABLE_ACCEPTED_TOTAL
                                        )
                                        .increment(1);
                                        sent.push(record.seq);
                                        continue;
                                    }
                                    UnroutablePolicy::Hold {
                                        max_hold,
                                        max_delay,
                                    } => {
                                        let now = Utc::now();
                                        let since = record.unroutable_since.unwrap_or(now);
                                        if (now - since).to_std().unwrap_or_default() <= max_hold {
                                            if self.settings.unroutable.should_warn(destination) {
                                                warn!(
                                                    %destination,
                                                    event_id = %record.id(),
                                                    event_type = %record.envelope.event_type,
                                                    trace_id = trace_id(&record.envelope.headers)
                                                        .as_deref(),
                                                    %reason,
                                                    "outbox relay: unroutable events are held (no \
                                                     attempt spent) until a queue is bound for \
                                                     their routing key",
                                                );
                                            }
                                            report.held += 1;
                                            failures.push(FailedAttempt {
                                                unroutable_since: Some(since),
                                                ..held(
                                                    record,
                                                    UnroutablePolicy::next_try(
                                                        since, now, max_delay,
                                                    ),
                                                    format!("held: {reason}; no attempt spent"),
                                                )
                                            });
                                            waves.block(i);
                                            continue;
                                        }
                                        (
                                            format!(
                                                "unroutable for longer than {max_hold:?} (the \
                                             unroutable policy's max_hold): {reason}"
                                            ),
                                            true,
                                        )
                                    }
                                    _ => (reason, false),
                                }
                            }
                            PublishOutcome::Rejected { reason } => (reason, false),
                            PublishOutcome::Unpublishable { reason } => (reason, true),
                        }; // `PublishOutcome` is non-exhaustive for other crates only.
                        let attempts = record.attempts.saturating_add(1);
                        let next = if hopeless {
                            NextStep::Dead
                        } else {
                            self.settings.retry.next_step(attempts, Utc::now())
                        };
                        warn!(
                            event_id = %record.id(),
                            event_type = %record.envelope.event_type,
                            trace_id = trace_id(&record.envelope.headers).as_deref(),
                            attempts,
                            next = ?next,
                            %reason,
                            "outbox relay: publish failed",
                        );
                        if next == NextStep::Dead {
                            report.dead += 1;
                        }
                        failures.push(FailedAttempt::new(record.seq, attempts, reason, next));
                        waves.block(i);
                    }
                    if alone && !unconfirmed.is_empty() {
                        solos_stalled = true;
                    }
                    self.settle_unconfirmed(
                        records,
                        &mut waves,
                        unconfirmed,
                        sending.len(),
                        &mut report,
                        &mut failures,
                    );
                    if report.connection_lost.is_some() {
                        break 'waves;
                    }
                }
            }
            suspects = self.judge_suspects(records, died, &mut report, &mut failures);
        }
        failpoints::hit(failpoints::AFTER_CONFIRM_BEFORE_MARK);
        if !sent.is_empty() {
            claim.mark_sent(&sent).await?;
        }
        failpoints::hit(failpoints::DURING_MARK);
        if let Some((seqs, reason)) = &suspects {
            claim.mark_suspect(seqs, reason).await?;
        }
        if !failures.is_empty() {
            claim.mark_failed(&failures).await?;
        }
        let claimed = claim.records().len();
        claim.finish().await?;

        report.sent = sent.len();
        report.failed = failures.len() - report.held - report.parked;
        report.released = claimed - report.sent - failures.len();
        let span = tracing::Span::current();
        span.record("sent", report.sent);
        span.record("failed", report.failed);
        ::metrics::counter!(metric_names::PUBLISHED_TOTAL).increment(report.sent as u64);
        ::metrics::counter!(metric_names::FAILED_TOTAL).increment(report.failed as u64);
        ::metrics::counter!(metric_names::DEAD_TOTAL).increment(report.dead as u64);
        ::metrics::counter!(metric_names::HELD_TOTAL).increment(report.held as u64);
        ::metrics::histogram!(metric_names::BATCH_SIZE).record(claimed as f64);
        ::metrics::histogram!(metric_names::BATCH_DURATION_SECONDS)
            .record(started.elapsed().as_secs_f64());
        debug!(
            sent = report.sent,
            failed = report.failed,
            dead = report.dead,
            held = report.held,
            released = report.released,
            "outbox relay: batch done"
        );
        Ok(report)
    }

    /// Classifies a wave's [`PublishOutcome::Unconfirmed`] events (`sent`
    /// messages went out in the wave). None spends an attempt: a broker
    /// answers a bad message, it does not go silent. When every message of
    /// the wave is unconfirmed and they went to two destinations or more,
    /// the broker is unavailable: the relay pauses and releases the batch,
    /// as for a lost connection. Otherwise (some confirmed, or a single
    /// destination, which cannot tell a stuck queue from a stuck broker),
    /// each destination's breaker trips and its events are released until
    /// the breaker closes, their attempts unchanged; the next wave with
    /// other destinations shows whether the broker itself is stuck.
    fn settle_unconfirmed(
        &self,
        records: &[crate::OutboxRecord],
        waves: &mut Waves,
        unconfirmed: Vec<(usize, &str, String)>,
        sent: usize,
        report: &mut BatchReport,
        failures: &mut Vec<FailedAttempt>,
    ) {
        if unconfirmed.is_empty() {
            return;
        }
        ::metrics::counter!(metric_names::UNCONFIRMED_TOTAL).increment(unconfirmed.len() as u64);
        let destinations: std::collections::HashSet<&str> =
            unconfirmed.iter().map(|(_, d, _)| *d).collect();
        if unconfirmed.len() == sent && destinations.len() > 1 {
            let (_, _, reason) = &unconfirmed[0];
            report.connection_lost.get_or_insert_with(|| {
                format!(
                    "the broker confirmed none of the {sent} messages of a wave ({reason}); \
                     it is unavailable"
                )
            });
            waves.block_all();
            return;
        }
        let now = Utc::now();
        let mut until: std::collections::HashMap<&str, chrono::DateTime<Utc>> =
            std::collections::HashMap::new();
        for (i, destination, reason) in unconfirmed {
            let record = &records[i];
            let at = *until
                .entry(destination)
                .or_insert_with(|| self.breakers.trip(destination, &self.settings.retry, now));
            warn!(
                event_id = %record.id(),
                event_type = %record.envelope.event_type,
                trace_id = trace_id(&record.envelope.headers).as_deref(),
                %destination,
                retry_at = %at,
                %reason,
                "outbox relay: publish not confirmed; released with a delay (no attempt spent)",
            );
            report.held += 1;
            failures.push(held(
                record,
                at,
                format!("{reason}; released until {at} (no attempt spent)"),
            ));
            waves.block(i);
        }
    }
}

/// Records [`RAISE_TO_CONFIRM_SECONDS`](metric_names::RAISE_TO_CONFIRM_SECONDS)
/// for a confirmed event: from when it was raised (`occurred_at`) to
/// `confirmed_at` (0 when the clocks disagree).
fn raise_to_confirm(envelope: &crate::EventEnvelope, confirmed_at: chrono::DateTime<Utc>) {
    let seconds = (confirmed_at - envelope.occurred_at)
        .to_std()
        .map_or(0.0, |elapsed| elapsed.as_secs_f64());
    ::metrics::histogram!(metric_names::RAISE_TO_CONFIRM_SECONDS).record(seconds);
}

/// Releases `record` until `at` without spending an attempt.
fn held(record: &crate::OutboxRecord, at: chrono::DateTime<Utc>, error: String) -> FailedAttempt {
    FailedAttempt::new(record.seq, record.attempts, error, NextStep::RetryAt(at))
}
