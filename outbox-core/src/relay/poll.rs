//! The fixed-rate poll times of the relay's loops, spread evenly over the
//! poll interval.

use std::time::Duration;

use super::Relay;
use crate::{OutboxStore, Publisher};

impl<S: OutboxStore, P: Publisher> Relay<S, P> {
    /// The polls of loop `i`: every `poll_interval`, shifted by `i` /
    /// `concurrency` of it, so that the loops' polls are spread evenly (an
    /// event committed without a wakeup waits at most `poll_interval` /
    /// `concurrency` for one) and keep a fixed rate however long claims take.
    pub(super) fn poll_grid(&self, started: tokio::time::Instant, i: usize) -> PollGrid {
        let loops = u32::try_from(self.settings.concurrency.max(1)).unwrap_or(u32::MAX);
        let i = u32::try_from(i).unwrap_or(0);
        PollGrid {
            origin: started
                .checked_add(self.settings.poll_interval / loops * i)
                .unwrap_or_else(|| started + FAR_FUTURE),
            interval: self.settings.poll_interval,
        }
    }
}

/// Stands in for "never" in poll times (a year).
const FAR_FUTURE: Duration = Duration::from_secs(365 * 24 * 3600);

/// Fixed-rate poll times of one relay loop: `origin + k × interval`.
#[derive(Debug, Clone, Copy)]
pub(super) struct PollGrid {
    origin: tokio::time::Instant,
    interval: Duration,
}

impl PollGrid {
    /// The first poll time strictly after `now`.
    pub(super) fn next_after(self, now: tokio::time::Instant) -> tokio::time::Instant {
        if now < self.origin {
            return self.origin;
        }
        let interval = self.interval.as_nanos().max(1);
        let elapsed = (now - self.origin).as_nanos();
        let k = elapsed / interval + 1;
        let offset = u64::try_from(k.saturating_mul(interval)).unwrap_or(u64::MAX);
        // A huge interval (polling off in effect) must not overflow.
        self.origin
            .checked_add(Duration::from_nanos(offset))
            .unwrap_or_else(|| now + FAR_FUTURE)
    }
}

#[cfg(test)]
mod poll_grid_tests {
    use super::*;

    #[tokio::test]
    async fn polls_keep_a_fixed_rate_and_loops_are_spread_evenly() {
        let origin = tokio::time::Instant::now();
        let grid = PollGrid {
            origin,
            interval: Duration::from_millis(1000),
        };
        let at = |ms: u64| origin + Duration::from_millis(ms);
        assert_eq!(grid.next_after(at(0)), at(1000));
        assert_eq!(grid.next_after(at(999)), at(1000));
        assert_eq!(grid.next_after(at(1000)), at(2000), "strictly after");
        // A claim that took 300 ms does not push the next poll back.
        assert_eq!(grid.next_after(at(1300)), at(2000));
        let second = PollGrid {
            origin: at(500),
            ..grid
        };
        assert_eq!(second.next_after(at(0)), at(500));
        assert_eq!(second.next_after(at(1000)), at(1500));
        // Polling effectively off: no overflow.
        let never = PollGrid {
            origin,
            interval: Duration::MAX,
        };
        assert!(never.next_after(at(1)) > at(1000 * 3600 * 24 * 300));
    }
}
