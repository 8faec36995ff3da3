//! [`RelayHandle`]: wake a relay after a commit, or stop it.

use std::sync::Arc;

use tokio::sync::{Notify, watch};

/// A cheap, cloneable handle to a running [`Relay`](crate::Relay).
///
/// - [`notify`](Self::notify) after committing events so the relay publishes
///   them now instead of at its next poll (the Axum layer does this for you);
/// - [`shutdown`](Self::shutdown) to stop it gracefully: the batch in flight is
///   published and marked (or, past the grace period, released), then
///   [`Relay::run`](crate::Relay::run) returns.
///
/// A handle can be created before the relay (and given to it with
/// [`RelayBuilder::handle`](crate::RelayBuilder::handle)), so request handlers
/// and the relay can be wired in any order.
#[derive(Clone, Debug)]
pub struct RelayHandle {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    wake: Notify,
    shutdown: watch::Sender<bool>,
}

impl Default for RelayHandle {
    fn default() -> Self {
        Self::new()
    }
}

impl RelayHandle {
    /// A new handle, not yet attached to a relay.
    pub fn new() -> Self {
        RelayHandle {
            shared: Arc::new(Shared {
                wake: Notify::new(),
                shutdown: watch::channel(false).0,
            }),
        }
    }

    /// Tells the relay that events were committed. Cheap and never blocks; a
    /// notification sent while the relay is busy is kept (once) for its next wait.
    pub fn notify(&self) {
        self.shared.wake.notify_one();
    }

    /// Asks the relay to stop gracefully. Idempotent.
    pub fn shutdown(&self) {
        self.shared.shutdown.send_replace(true);
    }

    /// `true` once [`shutdown`](Self::shutdown) was called.
    pub fn is_shutdown(&self) -> bool {
        *self.shared.shutdown.borrow()
    }

    /// Completes when [`notify`](Self::notify) is called (or was called since
    /// the last wait).
    pub(crate) async fn notified(&self) {
        self.shared.wake.notified().await;
    }

    /// Completes once shutdown is requested.
    pub(crate) async fn shutdown_requested(&self) {
        let mut rx = self.shared.shutdown.subscribe();
        // The sender lives in `self.shared`, so `wait_for` cannot fail here.
        let _ = rx.wait_for(|stop| *stop).await;
    }
}
