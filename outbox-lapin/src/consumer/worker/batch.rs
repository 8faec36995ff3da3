//! Batch mode ([`InboxConsumerBuilder::batch`](crate::InboxConsumerBuilder::batch)):
//! a worker gathers the deliveries waiting for it (up to `max_deliveries`,
//! waiting at most `max_wait` after the first), applies them in one
//! transaction (the inbox entries of all of them in one `receive_all`
//! call, then a handler call per first-timer, one commit), then acks each. Any failure rolls the whole transaction back
//! and the deliveries go one at a time through the worker's usual path
//! ([`Shared::apply`]), so each gets exactly the handling it would have had
//! without batching.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use futures_util::future::join_all;
use outbox_core::{InboxDatabase, InboxOutcome};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::Instrument;

use super::ack::{ack, requeue};
use super::{Job, Prepared, Ready, Shared, admit, database, mark_failed, stopping};
use crate::consumer::{Batching, EventHandler, HandlerError, metric_names};

/// Runs one worker in batch mode until its queue closes.
pub(super) async fn run<D, H>(
    shared: &Shared<D, H>,
    mut jobs: mpsc::Receiver<Job>,
    mut stop: watch::Receiver<bool>,
    batching: Batching,
) where
    D: InboxDatabase,
    H: EventHandler<D::Tx>,
{
    let consumer = shared.settings.name.as_str();
    // An idle queue costs nothing: the wait for the first delivery is
    // unbounded, only the wait for more after it is bounded.
    while let Some(first) = jobs.recv().await {
        let Some(first) = admit(first, &stop, consumer).await else {
            continue;
        };
        let mut batch = Vec::with_capacity(batching.max_deliveries);
        batch.push(first);
        let deadline = Instant::now() + batching.max_wait;
        while batch.len() < batching.max_deliveries {
            let next = match jobs.try_recv() {
                Ok(job) => Some(job),
                Err(mpsc::error::TryRecvError::Disconnected) => None,
                // `recv` is cancel safe: a delivery is either returned or
                // left in the queue for the next batch.
                Err(mpsc::error::TryRecvError::Empty) => tokio::select! {
                    biased;
                    _ = stop.wait_for(|stopped| *stopped) => None,
                    next = tokio::time::timeout_at(deadline, jobs.recv()) => next.ok().flatten(),
                },
            };
            let Some(job) = next else {
                break;
            };
            if let Some(job) = admit(job, &stop, consumer).await {
                batch.push(job);
            }
        }
        shared.apply_batch(batch, &mut stop).await;
    }
}

/// How a batch's transaction ended, when it did not commit.
enum Unfinished {
    /// Shutdown began: rolled back, nothing acked.
    Stopped,
    /// Something failed: rolled back (or never begun).
    Failed(HandlerError),
}

/// What a committed batch did.
struct Committed {
    /// Events handled for the first time.
    processed: u64,
    /// Deliveries the inbox knew, or that repeated an event of the batch.
    duplicates: u64,
    /// When the events handled for the first time were raised.
    raised: Vec<DateTime<Utc>>,
}

