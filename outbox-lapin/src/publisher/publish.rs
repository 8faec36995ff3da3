//! The [`Publisher`] impl: a batch published in rounds on checked-out
//! channels; when the broker closes a channel because of a message, the
//! messages in question are narrowed down (bisected) on fresh channels
//! until only the one at fault is rejected.

use outbox_core::{EventEnvelope, Headers, PublishOutcome, Publisher, failpoints, trace_context};
use tokio::time::Instant;

use super::LapinPublisher;
use super::confirm::Round;
use super::span::Spans;
use super::target::header_frame_fits;
use crate::wire;

/// A batch's outcomes so far, and the `publish` spans of its messages
/// still awaiting theirs.
struct Settled {
    outcomes: Vec<Option<PublishOutcome>>,
    spans: Spans,
}

impl Settled {
    /// Message `i`'s outcome is known: its span ends with it.
    fn set(&mut self, i: usize, outcome: PublishOutcome) {
        self.spans.end(i, &outcome);
        self.outcomes[i] = Some(outcome);
    }
}

impl Publisher for LapinPublisher {
    async fn publish(
        &self,
        events: &[&EventEnvelope],
        deadline: Option<std::time::Instant>,
    ) -> Vec<PublishOutcome> {
        // Confirms are awaited until the confirm timeout, or the claim's
        // deadline if that comes first (past it, nothing could be marked).
        let claim_deadline = deadline.map(Instant::from_std);
        let mut settled = Settled {
            outcomes: vec![None; events.len()],
            spans: Spans::new(events.len()),
        };
        // What cannot go on the wire at all is rejected without sending.
        let mut targets: Vec<(String, String)> = Vec::with_capacity(events.len());
        let mut sendable: Vec<usize> = Vec::with_capacity(events.len());
        for (i, envelope) in events.iter().enumerate() {
            wire::warn_malformed(envelope);
            match self.target(envelope) {
                Ok(target) => {
                    settled.spans.start(i, envelope, &target.0, &target.1);
                    targets.push(target);
                    sendable.push(i);
                }
                Err(reason) => {
                    tracing::warn!(
                        event_id = %envelope.id,
                        trace_id = trace_context::trace_id(&envelope.headers).as_deref(),
                        %reason,
                        "event cannot be published"
                    );
                    settled.outcomes[i] = Some(PublishOutcome::unpublishable(reason));
                    targets.push(Default::default());
                }
            }
        }
        // Groups of indexes still to publish; the first is the whole batch.
        let mut groups: Vec<Vec<usize>> = vec![sendable];
        let mut first = true;
        while let Some(group) = groups.pop() {
            if group.is_empty() {
                continue;
            }
            // Each batch in flight has a channel of its own, so the relay's
            // concurrent batches overlap (one sends while another awaits
            // confirms) and a message that makes the broker close a channel
            // fails only its own batch. Narrowing such a failure down runs
            // on fresh channels. Batches in flight together never share an
            // aggregate (claims lock them), so per-aggregate order holds.
            let narrowing = !std::mem::replace(&mut first, false);
            let checkout = match self.checkout(narrowing).await {
                Ok(checkout) => checkout,
                Err(reason) => {
                    for i in groups.iter().flatten().chain(&group) {
                        settled.set(*i, PublishOutcome::connection_lost(reason.clone()));
                    }
                    break;
                }
            };
            // The header frame must fit the frame size negotiated on this
            // connection: a larger one makes RabbitMQ close the whole
            // connection (501), for every batch on it.
            let frame_max = checkout.connection.configuration().frame_max();
            let mut fitting = Vec::with_capacity(group.len());
            for i in group {
                let source = &self.inner.settings.source;
                match header_frame_fits(events[i], source, settled.spans.trace(i), frame_max) {
                    Ok(()) => fitting.push(i),
                    // The span's context can be longer than the recorded one
                    // (a `traceparent` where none was recorded, a longer
                    // `tracestate`): an event that fits as recorded is sent
                    // as recorded rather than refused for its own span.
                    Err(reason)
                        if settled.spans.trace(i).is_some()
                            && header_frame_fits(events[i], source, None, frame_max).is_ok() =>
                    {
                        tracing::warn!(
                            event_id = %events[i].id,
                            trace_id = trace_context::trace_id(&events[i].headers).as_deref(),
                            %reason,
                            "outbox: the publish span's trace context does not fit the message; \
                             sent with the recorded one"
                        );
                        settled.spans.send_recorded(i);
                        fitting.push(i);
                    }
                    Err(reason) => {
                        tracing::warn!(
                            event_id = %events[i].id,
                            trace_id = trace_context::trace_id(&events[i].headers).as_deref(),
                            %reason,
                            "event cannot be published"
                        );
                        settled.set(i, PublishOutcome::unpublishable(reason));
                    }
                }
            }
            let group = fitting;
            if group.is_empty() {
                self.checkin(checkout, true);
                continue;
            }
            let batch: Vec<&EventEnvelope> = group.iter().map(|&i| events[i]).collect();
            let batch_targets: Vec<&(String, String)> =
                group.iter().map(|&i| &targets[i]).collect();
            let batch_traces: Vec<Option<&Headers>> =
                group.iter().map(|&i| settled.spans.trace(i)).collect();
            // Sending and confirming share one deadline.
            let deadline = claim_deadline.map_or(
                Instant::now() + self.inner.settings.confirm_timeout,
                |claim| claim.min(Instant::now() + self.inner.settings.confirm_timeout),
            );
            let pending = self
                .send(
                    &checkout.channel,
                    &batch,
                    &batch_targets,
                    &batch_traces,
                    deadline,
                )
                .await;
            failpoints::hit(failpoints::AFTER_PUBLISH_BEFORE_CONFIRM);
            let sent = pending.len();
            let (mut rounds, mut clean) = self
                .confirm(
                    checkout.connection.status(),
                    &batch[..sent],
                    pending,
                    deadline,
                )
                .await;
            if sent < batch.len() {
                // The broker stopped reading: this connection is not used
                // again, and what was not sent spends nothing.
                let reason = format!(
                    "publishing did not complete within {:?}: RabbitMQ stopped reading \
                     (TCP backpressure, e.g. a memory or disk alarm raised mid-batch)",
                    self.inner.settings.confirm_timeout
                );
                self.discard(checkout.generation, &reason);
                clean = false;
                rounds.extend(
                    (sent..batch.len())
                        .map(|_| Round::Done(PublishOutcome::connection_lost(reason.clone()))),
                );
            }
            let fresh = checkout.fresh;
            self.checkin(checkout, clean);
            let mut closed = Vec::new();
            let mut closed_reason = String::new();
            for (&i, round) in group.iter().zip(rounds) {
                match round {
                    Round::Done(outcome) => settled.set(i, outcome),
                    Round::ChannelClosed(reason) => {
                        closed.push(i);
                        closed_reason = reason;
                    }
                }
            }
            match closed.len() {
                0 => {}
                1 => {
                    // Alone on a fresh channel and still closing it: the
                    // culprit. (On a reused channel, try it once more on a
                    // fresh one.)
                    if group.len() == 1 && fresh {
                        settled.set(closed[0], PublishOutcome::rejected(closed_reason));
                    } else {
                        groups.push(closed);
                    }
                }
                n => {
                    let right = closed.split_off(n / 2);
                    groups.push(right);
                    groups.push(closed);
                }
            }
        }
        (0..events.len())
            .map(|i| match settled.outcomes[i].take() {
                Some(outcome) => outcome,
                None => {
                    let outcome = PublishOutcome::connection_lost("not published");
                    settled.spans.end(i, &outcome);
                    outcome
                }
            })
            .collect()
    }

    /// The exchange and routing key: the relay's circuit breaker for
    /// unconfirmed messages works per exchange and routing key, so one
    /// stuck queue delays only the events routed to it.
    fn destination(&self, event: &EventEnvelope) -> String {
        format!(
            "exchange `{}` routing key `{}`",
            self.exchange(event),
            self.routing_key(event)
        )
    }
}
