//! [`Backoff`]: capped exponential delays with jitter, for loops that
//! reconnect or retry (the relay's pauses, the PostgreSQL `LISTEN` loop, the
//! inbox consumer's reconnects).

use std::hash::{BuildHasher as _, RandomState};
use std::time::Duration;

/// Capped exponential delays with jitter on top: each delay is the current
/// step plus a random part of up to half a step, so processes that lost the
/// same server at the same moment (every relay after a broker restart) do
/// not all come back in the same instant, and none waits less than its
/// step. The step doubles after each delay up to `max`, and no delay is
/// longer than `max` (at the cap the jitter is gone, but by then the
/// earlier jittered delays have spread the processes apart; with `min ==
/// max` there is no jitter at all); [`reset`](Self::reset) after a
/// success.
///
/// ```
/// use std::time::Duration;
/// use outbox_core::Backoff;
///
/// let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
/// let first = backoff.next_delay();
/// assert!(first >= Duration::from_millis(100) && first <= Duration::from_millis(150));
/// let second = backoff.next_delay();
/// assert!(second >= Duration::from_millis(200) && second <= Duration::from_millis(300));
/// backoff.reset();
/// assert!(backoff.next_delay() <= Duration::from_millis(150));
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    step: Duration,
    jitter: bool,
    draws: u64,
}

impl Backoff {
    /// Steps from `min` doubling up to `max` (`max` below `min` is taken as
    /// `min`).
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min,
            max: max.max(min),
            step: min,
            jitter: true,
            draws: 0,
        }
    }

    /// Without jitter: each delay is exactly the step (for tests).
    #[must_use]
    pub fn deterministic(mut self) -> Self {
        self.jitter = false;
        self
    }

    /// The next delay (in `[step, min(1.5 × step, max)]`), then doubles
    /// the step.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = step.saturating_mul(2).min(self.max);
        if !self.jitter || step.is_zero() {
            return step;
        }
        let spread = u64::try_from((step / 2).as_nanos()).unwrap_or(u64::MAX);
        // std's RandomState is seeded randomly per instance: enough entropy
        // for jitter without a dependency on an RNG crate.
        self.draws = self.draws.wrapping_add(1);
        let random = RandomState::new().hash_one(self.draws);
        step.saturating_add(Duration::from_nanos(random % spread.saturating_add(1)))
            .min(self.max)
    }

    /// Back to the first step (after a success).
    pub fn reset(&mut self) {
        self.step = self.min;
    }

    /// The step the next delay is drawn from.
    pub fn step(&self) -> Duration {
        self.step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn steps_double_up_to_the_cap_and_reset() {
        let mut b = Backoff::new(100 * MS, 350 * MS).deterministic();
        let delays: Vec<Duration> = (0..4).map(|_| b.next_delay()).collect();
        assert_eq!(delays, [100 * MS, 200 * MS, 350 * MS, 350 * MS]);
        b.reset();
        assert_eq!(b.next_delay(), 100 * MS);
    }

    #[test]
    fn jittered_delays_add_up_to_half_a_step_and_spread() {
        let delays: Vec<Duration> = (0..64)
            .map(|_| Backoff::new(1000 * MS, 10_000 * MS).next_delay())
            .collect();
        assert!(delays.iter().all(|d| *d >= 1000 * MS && *d <= 1500 * MS));
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(distinct.len() > 32, "relays must not come back in lockstep");
    }

    #[test]
    fn no_delay_is_longer_than_max() {
        let mut b = Backoff::new(700 * MS, 1000 * MS);
        for _ in 0..64 {
            let d = b.next_delay();
            assert!(d >= 700 * MS && d <= 1000 * MS, "{d:?}");
        }
    }

    #[test]
    fn a_max_below_min_is_min() {
        let mut b = Backoff::new(100 * MS, 10 * MS).deterministic();
        assert_eq!((b.next_delay(), b.next_delay()), (100 * MS, 100 * MS));
    }
}
