//! [`Settings`]: what a relay's builder sets and the running relay reads,
//! one struct for both, with the defaults the builder documents.

use std::time::Duration;

use crate::RetryPolicy;

use super::unroutable::Unroutable;

/// A relay's settings (see [`RelayBuilder`](super::RelayBuilder) for each).
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) batch_size: usize,
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

impl Default for Settings {
    fn default() -> Self {
        Settings {
            batch_size: 100,
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
