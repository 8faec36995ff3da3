//! The relay engine: claim → publish (pipelined, in waves) → mark.
//!
//! See [`Relay`]. This file holds the type, its accessors and
//! [`Relay::run`], which starts the parts:
//! - `main_loop.rs`: one claim loop (wakeups, polls, operator pause,
//!   broker pause, store errors);
//! - `batch.rs`: one claimed batch, published in waves and marked;
//! - `suspect.rs`: events in flight when the connection died, published
//!   alone and judged;
//! - `waves.rs`: the waves of a batch (per-aggregate order);
//! - `breaker.rs`: the per-destination circuit breakers (unconfirmed
//!   messages);
//! - `unroutable.rs`: [`UnroutablePolicy`];
//! - `heartbeat.rs`: registration, heartbeats, and an operator's pause and
//!   resume;
//! - `stats.rs`: the backlog gauges and the store's housekeeping;
//! - `pause.rs`: the relay-wide pause after a lost connection (on the
//!   crate's jittered [`Backoff`](crate::Backoff));
//! - `poll.rs`: the loops' fixed-rate poll times;
//! - `builder.rs`, `handle.rs`, [`metric_names`]: [`RelayBuilder`],
//!   [`RelayHandle`] and the metric names.

mod batch;
mod breaker;
mod builder;
mod handle;
mod heartbeat;
mod main_loop;
pub mod metric_names;
mod pause;
mod poll;
mod settings;
mod stats;
mod suspect;
mod unroutable;
mod waves;

use std::time::Duration;

use futures_util::StreamExt;
use tracing::{info, warn};

pub use builder::RelayBuilder;
pub use handle::RelayHandle;
pub use unroutable::UnroutablePolicy;

use crate::{OutboxStore, Publisher};
use heartbeat::HEARTBEAT_TIMEOUT;
use pause::Pause;
use settings::Settings;

/// Moves committed events from an [`OutboxStore`] to a [`Publisher`].
///
/// One loop, driven by wakeups with a polling fallback:
/// 1. **claim** up to `batch_size` events (the store decides what is
///    claimable, honouring per-aggregate order and retry times); while
///    claims come back full, the next one doubles, up to
///    [`max_batch_size`](RelayBuilder::max_batch_size);
/// 2. **publish** them pipelined, in waves: in ordered mode the k-th event of
///    an aggregate goes out only after its (k-1)-th was confirmed, while
///    different aggregates share each wave; unordered, everything is one wave;
/// 3. **mark** confirmed events `Sent` in one statement, failed ones `Retry`
///    or `Dead` per the [`RetryPolicy`](crate::RetryPolicy), release the rest, and finish.
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
///   capped exponential backoff (the [`RetryPolicy`](crate::RetryPolicy)'s delays); while it is
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
/// It wakes up on [`RelayHandle::notify`], on each item of the store's
/// wakeup stream ([`OutboxStore::wakeups`], e.g. PostgreSQL `NOTIFY`; held
/// while the relay runs, dropped when it stops) and by polling:
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
///
/// [`PublishOutcome::Acked`]: crate::PublishOutcome::Acked
/// [`PublishOutcome::Rejected`]: crate::PublishOutcome::Rejected
/// [`PublishOutcome::Unpublishable`]: crate::PublishOutcome::Unpublishable
/// [`PublishOutcome::ConnectionLost`]: crate::PublishOutcome::ConnectionLost
/// [`PublishOutcome::ConnectionDied`]: crate::PublishOutcome::ConnectionDied
/// [`PublishOutcome::Unconfirmed`]: crate::PublishOutcome::Unconfirmed
/// [`Claim::mark_suspect`]: crate::Claim::mark_suspect
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
    /// What the builder set.
    settings: Settings,
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
            batch_size = self.settings.batch_size,
            max_batch_size = self.settings.max_batch(),
            concurrency = self.settings.concurrency,
            "outbox relay started"
        );
        // Registered and told whether an operator paused it before the
        // first claim (a relay restarted under a paused name stays paused);
        // a store that does not answer in time is retried by the stats loop.
        let mut registered = false;
        let _ = tokio::time::timeout(HEARTBEAT_TIMEOUT, self.heartbeat(&mut registered)).await;
        let pause = Pause::new(self.settings.pause_min, self.settings.pause_max);
        let started = tokio::time::Instant::now();
        let loops = futures_util::future::join_all(
            (0..self.settings.concurrency)
                .map(|i| self.main_loop(&pause, self.poll_grid(started, i))),
        );
        tokio::select! {
            biased;
            _ = loops => {}
            () = forever(self.store_wakeups()) => {}
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

    /// Wakes the relay on each item of [`OutboxStore::wakeups`]; returns when
    /// the stream ends (after a warning: the relay then relies on polling).
    async fn store_wakeups(&self) {
        let mut wakeups = std::pin::pin!(self.store.wakeups());
        while let Some(()) = wakeups.next().await {
            self.handle.notify();
            // A stream that is always ready must not starve the claim
            // loops running beside this one in the relay's `select!`.
            tokio::task::coop::consume_budget().await;
        }
        warn!(
            relay = %self.registration.name,
            "outbox relay: store wakeups ended, relying on polling"
        );
    }
}

/// Runs `fut`, then never completes (for `select!` arms that must not end the loop).
async fn forever(fut: impl std::future::Future<Output = ()>) {
    fut.await;
    std::future::pending::<()>().await;
}

/// How long a stopping relay waits to remove itself from the registry.
const DEREGISTER_TIMEOUT: Duration = Duration::from_secs(5);
