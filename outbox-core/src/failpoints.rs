//! Named failpoints in the relay loop, for fault-injection tests.
//!
//! With the `failpoints` feature, each name below is a [`fail`] failpoint that
//! a test configures (e.g. `fail::cfg(BEFORE_CLAIM, "pause")`, or the
//! `FAILPOINTS` environment variable read by `fail::FailScenario::setup()` in a
//! relay child process) to stop, delay or crash the relay exactly there.
//! Without the feature they compile to nothing.

/// Before the relay claims a batch.
pub const BEFORE_CLAIM: &str = "outbox::relay::before_claim";
/// After a batch was claimed, before anything is published.
pub const AFTER_CLAIM: &str = "outbox::relay::after_claim";
/// Inside a [`Publisher`](crate::Publisher): messages sent, confirms not yet
/// awaited. Publishers call [`hit`] with it.
pub const AFTER_PUBLISH_BEFORE_CONFIRM: &str = "outbox::relay::after_publish_before_confirm";
/// Every confirm received, nothing marked yet.
pub const AFTER_CONFIRM_BEFORE_MARK: &str = "outbox::relay::after_confirm_before_mark";
/// Sent events marked, failures not yet marked, claim not finished.
pub const DURING_MARK: &str = "outbox::relay::during_mark";

/// Every failpoint name, in the order the relay reaches them.
pub const ALL: [&str; 5] = [
    BEFORE_CLAIM,
    AFTER_CLAIM,
    AFTER_PUBLISH_BEFORE_CONFIRM,
    AFTER_CONFIRM_BEFORE_MARK,
    DURING_MARK,
];

/// Evaluates the failpoint `name` (a no-op without the `failpoints` feature).
#[inline]
pub fn hit(name: &'static str) {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name);
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}
