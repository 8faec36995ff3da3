//! What an unroutable event costs: [`UnroutablePolicy`], per event type.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

/// What the relay does with an event the broker returned as unroutable
/// (`312 NO_ROUTE`: no queue is bound for its routing key).
///
/// A missing binding is usually a configuration fault, not a bad message,
/// and in publish/subscribe "no subscriber yet" is normal: spending the
/// retry attempts would park every such event `Dead` within minutes and
/// block its aggregate until someone replays it. Set per event type with
/// [`RelayBuilder::unroutable`](crate::RelayBuilder::unroutable) and
/// [`unroutable_for`](crate::RelayBuilder::unroutable_for).
///
/// For "publish before anyone subscribes", the recommended topology is an
/// alternate exchange on the publishing exchange (`alternate-exchange`
/// argument) bound to a parking queue: the broker then routes instead of
/// returning, and nothing is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum UnroutablePolicy {
    /// The default. The event waits (status `Retry`, attempts unchanged)
    /// and is tried again after a backoff that grows with how long it has
    /// been unroutable, capped at `max_delay`; past `max_hold` it ends
    /// `Dead` with the reason. In ordered mode the later events of its
    /// aggregate wait behind it. The store-wide
    /// `outbox_unroutable_events` gauge counts held events.
    Hold {
        /// How long an event may stay unroutable before it ends `Dead`.
        max_hold: Duration,
        /// The longest wait between two tries.
        max_delay: Duration,
    },
    /// Treated as any refused message: each return spends an attempt, and
    /// the event ends `Dead` at the [`RetryPolicy`](crate::RetryPolicy)'s
    /// limit.
    SpendAttempts,
    /// Marked sent, and counted (`outbox_unroutable_accepted_total`): for
    /// event types nobody may want yet.
    Accept,
}

impl Default for UnroutablePolicy {
    /// `Hold` for up to 7 days, trying again at least every minute.
    fn default() -> Self {
        UnroutablePolicy::Hold {
            max_hold: Duration::from_secs(7 * 24 * 3600),
            max_delay: Duration::from_secs(60),
        }
    }
}

impl UnroutablePolicy {
    /// `Hold` with these bounds.
    pub fn hold(max_hold: Duration, max_delay: Duration) -> Self {
        UnroutablePolicy::Hold {
            max_hold,
            max_delay,
        }
    }

    /// When to try again an event unroutable since `since`, at `now`: after
    /// as long as it has been unroutable (so a fault of seconds costs
    /// seconds), at least 1 s and at most `max_delay`.
    pub(crate) fn next_try(
        since: DateTime<Utc>,
        now: DateTime<Utc>,
        max_delay: Duration,
    ) -> DateTime<Utc> {
        let age = (now - since).to_std().unwrap_or_default();
        let delay = age.clamp(
            Duration::from_secs(1),
            max_delay.max(Duration::from_secs(1)),
        );
        now + chrono::Duration::from_std(delay).unwrap_or_else(|_| chrono::Duration::seconds(60))
    }
}

/// Per event type policies and the rate limit of their warnings.
#[derive(Debug, Default)]
pub(crate) struct Unroutable {
    pub(crate) default: UnroutablePolicy,
    pub(crate) by_event_type: HashMap<String, UnroutablePolicy>,
    /// When each destination was last warned about.
    warned: Mutex<HashMap<String, Instant>>,
}

/// At most one warning per destination in this long.
const WARN_EVERY: Duration = Duration::from_secs(60);

impl Unroutable {
    pub(crate) fn policy(&self, event_type: &str) -> UnroutablePolicy {
        self.by_event_type
            .get(event_type)
            .copied()
            .unwrap_or(self.default)
    }

    /// Whether to warn about `destination` now (at most once a minute each).
    pub(crate) fn should_warn(&self, destination: &str) -> bool {
        let mut warned = self
            .warned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = Instant::now();
        match warned.get(destination) {
            Some(at) if now.duration_since(*at) < WARN_EVERY => false,
            _ => {
                warned.insert(destination.to_owned(), now);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_grows_with_the_time_unroutable_and_is_capped() {
        let since = Utc::now();
        let cap = Duration::from_secs(60);
        let at = |secs: i64| {
            let now = since + chrono::Duration::seconds(secs);
            (UnroutablePolicy::next_try(since, now, cap) - now).num_seconds()
        };
        assert_eq!(at(0), 1);
        assert_eq!(at(10), 10);
        assert_eq!(at(3600), 60);
    }

    #[test]
    fn policies_by_event_type_override_the_default() {
        let mut u = Unroutable {
            default: UnroutablePolicy::Accept,
            ..Unroutable::default()
        };
        u.by_event_type
            .insert("order.placed".into(), UnroutablePolicy::SpendAttempts);
        assert_eq!(u.policy("order.placed"), UnroutablePolicy::SpendAttempts);
        assert_eq!(u.policy("order.paid"), UnroutablePolicy::Accept);
        assert!(u.should_warn("x"));
        assert!(!u.should_warn("x"), "rate-limited");
        assert!(u.should_warn("y"));
    }
}
