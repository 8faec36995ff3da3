//! [`run_until`]: run a relay on the in-memory store until the store
//! reaches a state, then stop it; [`wakeup_driven`]: a relay that claims
//! only when woken.

use std::time::Duration;

use crate::{OutboxRecord, OutboxStore, Publisher, Relay, RelayBuilder};

use super::InMemoryStore;

/// How long [`run_until`] waits (tokio time) for the state.
const LIMIT: Duration = Duration::from_secs(600);

/// How long [`run_until`] waits (tokio time) for the relay to stop.
const STOP_LIMIT: Duration = Duration::from_secs(60);

/// Why [`run_until`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunUntil {
    /// The store did not reach the state within 600 s (tokio time); the
    /// relay was stopped.
    #[error("relay did not reach the expected state: {records:?}")]
    NotReached {
        /// Every record, as the relay left them.
        records: Vec<OutboxRecord>,
    },
    /// The relay did not stop within 60 s (tokio time) of its shutdown;
    /// its task was aborted.
    #[error("the relay did not stop within 60 s of its shutdown")]
    DidNotStop,
    /// The relay's task panicked or was cancelled.
    #[error("the relay's task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
    /// Once stopped, the relay left events claimed.
    #[error("relay left {0} events claimed after shutdown")]
    LeftClaimed(usize),
}

/// Runs `relay` (on `store`) until `done` holds for the store, checked
/// every 5 ms of tokio time (so a test with a paused clock runs it at
/// once), then shuts it down, waits for it and checks that it left nothing
/// claimed.
///
/// ```
/// use outbox_core::testing::{InMemoryStore, RecordingPublisher, TestEvent, run_until};
/// use outbox_core::{EventStatus, Relay};
///
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let store = InMemoryStore::new();
/// let id = store.record(&TestEvent::new("a")).unwrap();
/// let relay = Relay::builder(store.clone(), RecordingPublisher::new())
///     .build()
///     .unwrap();
/// run_until(relay, &store, |s| s.get(id).unwrap().status == EventStatus::Sent)
///     .await
///     .unwrap();
/// # });
/// ```
///
/// # Errors
/// [`RunUntil`]: the state was not reached, the relay's task failed, or
/// it left events claimed.
pub async fn run_until<P: Publisher>(
    relay: Relay<InMemoryStore, P>,
    store: &InMemoryStore,
    done: impl Fn(&InMemoryStore) -> bool,
) -> Result<(), RunUntil> {
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    let deadline = tokio::time::Instant::now() + LIMIT;
    let mut reached = done(store);
    while !reached && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
        reached = done(store);
    }
    // What the relay had done at the deadline, before it stops.
    let at_deadline = (!reached).then(|| store.records());
    handle.shutdown();
    let mut task = task;
    match tokio::time::timeout(STOP_LIMIT, &mut task).await {
        Ok(joined) => joined.map_err(RunUntil::Task)?,
        Err(_) => {
            task.abort();
            return Err(RunUntil::DidNotStop);
        }
    }
    if let Some(records) = at_deadline {
        return Err(RunUntil::NotReached { records });
    }
    match store.claimed() {
        0 => Ok(()),
        claimed => Err(RunUntil::LeftClaimed(claimed)),
    }
}

/// A relay builder whose polling and stats are an hour away, so that in a
/// test only wakeups make it claim (a store's wakeup stream, a `NOTIFY`,
/// [`RelayHandle::notify`](crate::RelayHandle::notify)) and one that does
/// not come shows as a missing publish, not a late one.
///
/// ```
/// use outbox_core::testing::{InMemoryStore, RecordingPublisher, wakeup_driven};
///
/// let relay = wakeup_driven(InMemoryStore::new(), RecordingPublisher::new())
///     .concurrency(1)
///     .build()
///     .unwrap();
/// # drop(relay);
/// ```
pub fn wakeup_driven<S: OutboxStore, P: Publisher>(store: S, publisher: P) -> RelayBuilder<S, P> {
    const HOUR: Duration = Duration::from_secs(3600);
    Relay::builder(store, publisher)
        .poll_interval(HOUR)
        .stats_interval(HOUR)
}
