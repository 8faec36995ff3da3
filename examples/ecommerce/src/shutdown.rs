//! Graceful shutdown: one signal every component waits on, triggered by
//! Ctrl-C, `SIGTERM`, or a component that failed.

use std::sync::Arc;

use tokio::sync::watch;

/// A cloneable shutdown signal.
#[derive(Debug, Clone)]
pub struct Shutdown {
    sender: Arc<watch::Sender<bool>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Self::new()
    }
}

impl Shutdown {
    /// A signal not yet triggered.
    pub fn new() -> Self {
        Shutdown {
            sender: Arc::new(watch::channel(false).0),
        }
    }

    /// Triggers it (idempotent).
    pub fn trigger(&self) {
        self.sender.send_replace(true);
    }

    /// `true` once triggered.
    pub fn is_triggered(&self) -> bool {
        *self.sender.borrow()
    }

    /// Completes once triggered.
    pub async fn wait(&self) {
        let mut receiver = self.sender.subscribe();
        // The sender lives in `self`, so `wait_for` cannot fail here.
        let _ = receiver.wait_for(|triggered| *triggered).await;
    }

    /// [`wait`](Self::wait) as an owned future (for `'static` APIs such as
    /// axum's `with_graceful_shutdown`).
    pub fn wait_owned(&self) -> impl Future<Output = ()> + Send + 'static {
        let this = self.clone();
        async move { this.wait().await }
    }

    /// Triggers it on Ctrl-C (`SIGINT`) or `SIGTERM`, from a background task.
    pub fn trigger_on_signals(&self) {
        let this = self.clone();
        tokio::spawn(async move {
            let signal = wait_for_signal().await;
            tracing::info!(signal, "shutting down gracefully");
            this.trigger();
        });
    }
}

#[cfg(unix)]
async fn wait_for_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(terminate) => terminate,
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGTERM; Ctrl-C only");
            return ctrl_c().await;
        }
    };
    tokio::select! {
        name = ctrl_c() => name,
        _ = terminate.recv() => "SIGTERM",
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() -> &'static str {
    ctrl_c().await
}

async fn ctrl_c() -> &'static str {
    if let Err(error) = tokio::signal::ctrl_c().await {
        tracing::warn!(%error, "cannot listen for Ctrl-C");
        std::future::pending::<()>().await;
    }
    "SIGINT"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_clone_sees_the_trigger() {
        let shutdown = Shutdown::new();
        let waiter = tokio::spawn(shutdown.wait_owned());
        assert!(!shutdown.is_triggered());
        shutdown.clone().trigger();
        waiter.await.unwrap();
        assert!(shutdown.is_triggered());
        shutdown.wait().await; // completes at once after the trigger
    }
}
