//! The relay-wide pause after a lost broker connection, and the
//! exponential backoff behind it and behind store errors.

use std::time::Duration;

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

/// Exponential backoff for pauses (broker connection lost, store errors).
#[derive(Debug)]
pub(super) struct Backoff {
    min: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    pub(super) fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max,
            current: min,
        }
    }

    pub(super) fn next_delay(&mut self) -> Duration {
        let delay = self.current;
        self.current = (self.current * 2).min(self.max);
        delay
    }

    pub(super) fn reset(&mut self) {
        self.current = self.min;
    }
}