impl<D, H> Shared<D, H>
where
    D: InboxDatabase,
    H: EventHandler<D::Tx>,
{
    /// Applies `jobs` (in queue order) in one transaction and acks them,
    /// or, after a failure, one at a time.
    async fn apply_batch(&self, jobs: Vec<Job>, stop: &mut watch::Receiver<bool>) {
        let consumer = self.settings.name.as_str();
        #[allow(clippy::cast_precision_loss)] // at most u16::MAX deliveries
        ::metrics::histogram!(metric_names::BATCH_SIZE, "consumer" => consumer.to_owned())
            .record(jobs.len() as f64);
        if stopping(stop) {
            // Gathered, not started: back to the queue.
            join_all(jobs.iter().map(|job| requeue(&job.delivery))).await;
            return;
        }
        let mut batch = Vec::with_capacity(jobs.len());
        for job in jobs {
            match self.prepare(job) {
                Prepared::Ready(ready) => batch.push(ready),
                // Not an event, so of no aggregate: its place in the order
                // does not matter. Dead-lettered as without batching.
                undecodable @ Prepared::Undecodable { .. } => {
                    self.process_prepared(undecodable, stop).await;
                }
            }
        }
        if batch.len() <= 1 {
            // Nothing to share a commit with: the usual path.
            for ready in &batch {
                if stopping(stop) {
                    requeue(&ready.delivery).await;
                } else {
                    self.apply(ready, None, stop).await;
                }
            }
            return;
        }
        #[cfg(not(feature = "opentelemetry"))]
        let span = tracing::info_span!("outbox.consume_batch", consumer, deliveries = batch.len());
        #[cfg(feature = "opentelemetry")]
        let span = tracing::info_span!(
            "outbox.consume_batch",
            consumer,
            deliveries = batch.len(),
            otel.kind = "consumer",
            messaging.system = "rabbitmq",
            messaging.operation.name = "process",
            messaging.operation.type = "process",
            messaging.destination.subscription.name = %self.settings.queue,
            // An integer attribute (`tracing-opentelemetry` records a
            // `usize` as text).
            messaging.batch.message_count = i64::try_from(batch.len()).unwrap_or(i64::MAX),
            messaging.consumer.group.name = consumer,
        );
        match self.try_batch(&batch, stop).instrument(span.clone()).await {
            Ok(Committed {
                processed,
                duplicates,
                raised,
            }) => {
                tracing::debug!(parent: &span, processed, duplicates, "batch committed");
                for occurred_at in raised {
                    self.handled(occurred_at);
                }
                ::metrics::counter!(metric_names::PROCESSED_TOTAL, "consumer" => consumer.to_owned())
                    .increment(processed);
                if duplicates > 0 {
                    ::metrics::counter!(
                        metric_names::DUPLICATES_TOTAL,
                        "consumer" => consumer.to_owned()
                    )
                    .increment(duplicates);
                }
                // Individually: a `multiple` ack would also ack every
                // earlier tag of the channel, deliveries other workers
                // hold included (see `InboxConsumerBuilder::batch`). Sent
                // together: an ack has no reply to wait for.
                join_all(batch.iter().map(|ready| ack(&ready.delivery))).await;
            }
            Err(Unfinished::Stopped) => {
                tracing::info!(
                    parent: &span,
                    "shutdown: batch rolled back, its deliveries returned to the queue"
                );
                join_all(batch.iter().map(|ready| requeue(&ready.delivery))).await;
            }
            Err(Unfinished::Failed(error)) => {
                ::metrics::counter!(
                    metric_names::BATCH_FAILURES_TOTAL,
                    "consumer" => consumer.to_owned()
                )
                .increment(1);
                tracing::warn!(
                    parent: &span,
                    %error,
                    "batch rolled back: applying its deliveries one at a time"
                );
                for ready in &batch {
                    if !ready.delivery.acker.usable() {
                        tracing::debug!(
                            consumer,
                            "skipping a delivery of a lost connection; the broker redelivers it"
                        );
                    } else if stopping(stop) {
                        requeue(&ready.delivery).await;
                    } else {
                        self.apply(ready, Some(&span), stop).await;
                    }
                }
            }
        }
    }

    /// One transaction: the events' inbox entries, then the handler for
    /// each first-timer, in order, then one commit. Rolls back on the first
    /// failure, and before the next handler call once shutdown began.
    async fn try_batch(
        &self,
        batch: &[Ready],
        stop: &watch::Receiver<bool>,
    ) -> Result<Committed, Unfinished> {
        let db = &self.db;
        let mut tx = db
            .begin()
            .await
            .map_err(database("begin a transaction"))
            .map_err(Unfinished::Failed)?;
        // A redelivery beside its original is never sent to the database:
        // it is acked after the commit with the original.
        let mut seen = HashSet::with_capacity(batch.len());
        let mut events = Vec::with_capacity(batch.len());
        let mut done = Committed {
            processed: 0,
            duplicates: 0,
            raised: Vec::with_capacity(batch.len()),
        };
        for ready in batch {
            if seen.insert(ready.event.id) {
                events.push(ready);
            } else {
                done.duplicates += 1;
                tracing::info!(
                    parent: &self.span(ready, Some(&tracing::Span::current())),
                    "the same event twice in one batch: applied once, both deliveries acknowledged"
                );
            }
        }
        // Every inbox entry first, in one call (one statement where the
        // database allows: one round trip per batch, not per event).
        let ids: Vec<_> = events.iter().map(|ready| ready.event.id).collect();
        let outcomes = match db.receive_all(&mut tx, &self.settings.name, &ids).await {
            Ok(outcomes) if outcomes.len() == ids.len() => outcomes,
            Ok(outcomes) => {
                self.discard(tx).await;
                return Err(Unfinished::Failed(HandlerError::new(format!(
                    "the inbox answered for {} of {} events",
                    outcomes.len(),
                    ids.len()
                ))));
            }
            Err(error) => {
                self.discard(tx).await;
                return Err(Unfinished::Failed(database("record the inbox entries")(
                    error,
                )));
            }
        };
        // The `process` spans of the handler calls so far: rolled back
        // with the batch, they are not successes (each delivery is applied
        // again, in a span of its own).
        let mut handled = Vec::with_capacity(batch.len());
        for (ready, outcome) in events.into_iter().zip(outcomes) {
            let span = self.span(ready, Some(&tracing::Span::current()));
            if outcome == InboxOutcome::Duplicate {
                done.duplicates += 1;
                tracing::info!(
                    parent: &span,
                    "already processed: acknowledged without running the handler"
                );
                continue;
            }
            if stopping(stop) {
                rolled_back(&handled, "shutdown began");
                self.discard(tx).await;
                return Err(Unfinished::Stopped);
            }
            let called = self
                .call_handler(&mut tx, &ready.event)
                .instrument(span.clone())
                .await;
            if let Err(failure) = called {
                mark_failed(&span, &failure.error);
                rolled_back(&handled, &failure.error);
                if failure.panicked {
                    // Possibly mid-statement: dropped, which rolls back.
                    drop(tx);
                } else {
                    self.discard(tx).await;
                }
                return Err(Unfinished::Failed(failure.error));
            }
            done.processed += 1;
            done.raised.push(ready.event.occurred_at);
            handled.push(span);
        }
        if let Err(error) = db.commit(tx).await.map_err(database("commit")) {
            rolled_back(&handled, &error);
            return Err(Unfinished::Failed(error));
        }
        Ok(done)
    }

    /// Rolls `tx` back (explicitly: it keeps a pooled connection, where
    /// dropping the transaction may close it).
    async fn discard(&self, tx: D::Tx) {
        if let Err(error) = self.db.rollback(tx).await {
            tracing::debug!(%error, "rolling back a batch failed");
        }
    }
}

/// Marks the `process` spans of handler calls whose batch rolled back
/// (because of `cause`) as not successful.
fn rolled_back(spans: &[tracing::Span], cause: impl std::fmt::Display) {
    if spans.is_empty() {
        return;
    }
    let error = HandlerError::new(format!(
        "rolled back with its batch ({cause}); applied again on its own"
    ));
    for span in spans {
        mark_failed(span, &error);
    }
}
