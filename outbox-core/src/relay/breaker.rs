//! Circuit breakers per destination for messages the broker does not
//! confirm.
//!
//! A broker never answers a bad message with silence, so an unconfirmed
//! message is never its own fault: most often one queue behind that
//! destination is stuck (a quorum queue without a majority, a queue on a
//! hung node). Its events are released with a capped backoff that grows
//! with each further unconfirmed publish there, and while the breaker is
//! open the relay holds the destination's events back without sending
//! them, so the other destinations keep flowing without waiting out a
//! confirm timeout in every batch. The first confirm for the destination
//! closes the breaker.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use chrono::{DateTime, Utc};

use crate::RetryPolicy;

#[derive(Debug, Default)]
pub(crate) struct Breakers {
    open: Mutex<HashMap<String, Breaker>>,
}

#[derive(Debug)]
struct Breaker {
    /// Unconfirmed publishes in a row.
    failures: u32,
    open_until: DateTime<Utc>,
}

impl Breakers {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Breaker>> {
        // Each update is a single insert or remove: a panic cannot leave
        // the map half-changed.
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// When the breaker of `destination` closes again, if it is open now.
    pub(crate) fn open_until(
        &self,
        destination: &str,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        self.lock()
            .get(destination)
            .map(|b| b.open_until)
            .filter(|until| *until > now)
    }

    /// Notes an unconfirmed publish to `destination` and opens its breaker
    /// for the next delay of `retry`'s capped exponential backoff (half of
    /// it fixed, half jittered); returns until when.
    pub(crate) fn trip(
        &self,
        destination: &str,
        retry: &RetryPolicy,
        now: DateTime<Utc>,
    ) -> DateTime<Utc> {
        let mut open = self.lock();
        let breaker = open.entry(destination.to_owned()).or_insert(Breaker {
            failures: 0,
            open_until: now,
        });
        breaker.failures = breaker.failures.saturating_add(1);
        let delay = retry.ceiling(breaker.failures) / 2 + retry.delay(breaker.failures) / 2;
        let delay = chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
        breaker.open_until = now
            .checked_add_signed(delay)
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        breaker.open_until
    }

    /// `destination` confirmed a message: closes its breaker.
    pub(crate) fn confirmed(&self, destination: &str) {
        let mut open = self.lock();
        if !open.is_empty() {
            open.remove(destination);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_backoff_grows_is_capped_and_a_confirm_resets_it() {
        let retry = RetryPolicy::default()
            .base_delay(Duration::from_secs(1))
            .max_delay(Duration::from_secs(8))
            .deterministic();
        let breakers = Breakers::default();
        let now = Utc::now();
        let secs = |until: DateTime<Utc>| (until - now).num_seconds();
        assert_eq!(breakers.open_until("x", now), None);
        assert_eq!(secs(breakers.trip("x", &retry, now)), 1);
        assert_eq!(secs(breakers.trip("x", &retry, now)), 2);
        assert_eq!(secs(breakers.trip("x", &retry, now)), 4);
        for _ in 0..10 {
            breakers.trip("x", &retry, now);
        }
        assert_eq!(secs(breakers.open_until("x", now).unwrap()), 8, "capped");
        assert_eq!(breakers.open_until("y", now), None, "per destination");
        breakers.confirmed("x");
        assert_eq!(breakers.open_until("x", now), None);
        assert_eq!(secs(breakers.trip("x", &retry, now)), 1, "reset");
    }
}
