//! [`run_until`]: run a relay on the in-memory store until the store
//! reaches a state, then stop it.

use std::time::Duration;

use crate::{OutboxRecord, Publisher, Relay};

use super::InMemoryStore;

/// How long [`run_until`] waits (tokio time) for the state.
const LIMIT: Duration = Duration::from_secs(600);

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
    handle.shutdown();
    task.await.map_err(RunUntil::Task)?;
    if !reached {
        return Err(RunUntil::NotReached {
            records: store.records(),
        });
    }
    match store.claimed() {
        0 => Ok(()),
        claimed => Err(RunUntil::LeftClaimed(claimed)),
    }
}
