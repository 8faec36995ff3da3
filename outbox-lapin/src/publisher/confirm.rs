//! One round of a batch on its channel: the messages sent pipelined, then
//! their confirms (and returns, matched by message id) awaited until the
//! deadline.

use std::collections::HashMap;

use futures_util::FutureExt;
use lapin::options::BasicPublishOptions;
use lapin::{Channel, Confirmation, ConnectionStatus, PublisherConfirm};
use outbox_core::{EventEnvelope, Headers, PublishOutcome};
use tokio::time::Instant;

use super::LapinPublisher;
use super::classify::classify;
use crate::wire;

/// What happened to one message in one round.
pub(super) enum Round {
    Done(PublishOutcome),
    /// The broker closed the channel; the culprit is among these messages.
    ChannelClosed(String),
}

impl LapinPublisher {
    /// Sends `events` pipelined on `channel` (each with its `traces` entry,
    /// its `publish` span's trace context, in place of the recorded one);
    /// returns each publish's
    /// confirm (or the error of sending it), and whether it may have been
    /// partly on the wire: only the first publish that fails, and only if
    /// it began on an open channel (lapin resolves a publish once its last
    /// frame is written, so that one may have been cut mid-write; every
    /// later one is refused before anything of it is written). Awaits no
    /// confirm. Sending is
    /// bounded by `deadline`: under TCP backpressure (a broker that stopped
    /// reading, e.g. for a resource alarm raised mid-batch) `basic_publish`
    /// blocks, and the events not sent by then are left out (the result is
    /// shorter than `events`).
    pub(super) async fn send(
        &self,
        channel: &Channel,
        events: &[&EventEnvelope],
        targets: &[&(String, String)],
        traces: &[Option<&Headers>],
        deadline: Instant,
    ) -> Vec<(lapin::Result<PublisherConfirm>, bool)> {
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let mut pending = Vec::with_capacity(events.len());
        let mut failed = false;
        for ((envelope, (exchange, routing_key)), trace) in events.iter().zip(targets).zip(traces) {
            let began_open = !failed && channel.status().connected();
            let publishing = channel.basic_publish(
                exchange.as_str().into(),
                routing_key.as_str().into(),
                options,
                envelope.payload.as_bytes(),
                wire::properties_with(envelope, &self.inner.settings.source, *trace),
            );
            match tokio::time::timeout_at(deadline, publishing).await {
                Ok(sent) => {
                    failed |= sent.is_err();
                    pending.push((sent, began_open));
                }
                Err(_) => break,
            }
        }
        pending
    }

