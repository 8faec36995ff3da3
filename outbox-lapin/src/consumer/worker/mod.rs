//! One worker: takes deliveries in order and settles each — handled and
//! acked, acked as a duplicate, republished for a retry, or dead-lettered.
//!
//! This file holds the worker's loop and one delivery's way through the
//! inbox and the handler; the parts:
//! - `batch.rs`: batch mode: deliveries gathered and applied in one
//!   transaction, or one at a time through this file's path after a
//!   failure;
//! - `retry.rs`: a failed delivery retried or dead-lettered (republished,
//!   confirmed, recorded), then settled;
//! - `ack.rs`: acks and nacks, bounded;
//! - `headers.rs`: the origin headers of republished copies, and the
//!   headers events recorded by the handler inherit.

mod ack;
mod batch;
mod headers;
mod retry;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};
use futures_util::FutureExt;
use lapin::message::Delivery;
use lapin::options::BasicNackOptions;
use outbox_core::{EventEnvelope, Headers, InboxDatabase, InboxOutcome, context, trace_context};
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

use super::republish::{Republisher, text, with_headers};
use super::{EventHandler, HandlerError, Settings, metric_names};
use crate::headers::{
    ATTEMPT_HEADER, DEAD_LETTER_ID_HEADER, DEAD_REASON_HEADER, ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER, QUEUE_HEADER,
};
use crate::wire::{header_i64, header_str};
use crate::{DecodeError, IncomingEvent};
use ack::{ack, requeue};
use headers::{inherited_headers, origin_headers, original_routing_key};
use uuid::Uuid;

/// A delivery on its way to a worker.
pub(super) struct Job {
    pub(super) delivery: Delivery,
    pub(super) decoded: Result<IncomingEvent, DecodeError>,
    pub(super) republisher: Arc<Republisher>,
}

/// What every worker shares.
pub(super) struct Shared<D, H> {
    pub(super) settings: Settings,
    pub(super) db: D,
    pub(super) handler: H,
}

/// A database step that failed, as a handler error (so it is retried).
#[derive(Debug, thiserror::Error)]
#[error("inbox database: cannot {what}")]
struct DatabaseFailure {
    what: &'static str,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

fn database<E: std::error::Error + Send + Sync + 'static>(
    what: &'static str,
) -> impl FnOnce(E) -> HandlerError {
    move |source| {
        HandlerError::new(DatabaseFailure {
            what,
            source: Box::new(source),
        })
    }
}

/// Why [`Shared::handle`] did not commit.
enum Failure {
    /// The database could not begin the transaction or record the inbox
    /// entry: nothing of the message was tried, so no attempt is spent.
    Unavailable(HandlerError),
    /// The handler (or the commit) failed: an attempt is spent.
    Failed(HandlerError),
}

/// `true` once shutdown began (or the consumer was dropped).
fn stopping(stop: &watch::Receiver<bool>) -> bool {
    *stop.borrow() || stop.has_changed().is_err()
}

/// Runs one worker until its queue closes.
pub(super) async fn run<D, H>(
    shared: Arc<Shared<D, H>>,
    mut jobs: mpsc::Receiver<Job>,
    mut stop: watch::Receiver<bool>,
) where
    D: InboxDatabase,
    H: EventHandler<D::Tx>,
{
    if let Some(batching) = shared.settings.batch {
        return batch::run(&shared, jobs, stop, batching).await;
    }
    while let Some(job) = jobs.recv().await {
        if let Some(job) = admit(job, &stop, &shared.settings.name).await {
            shared.process(job, &mut stop).await;
        }
    }
}

/// `job` if it is to be handled: `None` for a delivery of a lost
/// connection (skipped) or one not started before shutdown (requeued).
async fn admit(job: Job, stop: &watch::Receiver<bool>, consumer: &str) -> Option<Job> {
    if !job.delivery.acker.usable() {
        // Its channel is gone: the broker has requeued it already and
        // redelivers it on the new connection.
        tracing::debug!(
            consumer,
            "skipping a delivery of a lost connection; the broker redelivers it"
        );
        return None;
    }
    if stopping(stop) {
        // Not started before shutdown: back to the queue, for the next
        // consumer (the broker keeps its position when it can).
        let requeue = BasicNackOptions {
            requeue: true,
            multiple: false,
        };
        if let Err(error) = job.delivery.acker.nack(requeue).await {
            tracing::debug!(%error, "cannot requeue at shutdown; closing the channel does");
        }
        return None;
    }
    Some(job)
}

/// A decoded delivery, ready for the inbox and the handler.
struct Ready {
    delivery: Delivery,
    event: IncomingEvent,
    /// The routing key it first arrived with.
    routing_key: String,
    /// The exchange it first arrived through.
    #[cfg_attr(not(feature = "opentelemetry"), allow(dead_code))]
    exchange: String,
    /// Which attempt this is (1-based).
    attempt: i64,
    republisher: Arc<Republisher>,
}

