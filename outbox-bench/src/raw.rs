//! W2's ceilings: raw lapin publish-with-confirms of the relay's messages,
//! with several strategies, so the ceiling is what a careful hand-written
//! publisher reaches on this broker and not one particular shape of it.
//!
//! Every strategy publishes the same envelopes as the relay would (the
//! properties of `wire::properties`, `mandatory`), to the same exchange,
//! and is clocked by the same consumer ([`drain::receive_all`]): from the
//! first publish until the consumer has every message. Every confirm is
//! awaited and must be a plain `Ack`: a `Nack` or a returned (unroutable)
//! message fails the run, so no strategy is fast by losing messages.
//!
//! The strategies (see [`Strategy`]):
//! - **stop-and-wait**: one channel, a batch of 100 published, then all its
//!   confirms awaited before the next batch (the ceiling the bench had
//!   before; kept as a second column so the history stays readable);
//! - **channels × batch**: several channels on the run's connection, each
//!   a task publishing its share of the messages batch by batch, so the
//!   channels' batches overlap (what the relay does with two batches in
//!   flight);
//! - **sliding window**: one channel publishing while fewer than N confirms
//!   are outstanding, waiting for the oldest when N are;
//! - **sequential streams** (the hot backlog's ceiling): one task per
//!   aggregate on a shared channel, each waiting for its message's confirm
//!   before its next, which is all that per-aggregate order with one
//!   message in flight per aggregate allows.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{Channel, Confirmation, PublisherConfirm};
use outbox::EventEnvelope;
use outbox::rabbitmq::wire;
use uuid::Uuid;

use crate::cpu;
use crate::drain::{self, Drain};
use crate::setup::{BoxError, Bus, OrderPlaced};

/// How the raw publisher keeps messages in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// One channel: `batch` published, then all their confirms awaited.
    StopAndWait { batch: usize },
    /// `channels` channels, each its own task publishing its share in
    /// batches of `batch` (published, then their confirms awaited).
    Channels { channels: usize, batch: usize },
    /// One channel, at most `window` confirms outstanding.
    Window { window: usize },
    /// One task per aggregate on a shared channel, each message's confirm
    /// awaited before that aggregate's next.
    Streams,
}

/// The strategies of the W2 ceiling, the stop-and-wait one first.
pub(crate) const SPREAD: [Strategy; 5] = [
    Strategy::StopAndWait { batch: 100 },
    Strategy::Channels {
        channels: 2,
        batch: 500,
    },
    Strategy::Channels {
        channels: 4,
        batch: 250,
    },
    Strategy::Window { window: 256 },
    Strategy::Window { window: 1024 },
];

/// The stop-and-wait strategy (the second column).
pub(crate) const STOP_AND_WAIT: Strategy = Strategy::StopAndWait { batch: 100 };

impl Strategy {
    /// Its row in the table.
    pub(crate) fn label(self) -> String {
        match self {
            Strategy::StopAndWait { batch } => {
                format!("raw: 1 channel, batch {batch}, stop-and-wait")
            }
            Strategy::Channels { channels, batch } => {
                format!("raw: {channels} channels x batch {batch}, overlapping")
            }
            Strategy::Window { window } => format!("raw: 1 channel, window of {window}"),
            Strategy::Streams => "raw: 1 sequential stream per aggregate".to_owned(),
        }
    }

    /// Its key in the JSON line.
    pub(crate) fn key(self) -> String {
        match self {
            Strategy::StopAndWait { batch } => format!("stop_and_wait_{batch}"),
            Strategy::Channels { channels, batch } => format!("channels_{channels}x{batch}"),
            Strategy::Window { window } => format!("window_{window}"),
            Strategy::Streams => "streams".to_owned(),
        }
    }
}

/// Publishes `events` to `bus` with `strategy` and returns when the
/// consumer has them all. Only the queue is emptied first: a ceiling
/// touches no database, so it is the same for every back end.
pub(crate) async fn drain(
    bus: &Bus,
    events: &[OrderPlaced],
    strategy: Strategy,
) -> Result<Drain, BoxError> {
    bus.purge().await?;
    let envelopes: Vec<EventEnvelope> = events
        .iter()
        .map(EventEnvelope::from_event)
        .collect::<Result<_, _>>()?;
    let expected: HashSet<Uuid> = envelopes.iter().map(|e| e.id).collect();
    let envelopes = Arc::new(envelopes);
    let mut rx = bus.consume().await?;
    let target = Target {
        exchange: Arc::from(bus.exchange.as_str()),
    };
    // Channels are opened and put in confirm mode before the clock starts,
    // as the relay's publisher connects before its.
    let channels = match strategy {
        Strategy::Channels { channels, .. } => channels,
        _ => 1,
    };
    let mut opened = Vec::with_capacity(channels);
    for _ in 0..channels {
        let channel = bus.amqp().create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        opened.push(channel);
    }
    let meter = cpu::Meter::start(&cpu::Db::None).await?;
    let started = Instant::now();
    // On a worker thread, as the relay runs: the main thread's task is
    // woken across threads, which made the one-channel strategies slower
    // and dearer in CPU than the same code on a worker.
    let task = {
        let (channels, target, envelopes) =
            (opened.clone(), target.clone(), Arc::clone(&envelopes));
        tokio::spawn(async move { publish(&channels, &target, &envelopes, strategy).await })
    };
    let published = match task.await {
        Ok(result) => result,
        Err(join) => Err(join.into()),
    };
    for channel in &opened {
        let _ = channel.close(200, "done".into()).await;
    }
    published?;
    let mut drain = drain::receive_all(&mut rx, expected, started).await;
    drain.cpu = meter.stop().await?;
    Ok(drain)
}

