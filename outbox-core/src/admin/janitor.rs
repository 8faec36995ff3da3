//! [`Janitor`]: scheduled retention of sent events, inbox entries and
//! stale relay registrations.

use std::time::Duration;

use chrono::Utc;
use tokio::time::Instant;

use super::OutboxAdmin;
use crate::RelayHandle;
use crate::relay::metric_names;

/// Purges on a schedule what an outbox no longer needs: `sent` and
/// `skipped` events older than [`sent_retention`](Self::sent_retention)
/// (with their attempt history), inbox entries older than
/// [`inbox_retention`](Self::inbox_retention) (and the records of consumer
/// dead letters replayed or purged that long ago; open ones are kept), and
/// registrations of relays silent for a day. `dead` events are never purged: they wait for an
/// operator.
///
/// | setting | default |
/// |---|---|
/// | [`sent_retention`](Self::sent_retention) | 7 days |
/// | [`inbox_retention`](Self::inbox_retention) | 14 days |
/// | [`interval`](Self::interval) | 5 min |
/// | [`chunk_size`](Self::chunk_size) | 1,000 rows per transaction |
/// | [`chunk_pause`](Self::chunk_pause) | 100 ms between chunks |
///
/// Each chunk is one short transaction that deletes at most `chunk_size`
/// rows, paged by `seq` (a run never rescans what it passed), with a pause
/// between chunks, so the janitor never holds locks for long nor floods the
/// WAL. Rows another transaction holds are skipped (`SKIP LOCKED`), so
/// several janitors (one per relay process) are harmless: they share the
/// work, no lock or leader needed (session advisory locks would not survive
/// a transaction-pooling PgBouncer).
///
/// # Inbox retention
/// A consumer drops a duplicate only while its inbox holds the event's id,
/// so keep inbox entries at least as long as a duplicate can arrive: the
/// broker's redelivery window (a message unacked when a consumer dies is
/// redelivered; a relay crash between publish and mark republishes), plus
/// the consumer's retry window (its retries with backoff), plus the replay
/// window (how long after the fact an operator may replay dead events,
/// which keep their ids). The default 14 days covers a 7-day sent
/// retention with room to spare; [`Admin::replay`](super::Admin::replay)
/// warns when it replays events older than its dedup window.
///
/// ```no_run
/// # async fn run(store: outbox_core::testing::InMemoryStore, relay: outbox_core::RelayHandle) {
/// use std::time::Duration;
/// use outbox_core::admin::Janitor;
///
/// let janitor = Janitor::new(store).sent_retention(Duration::from_secs(3 * 24 * 3600));
/// // Beside the relay, until the relay's handle is shut down.
/// tokio::spawn(janitor.run(relay));
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct Janitor<S> {
    store: S,
    sent_retention: Option<Duration>,
    inbox_retention: Option<Duration>,
    interval: Duration,
    chunk_size: usize,
    chunk_pause: Duration,
    stale_relays: Duration,
}

/// What one run of the [`Janitor`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct JanitorReport {
    /// `sent` and `skipped` events.
    pub sent: u64,
    /// Inbox entries.
    pub inbox: u64,
    /// Stale relay registrations.
    pub relays: u64,
    /// Records of consumer dead letters replayed or purged before the inbox
    /// retention.
    pub dead_letters: u64,
}

impl<S: OutboxAdmin> Janitor<S> {
    /// A janitor with the defaults above.
    pub fn new(store: S) -> Self {
        Janitor {
            store,
            sent_retention: Some(Duration::from_secs(7 * 24 * 3600)),
            inbox_retention: Some(Duration::from_secs(14 * 24 * 3600)),
            interval: Duration::from_secs(300),
            chunk_size: 1_000,
            chunk_pause: Duration::from_millis(100),
            stale_relays: Duration::from_secs(24 * 3600),
        }
    }

    /// Keep sent events this long (`None`: forever). Default 7 days.
    pub fn sent_retention(mut self, keep: impl Into<Option<Duration>>) -> Self {
        self.sent_retention = keep.into();
        self
    }

