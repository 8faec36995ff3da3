//! The relay engine: claim → publish (pipelined, in waves) → mark.
//!
//! See [`Relay`].

mod breaker;
mod builder;
mod handle;
pub mod metrics;
mod unroutable;
mod waves;

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use chrono::Utc;
use tracing::{Instrument, debug, error, info, warn};
use uuid::Uuid;

pub use builder::RelayBuilder;
pub use handle::RelayHandle;
pub use unroutable::UnroutablePolicy;

use crate::failpoints;
use crate::{
    Claim, Claimed, EventEnvelope, FailedAttempt, NextStep, OutboxStore, PublishOutcome, Publisher,
    RetryPolicy,
};
use waves::Waves;

/// Moves committed events from an [`OutboxStore`] to a [`Publisher`].
///
/// One loop, driven by wakeups with a polling fallback:
/// 1. **claim** up to `batch_size` events (the store decides what is
///    claimable, honouring per-aggregate order and retry times);
/// 2. **publish** them pipelined, in waves: in ordered mode the k-th event of
///    an aggregate goes out only after its (k-1)-th was confirmed, while
///    different aggregates share each wave; unordered, everything is one wave;
/// 3. **mark** confirmed events `Sent` in one statement, failed ones `Retry`
///    or `Dead` per the [`RetryPolicy`], release the rest, and finish.
///
/// Outcomes:
/// - only [`PublishOutcome::Acked`] marks an event sent;
/// - [`PublishOutcome::Rejected`] spends an attempt, holds back the rest of
///   that aggregate in the batch, and ends in `Dead` at the limit;
/// - [`PublishOutcome::Unpublishable`] does the same but ends in `Dead` at
///   once (it cannot succeed by retrying);
/// - [`PublishOutcome::ConnectionLost`] spends nothing: the rest of the batch
///   is released and the relay pauses with exponential backoff before claiming
///   again.
/// - [`PublishOutcome::ConnectionDied`] (the connection died while the
///   message was in flight, of a cause not known to be the broker's) does
///   the same, and counts each such event as a suspect in its row
///   ([`Claim::mark_suspect`]). A suspect is published alone: in a publish
///   call of its own, after the rest of its wave, while no other batch of
///   this relay is in flight, and later events of its aggregate wait for
///   it as for any head. When the connection dies with it alone and its
///   count reaches [`suspect_limit`](RelayBuilder::suspect_limit) (default
///   3), it is parked `Dead` with the reason (no attempt spent), holding
///   back its aggregate only. Other relays see the count in the row and
///   publish it alone too, so one such message costs at most about
///   `suspect_limit` connections across every relay.
/// - [`PublishOutcome::Unconfirmed`] (no confirm in time) spends nothing
///   either: a broker answers a bad message with a nack, a return or a
///   channel error, never with silence. When a whole wave went unconfirmed
///   to two destinations or more, the broker is unavailable: the relay
///   pauses as for a lost connection. Otherwise the events are released
///   (status `Retry`, attempts unchanged) until the circuit breaker of
///   their [destination](Publisher::destination) closes again, after a
///   capped exponential backoff (the [`RetryPolicy`]'s delays); while it is
///   open, the relay holds that destination's events back the same way
///   without sending them, so one stuck queue delays only its own events.
///   The first confirm for the destination closes the breaker.
///
/// With [`concurrency`](RelayBuilder::concurrency) 2 (the default) two such
/// loops share the store and the publisher, so one claims and marks in the
/// database while the other publishes: the database round trips hide behind
/// the broker's confirms. They never share an aggregate (the store's claims
/// exclude each other), so per-aggregate order holds as with several relays.
///
/// It wakes up on [`RelayHandle::notify`], on store wakeups
/// ([`OutboxStore::wakeups`], e.g. PostgreSQL `NOTIFY`) and by polling:
/// each loop polls at a fixed rate of once per `poll_interval`, and the
/// loops' polls are spread evenly over the interval, so without any wakeup
/// an event waits at most `poll_interval` / `concurrency` to be claimed. It
/// stops on [`RelayHandle::shutdown`] after finishing (or,
/// past the grace period, releasing) the batch in flight.
///
/// ```
/// # #[cfg(feature = "test-util")] {
/// use outbox_core::testing::{InMemoryStore, RecordingPublisher};
/// use outbox_core::{DomainEvent, Relay};
/// # #[derive(serde::Serialize)] struct Shipped { id: u32 }
/// # impl DomainEvent for Shipped {
/// #     fn aggregate_type(&self) -> &'static str { "order" }
/// #     fn event_type(&self) -> &'static str { "order.shipped" }
/// #     fn aggregate_id(&self) -> String { self.id.to_string() }
/// # }
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let store = InMemoryStore::new();
/// let publisher = RecordingPublisher::new();
/// store.record(&Shipped { id: 1 })?;
///
/// let relay = Relay::builder(store.clone(), publisher.clone()).build()?;
/// let handle = relay.handle();
/// let task = tokio::spawn(relay.run());
///
/// handle.notify();
/// publisher.wait_for(1).await;
/// handle.shutdown();
/// task.await.unwrap();
/// assert_eq!(publisher.published()[0].event_type, "order.shipped");
/// # Ok::<(), outbox_core::Error>(())
/// # }).unwrap();
/// # }
/// ```
#[derive(Debug)]
pub struct Relay<S, P> {
    registration: crate::RelayRegistration,
    /// Set while an operator has paused this relay (by a claim or a
    /// heartbeat that found it paused; cleared by a heartbeat).
    paused: std::sync::atomic::AtomicBool,
    /// Notified when a heartbeat finds the relay resumed.
    resumed: tokio::sync::Notify,
    store: S,
    publisher: P,
    handle: RelayHandle,
    batch_size: usize,
    concurrency: usize,
    poll_interval: Duration,
    stats_interval: Duration,
    shutdown_grace: Duration,
    retry: RetryPolicy,
    pause_min: Duration,
    pause_max: Duration,
    suspect_limit: u32,
    /// Held shared by every publish of a batch's wave and exclusively by the
    /// publish of a suspect event, so that a suspect is the only message in
    /// flight on this relay's publisher.
    solo: tokio::sync::RwLock<()>,
    /// Loops inside a claim or a batch.
    busy: std::sync::atomic::AtomicUsize,
    /// Notified (all waiters) whenever a batch ends, releasing its rows.
    batch_done: tokio::sync::Notify,
    /// Notified (all waiters) whenever a claim ends empty (it may have
    /// locked rows for a moment), after counting it in `empty_claims`.
    empty_claim_done: tokio::sync::Notify,
    empty_claims: std::sync::atomic::AtomicU64,
    /// Per destination, for unconfirmed messages.
    breakers: breaker::Breakers,
    unroutable: unroutable::Unroutable,
}

