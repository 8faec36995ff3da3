//! [`RelayBuilder`]: settings of a [`Relay`] with documented defaults.

use std::time::Duration;

use super::settings::Settings;
use crate::{Error, OutboxStore, Publisher, Relay, RelayHandle, RetryPolicy, UnroutablePolicy};

/// Configures a [`Relay`]. Every setting has a default; [`build`](Self::build)
/// validates them.
///
/// | setting | default | meaning |
/// |---|---|---|
/// | [`batch_size`](Self::batch_size) | 100 | events claimed and published per batch |
/// | [`max_batch_size`](Self::max_batch_size) | 4 × `batch_size` | what claims grow to, doubling, while each comes back full (a backlog) |
/// | [`concurrency`](Self::concurrency) | 2 | batches in flight at once (one publishing while another claims or marks) |
/// | [`poll_interval`](Self::poll_interval) | 1 s | fallback polling when no wakeup arrives: each loop polls once per interval, the loops spread evenly over it |
/// | [`stats_interval`](Self::stats_interval) | 10 s | how often backlog/dead gauges are refreshed |
/// | [`shutdown_grace`](Self::shutdown_grace) | 30 s | how long shutdown waits for the batch in flight |
/// | [`retry`](Self::retry) | [`RetryPolicy::default`] | backoff and attempt limit for failed publishes |
/// | [`pause`](Self::pause) | 100 ms .. 30 s | backoff after a lost connection or store error |
/// | [`suspect_limit`](Self::suspect_limit) | 3 | connection deaths with an event in flight, the last with it alone, after which it is parked `Dead` |
/// | [`name`](Self::name) | `<host>-<pid>-<random>` | the relay's name in the store's registry (`outbox relays list`, pause and resume) |
/// | [`unroutable`](Self::unroutable) | [`UnroutablePolicy::default`] (hold up to 7 days) | what an event the broker returns as unroutable costs; per event type with [`unroutable_for`](Self::unroutable_for) |
///
/// The batch size trades latency of a single batch against throughput; 100
/// keeps a batch's confirms in one or two TCP round trips on RabbitMQ.
#[derive(Debug)]
#[must_use]
pub struct RelayBuilder<S, P> {
    store: S,
    publisher: P,
    handle: Option<RelayHandle>,
    name: Option<String>,
    settings: Settings,
}

impl<S: OutboxStore, P: Publisher> RelayBuilder<S, P> {
    pub(crate) fn new(store: S, publisher: P) -> Self {
        RelayBuilder {
            store,
            publisher,
            handle: None,
            name: None,
            settings: Settings::default(),
        }
    }