/// The exchange every strategy publishes to, shareable with tasks.
#[derive(Clone)]
struct Target {
    exchange: Arc<str>,
}

impl Target {
    /// Publishes `envelope` as the relay does; the pending confirm.
    async fn publish(
        &self,
        channel: &Channel,
        envelope: &EventEnvelope,
    ) -> Result<PublisherConfirm, BoxError> {
        Ok(channel
            .basic_publish(
                self.exchange.as_ref().into(),
                envelope.event_type.as_str().into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                envelope.payload.as_bytes(),
                wire::properties(envelope, "/bench"),
            )
            .await?)
    }
}

/// Awaits `confirm`: a plain `Ack` or an error.
async fn acked(confirm: PublisherConfirm) -> Result<(), BoxError> {
    match confirm.await? {
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(_)) => {
            Err("raw publish: a message was returned (unroutable)".into())
        }
        Confirmation::Nack(_) => Err("raw publish: the broker nacked a message".into()),
        Confirmation::NotRequested => Err("raw publish: the channel is not in confirm mode".into()),
    }
}

/// Publishes `envelopes` on `channel` (in confirm mode) to `exchange` as
/// the relay does (`wire::properties`, `mandatory`), in batches of `batch`,
/// each batch's confirms awaited before the next: every message must be
/// a plain `Ack`, neither nacked nor returned. W2's stop-and-wait ceiling,
/// and how W5 fills its queue.
pub(crate) async fn publish_all(
    channel: &Channel,
    exchange: &str,
    envelopes: &[EventEnvelope],
    batch: usize,
) -> Result<(), BoxError> {
    let target = Target {
        exchange: Arc::from(exchange),
    };
    batches(channel, &target, envelopes, batch).await
}

/// Publishes `envelopes` on `channel` in batches of `batch`, each batch's
/// confirms awaited before the next.
async fn batches<'a>(
    channel: &Channel,
    target: &Target,
    envelopes: impl IntoIterator<Item = &'a EventEnvelope>,
    batch: usize,
) -> Result<(), BoxError> {
    let batch = batch.max(1);
    let mut confirms = Vec::with_capacity(batch);
    for envelope in envelopes {
        confirms.push(target.publish(channel, envelope).await?);
        if confirms.len() == batch {
            for confirm in confirms.drain(..) {
                acked(confirm).await?;
            }
        }
    }
    for confirm in confirms {
        acked(confirm).await?;
    }
    Ok(())
}

async fn publish(
    channels: &[Channel],
    target: &Target,
    envelopes: &Arc<Vec<EventEnvelope>>,
    strategy: Strategy,
) -> Result<(), BoxError> {
    let first = channels.first().ok_or("raw publish: no channel")?;
    match strategy {
        Strategy::StopAndWait { batch } => batches(first, target, envelopes.iter(), batch).await,
        Strategy::Channels { batch, .. } => {
            // Each channel takes a contiguous share, in the backlog's order.
            let share = envelopes.len().div_ceil(channels.len());
            let mut tasks = Vec::with_capacity(channels.len());
            for (n, channel) in channels.iter().enumerate() {
                let (channel, target, envelopes) =
                    (channel.clone(), target.clone(), Arc::clone(envelopes));
                tasks.push(tokio::spawn(async move {
                    let items = envelopes.iter().skip(n * share).take(share);
                    batches(&channel, &target, items, batch).await
                }));
            }
            for task in tasks {
                task.await??;
            }
            Ok(())
        }
        Strategy::Window { window } => {
            let mut outstanding = VecDeque::with_capacity(window);
            for envelope in envelopes.iter() {
                while outstanding.len() >= window.max(1) {
                    let Some(oldest) = outstanding.pop_front() else {
                        break;
                    };
                    acked(oldest).await?;
                }
                outstanding.push_back(target.publish(first, envelope).await?);
            }
            for confirm in outstanding {
                acked(confirm).await?;
            }
            Ok(())
        }
        Strategy::Streams => {
            // One stream per aggregate, in the backlog's order within it.
            let mut streams: HashMap<&str, Vec<usize>> = HashMap::new();
            for (i, envelope) in envelopes.iter().enumerate() {
                streams
                    .entry(envelope.aggregate_id.as_str())
                    .or_default()
                    .push(i);
            }
            let mut tasks = Vec::with_capacity(streams.len());
            for items in streams.into_values() {
                let (channel, target, envelopes) =
                    (first.clone(), target.clone(), Arc::clone(envelopes));
                tasks.push(tokio::spawn(async move {
                    for i in items {
                        acked(target.publish(&channel, &envelopes[i]).await?).await?;
                    }
                    Ok::<(), BoxError>(())
                }));
            }
            for task in tasks {
                task.await??;
            }
            Ok(())
        }
    }
}