    /// Awaits the confirms of a [`send`](Self::send) of `events`, until
    /// `deadline`. Returns each event's round, and whether the channel is
    /// clean (every message answered, none timed out or closed the channel)
    /// and may serve another batch.
    ///
    /// Unroutable messages are matched by their returned `message_id`, not
    /// by the confirm a return came with: lapin hands a `basic.return` to
    /// whichever confirm completes next, which with a broker's multiple-ack
    /// may be an earlier message's. Every return precedes its own message's
    /// ack, so a return is attached to a confirm that completed no later
    /// than its message's own.
    ///
    /// At the deadline no confirm is dropped unseen (a return attached to
    /// a dropped confirm would be lost, and its message could be taken as
    /// sent): every confirm still pending is polled once (what is complete
    /// counts), then those still pending are polled once more, only to
    /// collect returns (whatever completes then is
    /// [`Unconfirmed`](PublishOutcome::Unconfirmed): its return may sit on
    /// a confirm seen pending a moment before). What is left is
    /// `Unconfirmed`, and the channel is not used again, so no later ack on
    /// it is ever trusted.
    pub(super) async fn confirm(
        &self,
        connection: &ConnectionStatus,
        events: &[&EventEnvelope],
        pending: Vec<(lapin::Result<PublisherConfirm>, bool)>,
        deadline: Instant,
    ) -> (Vec<Round>, bool) {
        let mut clean = true;
        let mut returned: HashMap<String, PublishOutcome> = HashMap::new();
        let mut rounds: Vec<Option<Round>> = Vec::with_capacity(pending.len());
        let mut confirms: Vec<Option<PublisherConfirm>> = Vec::with_capacity(pending.len());
        for (sent, began_open) in pending {
            match sent {
                Ok(confirm) => {
                    rounds.push(None);
                    confirms.push(Some(confirm));
                }
                Err(err) => {
                    clean = false;
                    rounds.push(Some(classify(connection, &err, began_open)));
                    confirms.push(None);
                }
            }
        }
        let mut answer = |answered: lapin::Result<Confirmation>, clean: &mut bool| match answered {
            Err(err) => {
                *clean = false;
                classify(connection, &err, true)
            }
            Ok(Confirmation::Ack(message)) => {
                note_return(&mut returned, message);
                Round::Done(PublishOutcome::Acked)
            }
            Ok(Confirmation::Nack(message)) => {
                note_return(&mut returned, message);
                Round::Done(PublishOutcome::rejected(
                    "negatively acknowledged (basic.nack) by the broker",
                ))
            }
            Ok(Confirmation::NotRequested) => {
                *clean = false;
                Round::Done(PublishOutcome::rejected(
                    "the channel is not in confirm mode",
                ))
            }
        };
        let mut timed_out = false;
        for (round, slot) in rounds.iter_mut().zip(confirms.iter_mut()) {
            let Some(confirm) = slot.as_mut() else {
                continue;
            };
            // By reference: a confirm still pending at the deadline is kept.
            match tokio::time::timeout_at(deadline, confirm).await {
                Ok(answered) => {
                    *slot = None;
                    *round = Some(answer(answered, &mut clean));
                }
                Err(_) => {
                    timed_out = true;
                    break;
                }
            }
        }
        if timed_out {
            clean = false;
            // What is complete now counts.
            for (round, slot) in rounds.iter_mut().zip(confirms.iter_mut()) {
                if let Some(answered) = slot.as_mut().and_then(FutureExt::now_or_never) {
                    *slot = None;
                    *round = Some(answer(answered, &mut clean));
                }
            }
            // Completed since: only their returns count.
            for slot in &mut confirms {
                if let Some(Ok(Confirmation::Ack(message) | Confirmation::Nack(message))) =
                    slot.as_mut().and_then(FutureExt::now_or_never)
                {
                    note_return(&mut returned, message);
                }
            }
        }
        let rounds: Vec<Round> = rounds
            .into_iter()
            .map(|round| {
                round.unwrap_or_else(|| {
                    Round::Done(PublishOutcome::unconfirmed(format!(
                        "no publisher confirm in time (confirm timeout {:?}, or the claim's \
                         deadline if sooner)",
                        self.inner.settings.confirm_timeout
                    )))
                })
            })
            .zip(events)
            .map(|(round, event)| match returned.get(&event.id.to_string()) {
                Some(outcome) if matches!(round, Round::Done(_)) => Round::Done(outcome.clone()),
                _ => round,
            })
            .collect();
        (rounds, clean)
    }
}

/// Notes a `basic.return` by the message id it carries: its outcome.
/// `312 NO_ROUTE` is [`PublishOutcome::Unroutable`] (the relay's
/// `UnroutablePolicy` decides what it costs); any other code is
/// `Rejected`.
fn note_return(
    returned: &mut HashMap<String, PublishOutcome>,
    message: Option<lapin::message::BasicReturnMessage>,
) {
    if let Some(message) = message
        && let Some(id) = message.properties.message_id()
    {
        let outcome = if message.reply_code == NO_ROUTE {
            PublishOutcome::unroutable(format!(
                "returned by the broker as unroutable: {} {} (no queue is bound for routing \
                 key `{}` on exchange `{}`)",
                message.reply_code, message.reply_text, message.routing_key, message.exchange
            ))
        } else {
            PublishOutcome::rejected(format!(
                "returned by the broker: {} {} (exchange `{}`, routing key `{}`)",
                message.reply_code, message.reply_text, message.exchange, message.routing_key
            ))
        };
        returned.insert(id.to_string(), outcome);
    }
}

/// AMQP reply code of a mandatory message no queue is bound for.
const NO_ROUTE: u16 = 312;
