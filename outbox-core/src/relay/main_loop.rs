//! One claim loop of a [`Relay`]: waits for a wakeup, a poll or another
//! loop's news, honours an operator's pause and the broker pause, claims,
//! and hands the batch on (see `batch.rs`).

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::{Instrument, error, warn};

use super::Relay;
use super::metric_names;
use super::pause::Pause;
use super::poll::PollGrid;
use crate::Backoff;
use crate::failpoints;
use crate::{Claim, Claimed, OutboxStore, Publisher};

/// A batch that took longer than this to publish and mark does not make
/// the next claim larger.
const GROW_WITHIN: Duration = Duration::from_secs(1);

impl<S: OutboxStore, P: Publisher> Relay<S, P> {
    pub(super) async fn main_loop(&self, pause: &Pause, polls: PollGrid) {
        let mut wait = false;
        // Two backoffs, each reset only by a success of its own kind: a
        // claim that answers (even empty) says nothing of whether marking
        // works, and with two loops (or two relays) one loop's empty claims
        // would otherwise keep resetting the other's wait after its marks
        // failed, re-publishing the same batch every `pause_min`.
        let mut claim_backoff = Backoff::new(self.settings.pause_min, self.settings.pause_max);
        let mut mark_backoff = Backoff::new(self.settings.pause_min, self.settings.pause_max);
        // Set when another loop held rows while this one claimed: its claim
        // may have skipped them and the events queued behind them (per
        // aggregate), which nothing else announces. Completes when any
        // batch ends after that claim started.
        let mut follow: Option<Pin<Box<tokio::sync::futures::Notified<'_>>>> = None;
        // Likewise when another loop's claim ends empty: it may have held
        // rows for a moment (locked, then left). Two loops whose empty
        // claims overlap would wake each other forever, so a loop woken by
        // an empty claim that finds nothing again stops following empty
        // claims until something else wakes it.
        // (`Some(n)`: wake once more than `n` empty claims have ended.)
        let mut follow_empty: Option<u64> = None;
        let mut chase_empty = true;
        let mut woken_by_empty = false;
        // This loop's next claim: grows while claims come back full.
        let mut limit = self.settings.batch_size;
        while !self.handle.is_shutdown() {
            if wait {
                let batch_ended = async {
                    match follow.as_mut() {
                        Some(done) => done.await,
                        None => std::future::pending().await,
                    }
                };
                let claim_ended = async {
                    let Some(threshold) = follow_empty else {
                        return std::future::pending().await;
                    };
                    loop {
                        let ended = self.empty_claim_done.notified();
                        if self.empty_claims.load(Ordering::SeqCst) > threshold {
                            return;
                        }
                        ended.await;
                    }
                };
                woken_by_empty = false;
                tokio::select! {
                    () = self.handle.notified() => {}
                    () = batch_ended => {}
                    () = claim_ended => woken_by_empty = true,
                    () = tokio::time::sleep_until(polls.next_after(tokio::time::Instant::now())) => {}
                    () = self.handle.shutdown_requested() => break,
                }
                if !woken_by_empty {
                    chase_empty = true;
                }
            }
            follow = None;
            follow_empty = None;
            // Paused by an operator (as a claim or a heartbeat found):
            // claim nothing until a heartbeat finds the relay resumed
            // (batches in flight finish).
            if self.paused.load(Ordering::SeqCst) {
                limit = self.settings.batch_size;
                let resumed = self.resumed.notified();
                if self.paused.load(Ordering::SeqCst) {
                    tokio::select! {
                        () = resumed => {}
                        () = self.handle.shutdown_requested() => break,
                    }
                }
                wait = false;
                continue;
            }
            // A lost connection pauses every loop of the relay.
            if let Some(until) = pause.until() {
                limit = self.settings.batch_size;
                tokio::select! {
                    () = tokio::time::sleep_until(until) => {}
                    () = self.handle.shutdown_requested() => break,
                }
                wait = false;
                continue;
            }
            failpoints::hit(failpoints::BEFORE_CLAIM);
            // Armed before the claim, so a batch that ends while it runs
            // still counts.
            let batch_ended = Box::pin(self.batch_done.notified());
            let empty_before = self.empty_claims.load(Ordering::SeqCst);
            let others_before = self.busy.fetch_add(1, Ordering::SeqCst) > 0;
            let claimed = self.store.claim_for(&self.registration.name, limit).await;
            let others_busy = others_before || self.busy.load(Ordering::SeqCst) > 1;
            if others_busy {
                follow = Some(batch_ended);
            }
            if claimed.is_ok() {
                // The store answered the claim: its next claim error starts
                // the backoff afresh, not where an earlier outage left it.
                claim_backoff.reset();
            }
            let claim = match claimed {
                Ok(Claimed::Batch(claim)) => claim,
                Ok(Claimed::Paused) => {
                    limit = self.settings.batch_size;
                    // The claim read the pause (without waiting for a
                    // heartbeat) and took nothing; a heartbeat resumes.
                    self.busy.fetch_sub(1, Ordering::SeqCst);
                    self.operator_paused(true);
                    wait = false;
                    continue;
                }
                Ok(Claimed::Empty) => {
                    limit = self.settings.batch_size;
                    self.busy.fetch_sub(1, Ordering::SeqCst);
                    // An empty claim may have locked rows for a moment
                    // (and released them): a loop whose claim skipped them
                    // meanwhile claims again.
                    self.empty_claims.fetch_add(1, Ordering::SeqCst);
                    self.empty_claim_done.notify_waiters();
                    if woken_by_empty {
                        chase_empty = false;
                    }
                    if others_busy && chase_empty {
                        // Wake for any other empty claim that ended during
                        // this one or ends later (this one counts once).
                        follow_empty = Some(empty_before + 1);
                    }
                    wait = true;
                    continue;
                }
                Err(err) => {
                    limit = self.settings.batch_size;
                    self.busy.fetch_sub(1, Ordering::SeqCst);
                    ::metrics::counter!(metric_names::STORE_ERRORS_TOTAL).increment(1);
                    let delay = claim_backoff.next_delay();
                    error!(error = %err, retry_in = ?delay, "outbox relay: claim failed");
                    self.sleep_unless_shutdown(delay).await;
                    continue;
                }
            };
            failpoints::hit(failpoints::AFTER_CLAIM);
            chase_empty = true;
            let claimed = claim.records().len();
            // OpenTelemetry (with `tracing-opentelemetry`): a client span
            // for the batch send (messaging semantic conventions); each
            // message's `publish` span links to it.
            let span = tracing::info_span!(
                "outbox.relay.batch",
                otel.name = "send",
                otel.kind = "client",
                messaging.operation.name = "send",
                messaging.operation.type = "send",
                // An integer attribute (`tracing-opentelemetry` records a
                // `usize` as text).
                messaging.batch.message_count = i64::try_from(claimed).unwrap_or(i64::MAX),
                claimed,
                sent = tracing::field::Empty,
                failed = tracing::field::Empty,
            );
            let processing = std::time::Instant::now();
            let processed = self.process_with_grace(claim).instrument(span).await;
            let took = processing.elapsed();
            self.busy.fetch_sub(1, Ordering::SeqCst);
            self.batch_done.notify_waiters();
            match processed {
                Some(Ok(report)) => {
                    mark_backoff.reset();
                    if let Some(reason) = report.connection_lost {
                        ::metrics::counter!(metric_names::CONNECTION_LOST_TOTAL).increment(1);
                        let delay = pause.start();
                        warn!(%reason, pause = ?delay, "outbox relay: broker connection lost; pausing (no attempts spent)");
                        ::metrics::gauge!(metric_names::PAUSED).set(1.0);
                        self.sleep_unless_shutdown(delay).await;
                        ::metrics::gauge!(metric_names::PAUSED).set(0.0);
                        wait = false;
                        limit = self.settings.batch_size;
                    } else {
                        pause.reset();
                        // A short batch means the backlog is drained: wait for
                        // news, unless a sent retry released events behind it.
                        wait = claimed < limit && report.sent_retries == 0;
                        let next = self.settings.next_limit(limit, claimed);
                        limit = if !report.settled() {
                            // Held back or lapsed: a smaller claim.
                            self.settings.batch_size
                        } else if took > GROW_WITHIN {
                            // Slow (large payloads, a slow broker): no
                            // larger, so a claim's publishing stays well
                            // within its lease and the confirm timeout.
                            next.min(limit)
                        } else {
                            next
                        };
                    }
                }
                Some(Err(err)) => {
                    limit = self.settings.batch_size;
                    ::metrics::counter!(metric_names::STORE_ERRORS_TOTAL).increment(1);
                    let delay = mark_backoff.next_delay();
                    error!(error = %err, retry_in = ?delay, "outbox relay: marking the batch failed; its events stay unsent and will be published again");
                    self.sleep_unless_shutdown(delay).await;
                }
                None => break,
            }
        }
    }

    async fn sleep_unless_shutdown(&self, delay: Duration) {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = self.handle.shutdown_requested() => {}
        }
    }
}
