//! The relay-wide pause after a lost broker connection, on the crate's
//! jittered [`Backoff`] (as store errors are): relays that lost the same
//! broker do not all come back in the same instant.

use std::time::Duration;

use crate::Backoff;

/// The relay-wide pause after a lost broker connection, shared by its loops:
/// exponential, reset by the next batch that reaches the broker.
#[derive(Debug)]
pub(super) struct Pause {
    state: std::sync::Mutex<(Backoff, Option<tokio::time::Instant>)>,
}

impl Pause {
    pub(super) fn new(min: Duration, max: Duration) -> Self {
        Pause {
            state: std::sync::Mutex::new((Backoff::new(min, max), None)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Backoff, Option<tokio::time::Instant>)> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts (or extends) a pause; returns its length.
    pub(super) fn start(&self) -> Duration {
        let mut state = self.lock();
        let delay = state.0.next_delay();
        let until = tokio::time::Instant::now() + delay;
        state.1 = Some(state.1.map_or(until, |u| u.max(until)));
        delay
    }

    /// The end of the pause in force, if any.
    pub(super) fn until(&self) -> Option<tokio::time::Instant> {
        let state = self.lock();
        state.1.filter(|u| *u > tokio::time::Instant::now())
    }

    pub(super) fn reset(&self) {
        let mut state = self.lock();
        state.0.reset();
        state.1 = None;
    }
}