    /// Keep inbox entries this long (`None`: forever). Default 14 days; see
    /// the type docs for the rule.
    pub fn inbox_retention(mut self, keep: impl Into<Option<Duration>>) -> Self {
        self.inbox_retention = keep.into();
        self
    }

    /// Time between runs. Default 5 minutes.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(10));
        self
    }

    /// Rows deleted per transaction (at least 1). Default 1,000.
    pub fn chunk_size(mut self, n: usize) -> Self {
        self.chunk_size = n.max(1);
        self
    }

    /// Pause between chunks. Default 100 ms.
    pub fn chunk_pause(mut self, pause: Duration) -> Self {
        self.chunk_pause = pause;
        self
    }

    /// One run: purges what is past its retention, chunk by chunk.
    ///
    /// # Errors
    /// The store's error; what earlier chunks deleted stays deleted.
    pub async fn run_once(&self) -> Result<JanitorReport, S::Error> {
        let mut report = JanitorReport::default();
        if let Some(keep) = self.sent_retention {
            // A retention reaching before the calendar's start keeps all.
            let before = super::service::ago(keep).unwrap_or(chrono::DateTime::<Utc>::MIN_UTC);
            let mut after = None;
            loop {
                let chunk = self
                    .store
                    .purge_sent_chunk(before, after, self.chunk_size, None)
                    .await?;
                report.sent += chunk.changed;
                match chunk.last {
                    Some(last) => after = Some(last),
                    None => break,
                }
                self.pause().await;
            }
        }
        if let Some(keep) = self.inbox_retention {
            let before = super::service::ago(keep).unwrap_or(chrono::DateTime::<Utc>::MIN_UTC);
            loop {
                let n = self
                    .store
                    .purge_inbox_chunk(before, self.chunk_size, None)
                    .await?;
                report.inbox += n;
                if n < self.chunk_size as u64 {
                    break;
                }
                self.pause().await;
            }
            // What the records of settled dead letters serve (what was
            // replayed or purged, when) is as old as the inbox's memory.
            loop {
                let n = self
                    .store
                    .purge_dead_letter_records_chunk(before, self.chunk_size)
                    .await?;
                report.dead_letters += n;
                if n < self.chunk_size as u64 {
                    break;
                }
                self.pause().await;
            }
        }
        let stale =
            super::service::ago(self.stale_relays).unwrap_or(chrono::DateTime::<Utc>::MIN_UTC);
        report.relays = self.store.purge_stale_relays(stale).await?;
        ::metrics::counter!(metric_names::PURGED_TOTAL, "table" => "outbox_events")
            .increment(report.sent);
        ::metrics::counter!(metric_names::PURGED_TOTAL, "table" => "inbox_events")
            .increment(report.inbox);
        Ok(report)
    }

    /// Runs every [`interval`](Self::interval) until `relay` is shut down,
    /// the first time after a random part of it (at most 30 s), so that the
    /// janitors of a fleet deployed at once do not all start together.
    /// Errors are logged and the next run tries again.
    pub async fn run(self, relay: RelayHandle) {
        let first = self.interval.min(Duration::from_secs(30));
        // A v7 id ends in 62 random bits.
        let random = (uuid::Uuid::now_v7().as_u128() % 1_000) as u32;
        let mut next = Instant::now() + first * random / 1_000;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = relay.shutdown_requested() => return,
            }
            let started = Instant::now();
            tokio::select! {
                result = self.run_once() => match result {
                    Ok(report) if report != JanitorReport::default() => tracing::info!(
                        sent = report.sent,
                        inbox = report.inbox,
                        relays = report.relays,
                        dead_letters = report.dead_letters,
                        took_ms = started.elapsed().as_millis() as u64,
                        "outbox janitor: purged"
                    ),
                    Ok(_) => {}
                    Err(error) => {
                        ::metrics::counter!(metric_names::STORE_ERRORS_TOTAL).increment(1);
                        tracing::warn!(%error, "outbox janitor: purge failed; trying again next run");
                    }
                },
                () = relay.shutdown_requested() => return,
            }
            next = Instant::now() + self.interval;
        }
    }

    async fn pause(&self) {
        if !self.chunk_pause.is_zero() {
            tokio::time::sleep(self.chunk_pause).await;
        }
    }
}