    /// The relay's name in the store's registry of relays (unique per
    /// outbox; 1 to 200 bytes). Default `<host>-<pid>-<4 random hex digits>`.
    /// A relay registered under the name of another replaces its entry, so
    /// give each relay its own (e.g. the pod name).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Events claimed per batch (1..=10 000). Default 100. While claims
    /// come back full, each loop's next claim doubles, up to
    /// [`max_batch_size`](Self::max_batch_size); a claim that comes back
    /// short sets it back to `batch_size`.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.settings.batch_size = n;
        self
    }

    /// The largest claim (`batch_size`..=10 000). Default 4 × `batch_size`
    /// (at most 10 000); `max_batch_size(batch_size)` keeps every claim at
    /// `batch_size`.
    ///
    /// A relay draining a backlog spends most of a batch's time on fixed
    /// costs (the claim's and the mark's round trips and plans, the
    /// commit's flush, a confirm round trip) rather than per event, so
    /// larger claims move more events per second; when the backlog is
    /// gone, claims come back short and small again, so an event recorded
    /// on a quiet outbox does not wait behind a large batch. Measured by
    /// the benchmark (W2), see the README's Performance section. A larger
    /// batch holds its events (and, in per-aggregate order, their
    /// aggregates) longer, and a broker stall leaves more of them waiting
    /// for their confirms. So a claim grows only after a batch that came
    /// back full, settled every event (none held back by a circuit
    /// breaker or an unroutable hold, none released because its claim
    /// lapsed, the connection not lost) and took at most a second; a batch
    /// held back, lapsed or cut by a lost connection (and a pause) sets it
    /// back to `batch_size`, a slower one keeps it where it is. A relay
    /// holds up to `max_batch_size` × [`concurrency`](Self::concurrency)
    /// events in memory.
    pub fn max_batch_size(mut self, n: usize) -> Self {
        self.settings.max_batch_size = Some(n);
        self
    }

    /// Batches in flight at once (1..=16). Default 2: while one batch waits
    /// for its confirms, the next is claimed and the previous one marked, so
    /// database round trips overlap the broker's. Each in-flight batch holds
    /// one pooled connection for its duration.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.settings.concurrency = n;
        self
    }

    /// How often to look for events when no wakeup arrives. Default 1 s.
    ///
    /// Polls also bound how long an event waits behind a batch of another
    /// relay *process* that holds an earlier event of its aggregate (in
    /// per-aggregate order): within one relay, a loop that found such an
    /// event claims again as soon as the batch in front of it ends.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.settings.poll_interval = interval;
        self
    }

    /// How often the backlog/dead/blocked gauges are refreshed. Default 10 s.
    pub fn stats_interval(mut self, interval: Duration) -> Self {
        self.settings.stats_interval = interval;
        self
    }

    /// How long a shutdown waits for the batch in flight before releasing it
    /// unmarked (its events are published again later). Default 30 s.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.settings.shutdown_grace = grace;
        self
    }

    /// Backoff and attempt limit for failed publishes.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.settings.retry = policy;
        self
    }

    /// Bounds of the exponential pause after a lost broker connection or a
    /// store error. Default 100 ms doubling up to 30 s; each pause adds a
    /// random part of up to half its step, never beyond `max`
    /// ([`Backoff`](crate::Backoff)), so relays that lost the same broker do
    /// not reconnect in lockstep.
    pub fn pause(mut self, min: Duration, max: Duration) -> Self {
        self.settings.pause_min = min;
        self.settings.pause_max = max;
        self
    }

    /// How many times the broker connection may die with an event in flight
    /// before the relay parks it `Dead`. Default 3; at least 1.
    ///
    /// A message can kill the connection it is sent on in a way that is
    /// not a per-message error (a proxy or broker plugin that drops the
    /// connection on it): the publisher reports every message in flight
    /// then as [`PublishOutcome::ConnectionDied`](crate::PublishOutcome::ConnectionDied).
    /// The relay spends no attempt on it and pauses as for a lost
    /// connection, but counts each such message as a suspect in its row
    /// ([`Claim::mark_suspect`](crate::Claim::mark_suspect)), so that every
    /// relay sees the count. An event with a suspect count of 1 or more is
    /// published alone: in a call of its own, with no other batch of this
    /// relay in flight on the publisher, while later events of its aggregate
    /// wait for it. When the connection dies with it alone in flight and its
    /// count reaches this limit, it is parked `Dead` with the reason
    /// (attempts unchanged: a dead connection never spends attempts), which
    /// holds its aggregate's later events until an operator replays (which
    /// lowers the count to 1, so the event goes alone first) or skips it.
    /// At least 2: an event's first death is never with it alone (it was
    /// not a suspect yet). Innocent bystanders of the first death
    /// are published alone once and sent; a broker that crashes (without
    /// announcing the close) while a suspect is alone in flight counts
    /// against that suspect too, so set the limit above the number of such
    /// crashes you expect in a row.
    pub fn suspect_limit(mut self, n: u32) -> Self {
        self.settings.suspect_limit = n;
        self
    }

    /// What an unroutable event costs, for every event type without its own
    /// [`unroutable_for`](Self::unroutable_for). Default
    /// [`UnroutablePolicy::default`].
    pub fn unroutable(mut self, policy: UnroutablePolicy) -> Self {
        self.settings.unroutable.default = policy;
        self
    }

    /// What an unroutable event of `event_type` costs.
    pub fn unroutable_for(
        mut self,
        event_type: impl Into<String>,
        policy: UnroutablePolicy,
    ) -> Self {
        self.settings
            .unroutable
            .by_event_type
            .insert(event_type.into(), policy);
        self
    }

    /// Uses an existing handle (e.g. one already given to the Axum layer).
    pub fn handle(mut self, handle: RelayHandle) -> Self {
        self.handle = Some(handle);
        self
    }

    /// Validates the settings and builds the relay.
    ///
    /// # Errors
    /// [`Error::Config`] naming the setting that is out of range.
    pub fn build(self) -> Result<Relay<S, P>, Error> {
        if !(1..=10_000).contains(&self.settings.batch_size) {
            return Err(Error::Config(format!(
                "relay batch_size must be between 1 and 10000, got {}",
                self.settings.batch_size
            )));
        }
        if let Some(max) = self.settings.max_batch_size
            && !(self.settings.batch_size..=super::settings::MAX_BATCH_SIZE).contains(&max)
        {
            return Err(Error::Config(format!(
                "relay max_batch_size must be between batch_size ({}) and 10000, got {max}",
                self.settings.batch_size
            )));
        }
        if !(1..=16).contains(&self.settings.concurrency) {
            return Err(Error::Config(format!(
                "relay concurrency must be between 1 and 16, got {}",
                self.settings.concurrency
            )));
        }
        for (name, value) in [
            ("poll_interval", self.settings.poll_interval),
            ("stats_interval", self.settings.stats_interval),
            ("pause min", self.settings.pause_min),
        ] {
            if value.is_zero() {
                return Err(Error::Config(format!("relay {name} must be positive")));
            }
        }
        if self.settings.pause_max < self.settings.pause_min {
            return Err(Error::Config(
                "relay pause max must not be below pause min".into(),
            ));
        }
        if self.settings.suspect_limit < 2 {
            return Err(Error::Config(
                "relay suspect_limit must be at least 2 (an event's first connection death is \
                 never with it alone: it was not a suspect yet)"
                    .into(),
            ));
        }
        self.settings.retry.validate()?;
        let name = match self.name {
            Some(name)
                if name.trim().is_empty()
                    || name.len() > 200
                    || name.contains(char::is_control) =>
            {
                return Err(Error::Config(
                    "relay name must be 1 to 200 bytes, not blank, without control characters"
                        .into(),
                ));
            }
            Some(name) => name,
            None => default_name(),
        };
        Ok(Relay {
            registration: crate::RelayRegistration::new(
                name,
                self.settings
                    .stats_interval
                    .min(super::heartbeat::MAX_HEARTBEAT_INTERVAL),
            ),
            paused: std::sync::atomic::AtomicBool::new(false),
            resumed: tokio::sync::Notify::new(),
            store: self.store,
            publisher: self.publisher,
            handle: self.handle.unwrap_or_default(),
            settings: self.settings,
            solo: tokio::sync::RwLock::new(()),
            busy: std::sync::atomic::AtomicUsize::new(0),
            batch_done: tokio::sync::Notify::new(),
            empty_claim_done: tokio::sync::Notify::new(),
            empty_claims: std::sync::atomic::AtomicU64::new(0),
            breakers: super::breaker::Breakers::default(),
        })
    }
}

/// `<host>-<pid>-<4 random hex digits>`: unique for relays of one process too.
fn default_name() -> String {
    let random = uuid::Uuid::now_v7().as_u128() & 0xffff;
    format!(
        "{}-{}-{random:04x}",
        crate::store::host_name(),
        std::process::id()
    )
}
