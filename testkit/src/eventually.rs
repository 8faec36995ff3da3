//! Waiting for what happens eventually (a relay publishing, a consumer
//! applying) without sleeping for a guessed time, and without hanging when
//! it never happens: poll until it holds, fail naming what was awaited.
//!
//! ```
//! # async fn f() {
//! use std::time::Duration;
//! use outbox_testkit::eventually::{eventually, within};
//!
//! let mut polls = 0;
//! eventually("the third poll")
//!     .within(Duration::from_secs(1))
//!     .until(|| {
//!         polls += 1;
//!         std::future::ready(polls == 3)
//!     })
//!     .await;
//! let seen = eventually("a count of 2")
//!     .equals(2, || async { 2 })
//!     .await;
//! assert_eq!(seen, 2);
//! within(Duration::from_secs(1), "a ready future", async {}).await;
//! # }
//! ```
//!
//! A probe is a closure returning a future (`|| async { ... }`), so the
//! wait is `Send` whenever the probe's future is, also inside a spawned
//! task or a transaction's closure. A probe that needs a `&mut` of the
//! test (a connection) either does its work before returning a ready
//! future (`|| std::future::ready(count_sync(&mut conn, sql))`) or locks
//! it inside the future.

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

/// How long [`eventually`] waits unless told otherwise.
pub const DEFAULT_LIMIT: Duration = Duration::from_secs(10);

/// How often [`eventually`] polls unless told otherwise.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(50);

/// A wait for `what`: up to [`DEFAULT_LIMIT`], polling every
/// [`DEFAULT_INTERVAL`]; change either with [`Eventually::within`] and
/// [`Eventually::every`], then wait with [`Eventually::until`],
/// [`Eventually::equals`] or [`Eventually::some`].
pub fn eventually(what: impl Into<String>) -> Eventually {
    Eventually {
        what: what.into(),
        limit: DEFAULT_LIMIT,
        interval: DEFAULT_INTERVAL,
    }
}

/// A wait being set up; see [`eventually`].
#[derive(Debug, Clone)]
#[must_use = "an Eventually waits only when one of until, equals or some is awaited"]
pub struct Eventually {
    what: String,
    limit: Duration,
    interval: Duration,
}

impl Eventually {
    /// Fails after `limit` (default [`DEFAULT_LIMIT`]).
    pub fn within(mut self, limit: Duration) -> Self {
        self.limit = limit;
        self
    }

    /// Polls every `interval` (default [`DEFAULT_INTERVAL`]).
    pub fn every(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Polls `probe` until it returns `true`.
    ///
    /// # Panics
    /// When it has not within the limit: `not within {limit}: {what}`.
    pub async fn until<F, Fut>(self, mut probe: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        self.some(|| {
            let done = probe();
            async move { done.await.then_some(()) }
        })
        .await
    }

    /// Polls `probe` until it returns `expected`; returns that value.
    ///
    /// # Panics
    /// When it has not within the limit, with the last value seen:
    /// `{what}: still {got:?} after {limit:?}, expected {expected:?}`.
    pub async fn equals<T, F, Fut>(self, expected: T, mut probe: F) -> T
    where
        T: PartialEq + Debug,
        F: FnMut() -> Fut,
        Fut: Future<Output = T>,
    {
        let deadline = Instant::now() + self.limit;
        loop {
            let got = probe().await;
            if got == expected {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "{}: still {got:?} after {:?}, expected {expected:?}",
                self.what,
                self.limit
            );
            tokio::time::sleep(self.interval).await;
        }
    }

    /// Polls `probe` until it returns `Some`; returns what it holds.
    ///
    /// # Panics
    /// When it has not within the limit: `not within {limit}: {what}`.
    pub async fn some<T, F, Fut>(self, mut probe: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + self.limit;
        loop {
            if let Some(value) = probe().await {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "not within {:?}: {}",
                self.limit,
                self.what
            );
            tokio::time::sleep(self.interval).await;
        }
    }
}

/// `future`'s output, or a panic naming `what` when it takes longer than
/// `limit`: a test fails instead of hanging.
///
/// # Panics
/// After `limit`: `{what}: did not finish within {limit:?}`.
pub async fn within<F: Future>(limit: Duration, what: &str, future: F) -> F::Output {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: did not finish within {limit:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn until_returns_as_soon_as_the_probe_holds() {
        let mut calls = 0;
        eventually("three calls")
            .every(Duration::from_millis(1))
            .until(|| {
                calls += 1;
                std::future::ready(calls >= 3)
            })
            .await;
        assert_eq!(calls, 3);
    }

    #[tokio::test]
    async fn equals_returns_the_expected_value() {
        let mut n = 0;
        let got = eventually("n reaches 4")
            .every(Duration::from_millis(1))
            .equals(4, || {
                n += 1;
                std::future::ready(n)
            })
            .await;
        assert_eq!(got, 4);
    }

    #[tokio::test]
    async fn some_returns_what_the_probe_found() {
        let mut n = 0;
        let got = eventually("a value")
            .every(Duration::from_millis(1))
            .some(|| {
                n += 1;
                std::future::ready((n == 2).then(|| format!("found at {n}")))
            })
            .await;
        assert_eq!(got, "found at 2");
    }

    #[tokio::test]
    #[should_panic(expected = "the count: still 1 after 50ms, expected 2")]
    async fn equals_fails_with_the_last_value_seen() {
        eventually("the count")
            .within(Duration::from_millis(50))
            .every(Duration::from_millis(5))
            .equals(2, || async { 1 })
            .await;
    }

    #[tokio::test]
    #[should_panic(expected = "not within 30ms: never")]
    async fn until_fails_naming_what_was_awaited() {
        eventually("never")
            .within(Duration::from_millis(30))
            .every(Duration::from_millis(5))
            .until(|| async { false })
            .await;
    }

    #[tokio::test]
    async fn a_wait_is_send_inside_a_spawned_task() {
        let shared = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = std::sync::Arc::clone(&shared);
        tokio::spawn(async move {
            eventually("the counter reaches 3")
                .every(Duration::from_millis(1))
                .until(|| async { counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= 2 })
                .await;
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(shared.load(std::sync::atomic::Ordering::Relaxed), 3);
    }

    #[tokio::test]
    #[should_panic(expected = "sleeping: did not finish within 20ms")]
    async fn within_fails_instead_of_hanging() {
        within(
            Duration::from_millis(20),
            "sleeping",
            tokio::time::sleep(Duration::from_secs(60)),
        )
        .await;
    }
}
