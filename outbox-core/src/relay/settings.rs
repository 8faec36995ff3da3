//! [`Settings`]: what a relay's builder sets and the running relay reads,
//! one struct for both, with the defaults the builder documents.

use std::time::Duration;

use crate::RetryPolicy;

use super::unroutable::Unroutable;

/// A relay's settings (see [`RelayBuilder`](super::RelayBuilder) for each).
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) batch_size: usize,
    /// `None`: [`DEFAULT_GROWTH`] times `batch_size`, at most
    /// [`MAX_BATCH_SIZE`].
    pub(crate) max_batch_size: Option<usize>,
    pub(crate) concurrency: usize,
    pub(crate) poll_interval: Duration,
    pub(crate) stats_interval: Duration,
    pub(crate) shutdown_grace: Duration,
    pub(crate) retry: RetryPolicy,
    pub(crate) pause_min: Duration,
    pub(crate) pause_max: Duration,
    pub(crate) suspect_limit: u32,
    pub(crate) unroutable: Unroutable,
}

/// The largest claim a relay makes.
pub(crate) const MAX_BATCH_SIZE: usize = 10_000;

/// How many times `batch_size` claims grow to by default while a backlog
/// lasts.
pub(crate) const DEFAULT_GROWTH: usize = 4;

impl Settings {
    /// The largest claim: `max_batch_size`, or 4 × `batch_size`.
    pub(crate) fn max_batch(&self) -> usize {
        self.max_batch_size.unwrap_or_else(|| {
            self.batch_size
                .saturating_mul(DEFAULT_GROWTH)
                .min(MAX_BATCH_SIZE)
        })
    }

    /// The next claim's size after a claim of `limit` that returned
    /// `claimed` events: doubled (up to [`max_batch`](Self::max_batch))
    /// after a full one, back to `batch_size` after a short one.
    pub(crate) fn next_limit(&self, limit: usize, claimed: usize) -> usize {
        if claimed >= limit {
            limit
                .saturating_mul(2)
                .min(self.max_batch())
                .max(self.batch_size)
        } else {
            self.batch_size
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            batch_size: 100,
            max_batch_size: None,
            concurrency: 2,
            poll_interval: Duration::from_secs(1),
            stats_interval: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(30),
            retry: RetryPolicy::default(),
            pause_min: Duration::from_millis(100),
            pause_max: Duration::from_secs(30),
            suspect_limit: 3,
            unroutable: Unroutable::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Settings;

    #[test]
    fn claims_double_while_full_up_to_the_maximum_and_fall_back_when_short() {
        let s = Settings::default();
        assert_eq!(s.max_batch(), 400);
        assert_eq!(s.next_limit(100, 100), 200);
        assert_eq!(s.next_limit(200, 200), 400);
        assert_eq!(s.next_limit(400, 400), 400);
        assert_eq!(s.next_limit(400, 399), 100);
        assert_eq!(s.next_limit(200, 0), 100);
        let fixed = Settings {
            max_batch_size: Some(100),
            ..Settings::default()
        };
        assert_eq!(fixed.next_limit(100, 100), 100);
        let odd = Settings {
            batch_size: 3_000,
            ..Settings::default()
        };
        assert_eq!(odd.max_batch(), 10_000);
        assert_eq!(odd.next_limit(6_000, 6_000), 10_000);
    }
}