/// What one batch did.
#[derive(Debug, Default)]
struct BatchReport {
    sent: usize,
    failed: usize,
    dead: usize,
    released: usize,
    /// Events sent after a failed attempt: the store may have released
    /// events of their aggregates that waited behind them.
    sent_retries: usize,
    /// Released with a delay and no attempt spent (unconfirmed, or held by
    /// a destination's open circuit breaker).
    held: usize,
    /// Suspects parked `Dead` (no attempt spent) after the connection died
    /// with them alone in flight once too often.
    parked: usize,
    /// Set when the broker is unavailable (connection lost, blocked, or a
    /// whole wave unconfirmed): the relay pauses.
    connection_lost: Option<String>,
}

impl<S: OutboxStore, P: Publisher> Relay<S, P> {
    /// Starts configuring a relay; see [`RelayBuilder`] for settings and defaults.
    pub fn builder(store: S, publisher: P) -> RelayBuilder<S, P> {
        RelayBuilder::new(store, publisher)
    }

    /// A handle to wake or stop this relay.
    pub fn handle(&self) -> RelayHandle {
        self.handle.clone()
    }

    /// Its name in the store's registry of relays.
    pub fn name(&self) -> &str {
        &self.registration.name
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The publisher.
    pub fn publisher(&self) -> &P {
        &self.publisher
    }

    /// Runs until [`RelayHandle::shutdown`]. Errors are logged, counted and
    /// retried with backoff; the relay never gives up on its own.
    pub async fn run(self) {
        info!(
            relay = %self.registration.name,
            batch_size = self.batch_size,
            concurrency = self.concurrency,
            "outbox relay started"
        );
        // Registered and told whether an operator paused it before the
        // first claim (a relay restarted under a paused name stays paused);
        // a store that does not answer in time is retried by the stats loop.
        let mut registered = false;
        let _ = tokio::time::timeout(HEARTBEAT_TIMEOUT, self.heartbeat(&mut registered)).await;
        let pause = Pause::new(self.pause_min, self.pause_max);
        let started = tokio::time::Instant::now();
        let loops = futures_util::future::join_all(
            (0..self.concurrency).map(|i| self.main_loop(&pause, self.poll_grid(started, i))),
        );
        tokio::select! {
            biased;
            _ = loops => {}
            () = forever(self.store.wakeups(self.handle.clone())) => {}
            () = forever(self.stats_loop()) => {}
            () = forever(self.heartbeat_loop(registered)) => {}
        }
        let name = &self.registration.name;
        match tokio::time::timeout(DEREGISTER_TIMEOUT, self.store.deregister_relay(name)).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                warn!(error = %err, relay = %name, "outbox relay: deregistering failed")
            }
            Err(_) => warn!(relay = %name, "outbox relay: deregistering timed out"),
        }
        info!(relay = %name, "outbox relay stopped");
    }

    /// The polls of loop `i`: every `poll_interval`, shifted by `i` /
    /// `concurrency` of it, so that the loops' polls are spread evenly (an
    /// event committed without a wakeup waits at most `poll_interval` /
    /// `concurrency` for one) and keep a fixed rate however long claims take.
    fn poll_grid(&self, started: tokio::time::Instant, i: usize) -> PollGrid {
        let loops = u32::try_from(self.concurrency.max(1)).unwrap_or(u32::MAX);
        let i = u32::try_from(i).unwrap_or(0);
        PollGrid {
            origin: started
                .checked_add(self.poll_interval / loops * i)
                .unwrap_or_else(|| started + FAR_FUTURE),
            interval: self.poll_interval,
        }
    }

    async fn main_loop(&self, pause: &Pause, polls: PollGrid) {
        let mut wait = false;
        let mut store_backoff = Backoff::new(self.pause_min, self.pause_max);
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
            let claimed = self
                .store
                .claim_for(&self.registration.name, self.batch_size)
                .await;
            let others_busy = others_before || self.busy.load(Ordering::SeqCst) > 1;
            if others_busy {
                follow = Some(batch_ended);
            }
            let claim = match claimed {
                Ok(Claimed::Batch(claim)) => claim,
                Ok(Claimed::Paused) => {
                    // The claim read the pause (without waiting for a
                    // heartbeat) and took nothing; a heartbeat resumes.
                    self.busy.fetch_sub(1, Ordering::SeqCst);
                    self.operator_paused(true);
                    wait = false;
                    continue;
                }
                Ok(Claimed::Empty) => {
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
                    self.busy.fetch_sub(1, Ordering::SeqCst);
                    ::metrics::counter!(metrics::STORE_ERRORS_TOTAL).increment(1);
                    let delay = store_backoff.next_delay();
                    error!(error = %err, retry_in = ?delay, "outbox relay: claim failed");
                    self.sleep_unless_shutdown(delay).await;
                    continue;
                }
            };
            failpoints::hit(failpoints::AFTER_CLAIM);
            chase_empty = true;
            let claimed = claim.records().len();
            let span = tracing::info_span!(
                "outbox.relay.batch",
                claimed,
                sent = tracing::field::Empty,
                failed = tracing::field::Empty,
            );
            let processed = self.process_with_grace(claim).instrument(span).await;
            self.busy.fetch_sub(1, Ordering::SeqCst);
            self.batch_done.notify_waiters();
            match processed {
                Some(Ok(report)) => {
                    store_backoff.reset();
                    if let Some(reason) = report.connection_lost {
                        ::metrics::counter!(metrics::CONNECTION_LOST_TOTAL).increment(1);
                        let delay = pause.start();
                        warn!(%reason, pause = ?delay, "outbox relay: broker connection lost; pausing (no attempts spent)");
                        ::metrics::gauge!(metrics::PAUSED).set(1.0);
                        self.sleep_unless_shutdown(delay).await;
                        ::metrics::gauge!(metrics::PAUSED).set(0.0);
                        wait = false;
                    } else {
                        pause.reset();
                        // A short batch means the backlog is drained: wait for
                        // news, unless a sent retry released events behind it.
                        wait = claimed < self.batch_size && report.sent_retries == 0;
                    }
                }
                Some(Err(err)) => {
                    ::metrics::counter!(metrics::STORE_ERRORS_TOTAL).increment(1);
                    let delay = store_backoff.next_delay();
                    error!(error = %err, retry_in = ?delay, "outbox relay: marking the batch failed; its events stay unsent and will be published again");
                    self.sleep_unless_shutdown(delay).await;
                }
                None => break,
            }
        }
    }

    /// Processes the batch; once shutdown is requested, gives it
    /// `shutdown_grace` to finish, then drops it (releasing its events).
    async fn process_with_grace(&self, claim: S::Claim) -> Option<Result<BatchReport, S::Error>> {
        let grace = async {
            self.handle.shutdown_requested().await;
            tokio::time::sleep(self.shutdown_grace).await;
        };
        tokio::select! {
            report = self.process(claim) => Some(report),
            () = grace => {
                warn!(grace = ?self.shutdown_grace, "outbox relay: batch did not finish within the shutdown grace period; releasing it unmarked");
                None
            }
        }
    }

    async fn process(&self, mut claim: S::Claim) -> Result<BatchReport, S::Error> {
        let started = Instant::now();
        let mut report = BatchReport::default();
        let mut sent: Vec<Uuid> = Vec::new();
        let mut failures: Vec<FailedAttempt> = Vec::new();
        // Events in flight when the connection died: (batch index, whether
        // it was alone, what happened to the connection).
        let mut died: Vec<(usize, bool, String)> = Vec::new();
        let suspects: Option<(Vec<Uuid>, String)>;
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
                        break 'waves;
                    };
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
                                sent.push(record.id());
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
                                match self.unroutable.policy(&record.envelope.event_type) {
                                    UnroutablePolicy::Accept => {
                                        ::metrics::counter!(metrics::UNROUTABLE_ACCEPTED_TOTAL)
                                            .increment(1);
                                        sent.push(record.id());
                                        continue;
                                    }
                                    UnroutablePolicy::Hold {
                                        max_hold,
                                        max_delay,
                                    } => {
                                        let now = Utc::now();
                                        let since = record.unroutable_since.unwrap_or(now);
                                        if (now - since).to_std().unwrap_or_default() <= max_hold {
                                            if self.unroutable.should_warn(destination) {
                                                warn!(
                                                    %destination,
                                                    event_type = %record.envelope.event_type,
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
                            self.retry.next_step(attempts, Utc::now())
                        };
                        warn!(
                            event_id = %record.id(),
                            event_type = %record.envelope.event_type,
                            attempts,
                            next = ?next,
                            %reason,
                            "outbox relay: publish failed",
                        );
                        if next == NextStep::Dead {
                            report.dead += 1;
                        }
                        failures.push(FailedAttempt {
                            id: record.id(),
                            attempts,
                            error: reason,
                            next,
                            unroutable_since: None,
                        });
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
        if let Some((ids, reason)) = &suspects {
            claim.mark_suspect(ids, reason).await?;
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
        ::metrics::counter!(metrics::PUBLISHED_TOTAL).increment(report.sent as u64);
        ::metrics::counter!(metrics::FAILED_TOTAL).increment(report.failed as u64);
        ::metrics::counter!(metrics::DEAD_TOTAL).increment(report.dead as u64);
        ::metrics::counter!(metrics::HELD_TOTAL).increment(report.held as u64);
        ::metrics::histogram!(metrics::BATCH_SIZE).record(claimed as f64);
        ::metrics::histogram!(metrics::BATCH_DURATION_SECONDS)
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

    /// Publishes one call's events. A call of a suspect (`alone`) holds the
    /// relay's publisher exclusively: no other batch of this relay is in
    /// flight meanwhile, so if the connection dies, it died with the
    /// suspect alone. `None` when the claim's deadline passed while the
    /// call waited for the publisher (a suspect for the batches in flight,
    /// a batch for a suspect's call).
    async fn publish_call(
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
                    suspect_count = record.suspect_count,
                    suspect_limit = self.suspect_limit,
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
    /// with the reason (no attempt spent). Returns the ids for
    /// [`Claim::mark_suspect`] and the reason to store, if any died.
    fn judge_suspects(
        &self,
        records: &[crate::OutboxRecord],
        died: Vec<(usize, bool, String)>,
        report: &mut BatchReport,
        failures: &mut Vec<FailedAttempt>,
    ) -> Option<(Vec<Uuid>, String)> {
        let cause = died.first().map(|(_, _, reason)| reason.clone())?;
        let limit = self.suspect_limit;
        ::metrics::counter!(metrics::SUSPECT_EVENTS_TOTAL).increment(died.len() as u64);
        let mut ids = Vec::with_capacity(died.len());
        for (i, alone, reason) in died {
            let record = &records[i];
            let count = record.suspect_count.saturating_add(1);
            ids.push(record.id());
            if alone && count >= limit {
                let error = format!(
                    "the connection to the broker died {count} times while this event was in \
                     flight, the last time with it alone: {reason}; replay it once the broker \
                     (or a proxy in front of it) accepts it"
                );
                warn!(
                    event_id = %record.id(),
                    event_type = %record.envelope.event_type,
                    suspect_count = count,
                    suspect_limit = limit,
                    %reason,
                    "outbox relay: the broker connection died with this event alone in flight \
                     too often; parked dead (no attempt spent)",
                );
                report.dead += 1;
                report.parked += 1;
                failures.push(FailedAttempt {
                    id: record.id(),
                    attempts: record.attempts,
                    error,
                    next: NextStep::Dead,
                    unroutable_since: None,
                });
            } else {
                warn!(
                    event_id = %record.id(),
                    event_type = %record.envelope.event_type,
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
        Some((ids, reason))
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
        ::metrics::counter!(metrics::UNCONFIRMED_TOTAL).increment(unconfirmed.len() as u64);
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
                .or_insert_with(|| self.breakers.trip(destination, &self.retry, now));
            warn!(
                event_id = %record.id(),
                event_type = %record.envelope.event_type,
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

    /// Heartbeats every [`heartbeat_interval`](crate::RelayRegistration)
    /// (the stats interval, at most 5 s), each bounded, apart from the stats
    /// (which may be slow on a big table): a resume takes effect within one
    /// interval (a pause at the next claim, see
    /// [`OutboxStore::claim_for`]), and a busy relay never looks dead.
    async fn heartbeat_loop(&self, mut registered: bool) {
        let interval = self.registration.heartbeat_interval;
        loop {
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = self.handle.shutdown_requested() => return,
            }
            if tokio::time::timeout(HEARTBEAT_TIMEOUT, self.heartbeat(&mut registered))
                .await
                .is_err()
            {
                ::metrics::counter!(metrics::STORE_ERRORS_TOTAL).increment(1);
                warn!(
                    relay = %self.registration.name,
                    timeout = ?HEARTBEAT_TIMEOUT,
                    "outbox relay: heartbeat timed out"
                );
            }
        }
    }

    async fn stats_loop(&self) {
        loop {
            match self.store.stats().await {
                Ok(stats) => {
                    ::metrics::gauge!(metrics::BACKLOG).set(stats.backlog as f64);
                    ::metrics::gauge!(metrics::OLDEST_UNSENT_AGE_SECONDS)
                        .set(stats.oldest_unsent_age.map_or(0.0, |d| d.as_secs_f64()));
                    ::metrics::gauge!(metrics::DEAD).set(stats.dead as f64);
                    ::metrics::gauge!(metrics::BLOCKED_AGGREGATES)
                        .set(stats.blocked_aggregates as f64);
                    ::metrics::gauge!(metrics::UNROUTABLE_EVENTS).set(stats.unroutable as f64);
                    ::metrics::gauge!(metrics::RELAYS_LIVE).set(stats.relays_live as f64);
                }
                Err(err) => {
                    ::metrics::counter!(metrics::STORE_ERRORS_TOTAL).increment(1);
                    warn!(error = %err, "outbox relay: reading outbox stats failed");
                }
            }
            if let Err(err) = self.store.maintain().await {
                ::metrics::counter!(metrics::STORE_ERRORS_TOTAL).increment(1);
                warn!(error = %err, "outbox relay: outbox housekeeping failed");
            }
            tokio::select! {
                () = tokio::time::sleep(self.stats_interval) => {}
                () = self.handle.shutdown_requested() => return,
            }
        }
    }

    /// Registers the relay (until that succeeds), then records it alive and
    /// reads whether an operator paused it.
    async fn heartbeat(&self, registered: &mut bool) {
        let name = &self.registration.name;
        if !*registered {
            match self.store.register_relay(&self.registration).await {
                Ok(()) => *registered = true,
                Err(err) => {
                    ::metrics::counter!(metrics::STORE_ERRORS_TOTAL).increment(1);
                    warn!(error = %err, relay = %name, "outbox relay: registering failed");
                    return;
                }
            }
        }
        let in_flight = u32::try_from(self.busy.load(Ordering::SeqCst)).unwrap_or(u32::MAX);
        match self.store.heartbeat(name, in_flight).await {
            Ok(control) => self.operator_paused(control.paused),
            Err(err) => {
                ::metrics::counter!(metrics::STORE_ERRORS_TOTAL).increment(1);
                warn!(error = %err, relay = %name, "outbox relay: heartbeat failed");
            }
        }
    }

    /// Records what the store said of an operator's pause: a claim that
    /// found the relay paused, or a heartbeat (the only way back to
    /// running: a resumed relay's loops wait for it, so a resume takes
    /// effect within one heartbeat interval).
    fn operator_paused(&self, paused: bool) {
        let name = &self.registration.name;
        let was = self.paused.swap(paused, Ordering::SeqCst);
        ::metrics::gauge!(metrics::OPERATOR_PAUSED).set(u8::from(paused));
        if was != paused {
            if paused {
                warn!(relay = %name, "outbox relay: paused by an operator; claiming nothing until resumed");
            } else {
                info!(relay = %name, "outbox relay: resumed by an operator");
                self.resumed.notify_waiters();
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

/// Splits a wave's events to send (batch index, destination) into publish
/// calls: one per suspect (an event in flight when the connection died
/// before), flagged `alone`, then one for the events that are not suspects.
/// Each is the head of its aggregate in the batch, so the order of the
/// calls does not matter for per-aggregate order.
fn publish_calls(
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

/// Releases `record` until `at` without spending an attempt.
fn held(record: &crate::OutboxRecord, at: chrono::DateTime<Utc>, error: String) -> FailedAttempt {
    FailedAttempt {
        id: record.id(),
        attempts: record.attempts,
        error,
        next: NextStep::RetryAt(at),
        unroutable_since: None,
    }
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

/// Runs `fut`, then never completes (for `select!` arms that must not end the loop).
async fn forever(fut: impl std::future::Future<Output = ()>) {
    fut.await;
    std::future::pending::<()>().await;
}

/// The relay-wide pause after a lost broker connection, shared by its loops:
/// exponential, reset by the next batch that reaches the broker.
#[derive(Debug)]
struct Pause {
    state: std::sync::Mutex<(Backoff, Option<tokio::time::Instant>)>,
}

impl Pause {
    fn new(min: Duration, max: Duration) -> Self {
        Pause {
            state: std::sync::Mutex::new((Backoff::new(min, max), None)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Backoff, Option<tokio::time::Instant>)> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts (or extends) a pause; returns its length.
    fn start(&self) -> Duration {
        let mut state = self.lock();
        let delay = state.0.next_delay();
        let until = tokio::time::Instant::now() + delay;
        state.1 = Some(state.1.map_or(until, |u| u.max(until)));
        delay
    }

    /// The end of the pause in force, if any.
    fn until(&self) -> Option<tokio::time::Instant> {
        let state = self.lock();
        state.1.filter(|u| *u > tokio::time::Instant::now())
    }

    fn reset(&self) {
        let mut state = self.lock();
        state.0.reset();
        state.1 = None;
    }
}

/// Exponential backoff for pauses (broker connection lost, store errors).
#[derive(Debug)]
struct Backoff {
    min: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max,
            current: min,
        }
    }

    fn next_delay(&mut self) -> Duration {
        let delay = self.current;
        self.current = (self.current * 2).min(self.max);
        delay
    }

    fn reset(&mut self) {
        self.current = self.min;
    }
}

/// Stands in for "never" in poll times (a year).
const FAR_FUTURE: Duration = Duration::from_secs(365 * 24 * 3600);

/// How long a heartbeat (with the registration) may take; a starting relay
/// waits at most this long for its first before claiming.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest time between two heartbeats.
pub(crate) const MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);

/// How long a stopping relay waits to remove itself from the registry.
const DEREGISTER_TIMEOUT: Duration = Duration::from_secs(5);

/// Fixed-rate poll times of one relay loop: `origin + k × interval`.
#[derive(Debug, Clone, Copy)]
struct PollGrid {
    origin: tokio::time::Instant,
    interval: Duration,
}

impl PollGrid {
    /// The first poll time strictly after `now`.
    fn next_after(self, now: tokio::time::Instant) -> tokio::time::Instant {
        if now < self.origin {
            return self.origin;
        }
        let interval = self.interval.as_nanos().max(1);
        let elapsed = (now - self.origin).as_nanos();
        let k = elapsed / interval + 1;
        let offset = u64::try_from(k.saturating_mul(interval)).unwrap_or(u64::MAX);
        // A huge interval (polling off in effect) must not overflow.
        self.origin
            .checked_add(Duration::from_nanos(offset))
            .unwrap_or_else(|| now + FAR_FUTURE)
    }
}

#[cfg(test)]
mod poll_grid_tests {
    use super::*;

    #[tokio::test]
    async fn polls_keep_a_fixed_rate_and_loops_are_spread_evenly() {
        let origin = tokio::time::Instant::now();
        let grid = PollGrid {
            origin,
            interval: Duration::from_millis(1000),
        };
        let at = |ms: u64| origin + Duration::from_millis(ms);
        assert_eq!(grid.next_after(at(0)), at(1000));
        assert_eq!(grid.next_after(at(999)), at(1000));
        assert_eq!(grid.next_after(at(1000)), at(2000), "strictly after");
        // A claim that took 300 ms does not push the next poll back.
        assert_eq!(grid.next_after(at(1300)), at(2000));
        let second = PollGrid {
            origin: at(500),
            ..grid
        };
        assert_eq!(second.next_after(at(0)), at(500));
        assert_eq!(second.next_after(at(1000)), at(1500));
        // Polling effectively off: no overflow.
        let never = PollGrid {
            origin,
            interval: Duration::MAX,
        };
        assert!(never.next_after(at(1)) > at(1000 * 3600 * 24 * 300));
    }
}
