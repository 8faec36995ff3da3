//! [`RetryPolicy`]: exponential backoff with full jitter for failed publishes.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::Error;

/// What happens to an event after a failed publish attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextStep {
    /// Try again, not before this time.
    RetryAt(DateTime<Utc>),
    /// No attempts left: park the event as `Dead` for an operator.
    Dead,
}

/// How failed publishes are retried.
///
/// After the n-th failed attempt (n starting at 1) the event waits a random
/// delay in `[0, min(max_delay, base_delay × 2^(n-1))]` ("full jitter", which
/// spreads retries of many events that failed together), and becomes `Dead`
/// once it has failed `max_attempts` times.
///
/// Only per-message failures (nack, unroutable, confirm timeout, a message the
/// broker refuses) spend attempts; a lost broker connection pauses the relay
/// without spending any.
///
/// | setting | default |
/// |---|---|
/// | [`base_delay`](Self::base_delay) | 1 s |
/// | [`max_delay`](Self::max_delay) | 5 min |
/// | [`max_attempts`](Self::max_attempts) | 10 |
/// | jitter | full (turn off with [`deterministic`](Self::deterministic)) |
///
/// ```
/// use std::time::Duration;
/// use outbox_core::RetryPolicy;
///
/// let policy = RetryPolicy::default()
///     .base_delay(Duration::from_millis(100))
///     .max_delay(Duration::from_secs(10))
///     .deterministic();
/// assert_eq!(policy.delay(1), Duration::from_millis(100));
/// assert_eq!(policy.delay(3), Duration::from_millis(400));
/// assert_eq!(policy.delay(30), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    base_delay: Duration,
    max_delay: Duration,
    max_attempts: u32,
    jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(300),
            max_attempts: 10,
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// Delay after the first failure, doubled after each further one. Default 1 s.
    #[must_use]
    pub fn base_delay(mut self, delay: Duration) -> Self {
        self.base_delay = delay;
        self
    }

    /// Upper bound of any delay. Default 5 minutes.
    #[must_use]
    pub fn max_delay(mut self, delay: Duration) -> Self {
        self.max_delay = delay;
        self
    }

    /// Failed attempts after which an event is `Dead`. Default 10; 1 means
    /// "never retry".
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// Turns jitter off: the delay is exactly `min(max_delay, base × 2^(n-1))`.
    /// Meant for tests that need reproducible schedules.
    #[must_use]
    pub fn deterministic(mut self) -> Self {
        self.jitter = false;
        self
    }

    /// The configured maximum number of attempts.
    pub fn attempts_limit(&self) -> u32 {
        self.max_attempts
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`Error::Config`] if `max_attempts` is 0 or `max_delay < base_delay`.
    pub fn validate(&self) -> Result<(), Error> {
        if self.max_attempts == 0 {
            return Err(Error::Config(
                "RetryPolicy::max_attempts must be at least 1".into(),
            ));
        }
        if self.max_delay < self.base_delay {
            return Err(Error::Config(format!(
                "RetryPolicy::max_delay ({:?}) must not be below base_delay ({:?})",
                self.max_delay, self.base_delay
            )));
        }
        Ok(())
    }

    /// The upper bound of the delay after the `attempt`-th failure (1-based).
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(63);
        let factor = 1u64 << exponent;
        let nanos = (self.base_delay.as_nanos()).saturating_mul(u128::from(factor));
        let cap = self.max_delay.as_nanos();
        Duration::from_nanos(u64::try_from(nanos.min(cap)).unwrap_or(u64::MAX))
    }

    /// The delay after the `attempt`-th failure (1-based): uniformly random in
    /// `[0, ceiling(attempt)]`, or exactly the ceiling when deterministic.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        if !self.jitter || ceiling.is_zero() {
            return ceiling;
        }
        // std's RandomState is seeded randomly per instance: enough entropy for
        // jitter without a dependency on an RNG crate.
        let random = RandomState::new().hash_one(attempt);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(random % nanos.saturating_add(1))
    }

    /// What follows a failed attempt, given the attempts spent so far including
    /// this one.
    pub fn next_step(&self, attempts: u32, now: DateTime<Utc>) -> NextStep {
        if attempts >= self.max_attempts {
            return NextStep::Dead;
        }
        let delay =
            chrono::Duration::from_std(self.delay(attempts)).unwrap_or(chrono::Duration::MAX);
        NextStep::RetryAt(
            now.checked_add_signed(delay)
                .unwrap_or(DateTime::<Utc>::MAX_UTC),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_documented_ones() {
        let p = RetryPolicy::default();
        assert_eq!(p.base_delay, Duration::from_secs(1));
        assert_eq!(p.max_delay, Duration::from_secs(300));
        assert_eq!(p.max_attempts, 10);
        assert!(p.jitter);
        p.validate().unwrap();
    }

    #[test]
    fn ceiling_doubles_and_caps_without_overflow() {
        let p = RetryPolicy::default().deterministic();
        let got: Vec<u64> = (1..=10).map(|n| p.delay(n).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]);
        assert_eq!(p.delay(u32::MAX), Duration::from_secs(300));
        assert_eq!(p.delay(0), Duration::from_secs(1));
    }

    #[test]
    fn jitter_stays_within_the_ceiling_and_varies() {
        let p = RetryPolicy::default();
        let delays: Vec<Duration> = (0..200).map(|_| p.delay(4)).collect();
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(8)));
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 100, "jitter should spread delays");
        let mean = delays.iter().sum::<Duration>() / 200;
        assert!(
            mean > Duration::from_secs(2) && mean < Duration::from_secs(6),
            "{mean:?}"
        );
    }

    #[test]
    fn dead_exactly_at_the_limit() {
        let p = RetryPolicy::default().max_attempts(3).deterministic();
        let now = Utc::now();
        assert_eq!(
            p.next_step(1, now),
            NextStep::RetryAt(now + chrono::Duration::seconds(1))
        );
        assert_eq!(
            p.next_step(2, now),
            NextStep::RetryAt(now + chrono::Duration::seconds(2))
        );
        assert_eq!(p.next_step(3, now), NextStep::Dead);
        assert_eq!(
            RetryPolicy::default().max_attempts(1).next_step(1, now),
            NextStep::Dead
        );
    }

    #[test]
    fn invalid_settings_are_rejected() {
        assert!(RetryPolicy::default().max_attempts(0).validate().is_err());
        assert!(
            RetryPolicy::default()
                .base_delay(Duration::from_secs(10))
                .max_delay(Duration::from_secs(1))
                .validate()
                .is_err()
        );
    }
}
