//! The relay in the store's registry: registration, heartbeats, and what
//! they (or a claim) say of an operator's pause.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::{info, warn};

use super::Relay;
use super::metric_names;
use crate::{OutboxStore, Publisher};

impl<S: OutboxStore, P: Publisher> Relay<S, P> {
    /// Heartbeats every [`heartbeat_interval`](crate::RelayRegistration)
    /// (the stats interval, at most 5 s), each bounded, apart from the stats
    /// (which may be slow on a big table): a resume takes effect within one
    /// interval (a pause at the next claim, see
    /// [`OutboxStore::claim_for`]), and a busy relay never looks dead.
    pub(super) async fn heartbeat_loop(&self, mut registered: bool) {
        let interval = self.registration.heartbeat_interval;
        loop {
            tokio::select! {
                () = tokio::time::sleep(interval) => {}
                () = self.handle.shutdown_requested() => return,
            }
            if tokio::time::timeout(HEARTBEAT_TIMEOUT, self.heartbeat(&mut registered))
                .await
                .is_err()
            {
                ::metrics::counter!(metric_names::STORE_ERRORS_TOTAL).increment(1);
                warn!(
                    relay = %self.registration.name,
                    timeout = ?HEARTBEAT_TIMEOUT,
                    "outbox relay: heartbeat timed out"
                );
            }
        }
    }

    /// Registers the relay (until that succeeds), then records it alive and
    /// reads whether an operator paused it.
    pub(super) async fn heartbeat(&self, registered: &mut bool) {
        let name = &self.registration.name;
        if !*registered {
            match self.store.register_relay(&self.registration).await {
                Ok(()) => *registered = true,
                Err(err) => {
                    ::metrics::counter!(metric_names::STORE_ERRORS_TOTAL).increment(1);
                    warn!(error = %err, relay = %name, "outbox relay: registering failed");
                    return;
                }
            }
        }
        let in_flight = u32::try_from(self.busy.load(Ordering::SeqCst)).unwrap_or(u32::MAX);
        match self.store.heartbeat(name, in_flight).await {
            Ok(control) => self.operator_paused(control.paused),
            Err(err) => {
                ::metrics::counter!(metric_names::STORE_ERRORS_TOTAL).increment(1);
                warn!(error = %err, relay = %name, "outbox relay: heartbeat failed");
            }
        }
    }

    /// Records what the store said of an operator's pause: a claim that
    /// found the relay paused, or a heartbeat (the only way back to
    /// running: a resumed relay's loops wait for it, so a resume takes
    /// effect within one heartbeat interval).
    pub(super) fn operator_paused(&self, paused: bool) {
        let name = &self.registration.name;
        let was = self.paused.swap(paused, Ordering::SeqCst);
        ::metrics::gauge!(metric_names::OPERATOR_PAUSED).set(u8::from(paused));
        if was != paused {
            if paused {
                warn!(relay = %name, "outbox relay: paused by an operator; claiming nothing until resumed");
            } else {
                info!(relay = %name, "outbox relay: resumed by an operator");
                self.resumed.notify_waiters();
            }
        }
    }
}

/// How long a heartbeat (with the registration) may take; a starting relay
/// waits at most this long for its first before claiming.
pub(super) const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest time between two heartbeats.
pub(super) const MAX_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);