/// A job, decoded or not.
enum Prepared {
    Ready(Ready),
    /// Not a valid event: dead-lettered without running the handler.
    Undecodable {
        delivery: Delivery,
        routing_key: String,
        error: DecodeError,
        republisher: Arc<Republisher>,
    },
}

/// Why the handler did not return `Ok`.
struct HandlerFailure {
    error: HandlerError,
    /// It panicked: the connection may be mid-statement, so the
    /// transaction is dropped (rolled back, the connection perhaps closed)
    /// rather than rolled back explicitly.
    panicked: bool,
}

impl<D, H> Shared<D, H>
where
    D: InboxDatabase,
    H: EventHandler<D::Tx>,
{
    async fn process(&self, job: Job, stop: &mut watch::Receiver<bool>) {
        let prepared = self.prepare(job);
        self.process_prepared(prepared, stop).await;
    }

    /// A prepared delivery through its own transaction, or dead-lettered
    /// if it is not an event.
    async fn process_prepared(&self, prepared: Prepared, stop: &mut watch::Receiver<bool>) {
        match prepared {
            Prepared::Ready(ready) => self.apply(&ready, None, stop).await,
            Prepared::Undecodable {
                delivery,
                routing_key,
                error,
                republisher,
            } => {
                self.undecodable(&delivery, &routing_key, &error, &republisher, stop)
                    .await;
            }
        }
    }

    /// Reads `job`'s original routing key, correlation id and attempt.
    fn prepare(&self, job: Job) -> Prepared {
        let Job {
            delivery,
            decoded,
            republisher,
        } = job;
        let empty = lapin::types::FieldTable::default();
        let headers = delivery.properties.headers().as_ref().unwrap_or(&empty);
        let original = original_routing_key(headers);
        if original.is_none() && headers.contains_key(ORIGINAL_ROUTING_KEY_HEADER) {
            tracing::warn!(
                consumer = %self.settings.name,
                message_id = ?delivery.properties.message_id(),
                routing_key = %delivery.routing_key,
                "the message's {ORIGINAL_ROUTING_KEY_HEADER} header is not a routing key (not \
                 text, or longer than AMQP's {} bytes; this consumer never writes such a \
                 header): ignored, the delivery's routing key is used and replaces it when \
                 the message is retried or dead-lettered",
                EventEnvelope::MAX_SHORT_BYTES
            );
        }
        let routing_key = original.unwrap_or(delivery.routing_key.as_str()).to_owned();
        let mut event = match decoded {
            Ok(event) => event,
            Err(error) => {
                return Prepared::Undecodable {
                    delivery,
                    routing_key,
                    error,
                    republisher,
                };
            }
        };
        event.routing_key.clone_from(&routing_key);
        // The producer's baggage stays only when this process carries
        // baggage; a malformed trace context is neither a parent nor carried on.
        trace_context::sanitize(&mut event.headers);
        if event.headers.get(Headers::CORRELATION_ID).is_none()
            && let Some(correlation) = delivery.properties.correlation_id()
        {
            event
                .headers
                .insert(Headers::CORRELATION_ID, correlation.as_str());
        }
        let attempt = header_i64(headers, ATTEMPT_HEADER).unwrap_or(1).max(1);
        let exchange = header_str(headers, ORIGINAL_EXCHANGE_HEADER)
            .filter(|_| original.is_some())
            .unwrap_or(delivery.exchange.as_str())
            .to_owned();
        Prepared::Ready(Ready {
            delivery,
            event,
            routing_key,
            exchange,
            attempt,
            republisher,
        })
    }

    /// Dead-letters a message that is not a valid event.
    async fn undecodable(
        &self,
        delivery: &Delivery,
        routing_key: &str,
        error: &DecodeError,
        republisher: &Republisher,
        stop: &mut watch::Receiver<bool>,
    ) {
        let empty = lapin::types::FieldTable::default();
        let headers = delivery.properties.headers().as_ref().unwrap_or(&empty);
        let span = tracing::warn_span!(
            "outbox.consume",
            consumer = %self.settings.name,
            message_id = ?delivery.properties.message_id(),
            routing_key = %routing_key,
        );
        async {
            tracing::warn!(%error, "undecodable message: dead-lettering it");
            let reason = format!("cannot decode the message: {error}");
            // Unchanged but for the reason, and an unusable origin
            // header replaced.
            let mut replaced = Vec::new();
            if headers.contains_key(ORIGINAL_ROUTING_KEY_HEADER) {
                replaced = origin_headers(delivery, routing_key);
            }
            replaced.push((DEAD_REASON_HEADER, text(&reason)));
            replaced.push((QUEUE_HEADER, text(&self.settings.queue)));
            replaced.push((DEAD_LETTER_ID_HEADER, text(&Uuid::now_v7().to_string())));
            let properties = with_headers(&delivery.properties, replaced);
            let attempts = header_i64(headers, ATTEMPT_HEADER).unwrap_or(1);
            self.dead_letter(
                delivery,
                routing_key,
                properties,
                &reason,
                None,
                attempts,
                republisher,
                stop,
            )
            .await;
        }
        .instrument(span)
        .await;
    }

    /// The span of one event's handling: `outbox.consume`, with the
    /// incoming trace id for log lines. With the `opentelemetry` feature it
    /// is also the OpenTelemetry `process` span (kind consumer, messaging
    /// attributes): a child of the context the message carries, or linked
    /// to it ([`Settings::trace_links`]); in batch mode linked to `batch`.
    fn span(&self, ready: &Ready, batch: Option<&tracing::Span>) -> tracing::Span {
        let event = &ready.event;
        let trace_id = trace_context::trace_id(&event.headers);
        #[cfg(not(feature = "opentelemetry"))]
        let _ = batch;
        #[cfg(not(feature = "opentelemetry"))]
        let span = tracing::info_span!(
            "outbox.consume",
            consumer = %self.settings.name,
            event_id = %event.id,
            event_type = %event.event_type,
            aggregate_type = %event.aggregate_type,
            aggregate_id = %event.aggregate_id,
            attempt = ready.attempt,
            trace_id = trace_id.as_deref(),
        );
        #[cfg(feature = "opentelemetry")]
        let span = {
            let span = tracing::info_span!(
                "outbox.consume",
                consumer = %self.settings.name,
                event_id = %event.id,
                event_type = %event.event_type,
                aggregate_type = %event.aggregate_type,
                aggregate_id = %event.aggregate_id,
                attempt = ready.attempt,
                trace_id = trace_id.as_deref(),
                otel.name = %format_args!("process {}", self.settings.queue),
                otel.kind = "consumer",
                otel.status_code = tracing::field::Empty,
                otel.status_description = tracing::field::Empty,
                messaging.system = "rabbitmq",
                messaging.operation.name = "process",
                messaging.operation.type = "process",
                messaging.destination.name = %ready.exchange,
                messaging.destination.subscription.name = %self.settings.queue,
                messaging.rabbitmq.destination.routing_key = %ready.routing_key,
                messaging.message.id = %event.id,
                messaging.message.conversation_id = event.headers.get(Headers::CORRELATION_ID),
                messaging.consumer.group.name = %self.settings.name,
            );
            // Before the span is entered: its parent cannot change after.
            let parented = if self.settings.trace_links {
                // A new trace (in batch mode: the batch's), linked to the
                // producer's.
                trace_context::add_link(&span, &event.headers);
                false
            } else {
                trace_context::set_parent(&span, &event.headers)
            };
            // Linked to its batch unless the batch's span is its parent
            // already (no producer context, or a link): a delivery
            // applied alone after its batch failed is outside that span.
            if let Some(batch) = batch
                && (parented || tracing::Span::current().id() != batch.id())
            {
                trace_context::link_span(&span, batch);
            }
            span
        };
        span
    }

    /// One delivery in its own transaction: handled and acked, acked as a
    /// duplicate, retried in place while the database is unavailable,
    /// retried or dead-lettered after a failure.
    async fn apply(
        &self,
        ready: &Ready,
        batch: Option<&tracing::Span>,
        stop: &mut watch::Receiver<bool>,
    ) {
        let Ready {
            delivery,
            event,
            routing_key,
            attempt,
            republisher,
            ..
        } = ready;
        let (attempt, span) = (*attempt, self.span(ready, batch));
        let failed_span = span.clone();
        async {
            loop {
                match self.handle(event).await {
                    Ok(InboxOutcome::FirstTime) => {
                        self.count(metric_names::PROCESSED_TOTAL);
                        self.handled(event.occurred_at);
                        tracing::debug!("handled and committed");
                        ack(delivery).await;
                    }
                    Ok(InboxOutcome::Duplicate) => {
                        self.count(metric_names::DUPLICATES_TOTAL);
                        tracing::info!(
                            "already processed: acknowledged without running the handler"
                        );
                        ack(delivery).await;
                    }
                    Err(Failure::Unavailable(error)) => {
                        // A database outage is not the message's fault: wait
                        // and try the same delivery again, without spending
                        // an attempt, until the database answers or shutdown.
                        self.count(metric_names::DATABASE_UNAVAILABLE_TOTAL);
                        tracing::warn!(
                            %error,
                            retry_in = ?self.settings.retry_delay,
                            "inbox database unavailable: retrying without spending an attempt"
                        );
                        self.pause(stop).await;
                        if !delivery.acker.usable() {
                            // Its channel is gone (connection lost, or the
                            // broker's consumer timeout): the broker has
                            // requeued it and redelivers it.
                            tracing::debug!("delivery's channel closed during the outage");
                            mark_failed(&failed_span, &error);
                        } else if stopping(stop) {
                            requeue(delivery).await;
                            mark_failed(&failed_span, &error);
                        } else {
                            continue;
                        }
                    }
                    Err(Failure::Failed(error)) => {
                        mark_failed(&failed_span, &error);
                        let failure = Attempt {
                            event,
                            routing_key,
                            attempt,
                        };
                        self.failed(delivery, &failure, &error, republisher, stop)
                            .await;
                    }
                }
                break;
            }
        }
        .instrument(span)
        .await;
    }

    /// Inbox entry, handler and commit in one transaction.
    async fn handle(&self, event: &IncomingEvent) -> Result<InboxOutcome, Failure> {
        let db = &self.db;
        let mut tx = db
            .begin()
            .await
            .map_err(database("begin a transaction"))
            .map_err(Failure::Unavailable)?;
        let outcome = match db.receive(&mut tx, &self.settings.name, event.id).await {
            Ok(outcome) => outcome,
            Err(error) => {
                if let Err(rollback) = db.rollback(tx).await {
                    tracing::debug!(error = %rollback, "rollback after a failed inbox insert failed");
                }
                return Err(Failure::Unavailable(database("record the inbox entry")(
                    error,
                )));
            }
        };
        if outcome == InboxOutcome::Duplicate {
            // Nothing was written; an explicit rollback keeps a pooled
            // connection, where dropping the transaction may close it.
            if let Err(error) = db.rollback(tx).await {
                tracing::debug!(%error, "rolling back the empty transaction of a duplicate failed");
            }
            return Ok(InboxOutcome::Duplicate);
        }
        if let Err(failure) = self.call_handler(&mut tx, event).await {
            if failure.panicked {
                drop(tx);
            } else if let Err(rollback) = db.rollback(tx).await {
                // Rolled back, inbox entry included.
                tracing::debug!(error = %rollback, "rollback after a handler error failed");
            }
            return Err(Failure::Failed(failure.error));
        }
        db.commit(tx)
            .await
            .map_err(database("commit"))
            .map_err(Failure::Failed)?;
        Ok(InboxOutcome::FirstTime)
    }

    /// The handler on `tx`, with the headers recorded events inherit; a
    /// panic caught and returned as a failure.
    async fn call_handler(
        &self,
        tx: &mut D::Tx,
        event: &IncomingEvent,
    ) -> Result<(), HandlerFailure> {
        let started = Instant::now();
        let handled = AssertUnwindSafe(context::scope(
            inherited_headers(event),
            self.handler.handle(tx, event),
        ))
        .catch_unwind()
        .await;
        ::metrics::histogram!(
            metric_names::HANDLER_DURATION_SECONDS,
            "consumer" => self.settings.name.clone()
        )
        .record(started.elapsed().as_secs_f64());
        match handled {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(HandlerFailure {
                error,
                panicked: false,
            }),
            Err(panic) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".to_owned());
                Err(HandlerFailure {
                    error: HandlerError::new(format!("the handler panicked: {message}")),
                    panicked: true,
                })
            }
        }
    }

    /// Waits the retry delay, cut short by shutdown.
    async fn pause(&self, stop: &mut watch::Receiver<bool>) {
        if stopping(stop) {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep(self.settings.retry_delay) => {}
            _ = stop.wait_for(|stopped| *stopped) => {}
        }
    }

    fn count(&self, counter: &'static str) {
        ::metrics::counter!(counter, "consumer" => self.settings.name.clone()).increment(1);
    }

    /// Records the raise-to-handled time of an event just handled for the
    /// first time and committed (0 when the producer's clock is ahead).
    fn handled(&self, occurred_at: DateTime<Utc>) {
        let elapsed = (Utc::now() - occurred_at).to_std().unwrap_or_default();
        ::metrics::histogram!(
            metric_names::RAISE_TO_HANDLED_SECONDS,
            "consumer" => self.settings.name.clone()
        )
        .record(elapsed.as_secs_f64());
    }
}

/// Marks `span` (an event's `process` span) failed, for OpenTelemetry.
fn mark_failed(span: &tracing::Span, error: &HandlerError) {
    #[cfg(feature = "opentelemetry")]
    {
        span.record("otel.status_code", "ERROR");
        span.record("otel.status_description", tracing::field::display(error));
    }
    #[cfg(not(feature = "opentelemetry"))]
    let _ = (span, error);
}

/// A failed attempt at an event.
#[derive(Clone, Copy)]
struct Attempt<'a> {
    event: &'a IncomingEvent,
    /// The routing key it first arrived with.
    routing_key: &'a str,
    /// Which attempt failed (1-based).
    attempt: i64,
}
