//! The delivery status of an outbox event and its legal transitions.
//!
//! ```text
//!            publish (acked)
//!  Pending ───────────────────────────► Sent
//!     │  ▲  failed, attempts left            ▲
//!     │  │ ┌──────────┐                      │ publish (acked)
//!     │  │ ▼          │                      │
//!     │  │ Retry ─────┴──────────────────────┘
//!     │  │   │ failed, no attempts left
//!     ▼  │   ▼
//!     Dead ──── skip (operator) ───► Skipped ◄── skip (operator) ── Retry
//!       └────── replay (operator) ─► Pending
//!
//!  Pending, ── hold (an earlier event of its aggregate ──► Held
//!  Retry   ▲   is Retry, Dead or Held; ordered mode)        │
//!     └──────────── release (that event is sent, ───────────┘
//!                   replayed or skipped)
//! ```
//!
//! `Held` is a store's bookkeeping for per-aggregate order, never a failure:
//! an event waiting behind a failed event of its own aggregate leaves the
//! claim's scan, so that however many events wait behind blocked aggregates,
//! claiming the healthy ones costs the same.
//!
//! [`EventStatus::apply`] is the one place these rules live; stores either call
//! it or build their SQL from [`Transition::from`] so the rules cannot drift.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};

use crate::{Error, NextStep};

/// Where an outbox event is in its life.
///
/// "In flight" is not a status: a claimed event keeps its status while a relay
/// holds it; how the claim is held (row lock or lease) is the store's business.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventStatus {
    /// Recorded and waiting for its first publish.
    Pending,
    /// A publish failed; the event waits for its `next_attempt_at`.
    Retry,
    /// The broker confirmed the event. Terminal.
    Sent,
    /// Publishing failed `max_attempts` times. Held for an operator, who can
    /// replay or skip it. In ordered mode it blocks the later events of its
    /// aggregate until then.
    Dead,
    /// An operator gave up on a `Dead` or `Retry` event. Terminal; unblocks its
    /// aggregate.
    Skipped,
    /// Waiting behind an earlier `Retry`, `Dead` or `Held` event of the same
    /// aggregate (ordered mode); back to `Pending` when that event is sent,
    /// replayed or skipped. Not a failure: its attempts are untouched.
    Held,
}

/// A change of [`EventStatus`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Transition {
    /// The broker acknowledged the event.
    Publish,
    /// A publish failed and attempts remain.
    Retry,
    /// A publish failed and no attempts remain.
    Kill,
    /// An operator sends a `Dead` event again (keeps its sequence number).
    Replay,
    /// An operator gives up on a `Dead` or `Retry` event.
    Skip,
    /// An earlier event of the aggregate blocks it (ordered mode). A retry
    /// keeps its attempts.
    Hold,
    /// The event that blocked it was sent, replayed or skipped.
    Release,
}

impl Transition {
    /// The statuses this transition may start from.
    pub const fn from(self) -> &'static [EventStatus] {
        use EventStatus::*;
        match self {
            Transition::Publish | Transition::Retry | Transition::Kill => &[Pending, Retry],
            Transition::Replay => &[Dead],
            Transition::Skip => &[Retry, Dead],
            Transition::Hold => &[Pending, Retry],
            Transition::Release => &[Held],
        }
    }

    /// The status this transition leads to.
    pub const fn to(self) -> EventStatus {
        match self {
            Transition::Publish => EventStatus::Sent,
            Transition::Retry => EventStatus::Retry,
            Transition::Kill => EventStatus::Dead,
            Transition::Replay => EventStatus::Pending,
            Transition::Skip => EventStatus::Skipped,
            Transition::Hold => EventStatus::Held,
            Transition::Release => EventStatus::Pending,
        }
    }
}

impl NextStep {
    /// The transition a failed attempt with this next step makes:
    /// [`Transition::Retry`] or [`Transition::Kill`]; its
    /// [`to`](Transition::to) is the status to store.
    ///
    /// ```
    /// use outbox_core::{EventStatus, NextStep, Transition};
    ///
    /// assert_eq!(NextStep::Dead.transition(), Transition::Kill);
    /// assert_eq!(NextStep::Dead.transition().to(), EventStatus::Dead);
    /// ```
    pub const fn transition(self) -> Transition {
        match self {
            NextStep::RetryAt(_) => Transition::Retry,
            NextStep::Dead => Transition::Kill,
        }
    }

    /// When the event is tried again: `Some` for [`NextStep::RetryAt`],
    /// `None` for [`NextStep::Dead`].
    pub const fn next_attempt_at(self) -> Option<DateTime<Utc>> {
        match self {
            NextStep::RetryAt(at) => Some(at),
            NextStep::Dead => None,
        }
    }
}

impl EventStatus {
    /// Every status, in life-cycle order.
    pub const ALL: [EventStatus; 6] = [
        EventStatus::Pending,
        EventStatus::Retry,
        EventStatus::Held,
        EventStatus::Sent,
        EventStatus::Dead,
        EventStatus::Skipped,
    ];

    /// Applies `transition`, or explains why it is not allowed from this status.
    ///
    /// ```
    /// use outbox_core::{EventStatus, Transition};
    ///
    /// assert_eq!(EventStatus::Pending.apply(Transition::Publish)?, EventStatus::Sent);
    /// assert!(EventStatus::Sent.apply(Transition::Retry).is_err());
    /// assert!(EventStatus::Pending.apply(Transition::Replay).is_err()); // only Dead replays
    /// # Ok::<(), outbox_core::Error>(())
    /// ```
    pub fn apply(self, transition: Transition) -> Result<EventStatus, Error> {
        if transition.from().contains(&self) {
            Ok(transition.to())
        } else {
            Err(Error::InvalidTransition {
                from: self,
                transition,
            })
        }
    }

    /// `true` for statuses a relay still has to publish (`Pending`, `Retry`,
    /// `Held`).
    pub const fn is_unsent(self) -> bool {
        matches!(
            self,
            EventStatus::Pending | EventStatus::Retry | EventStatus::Held
        )
    }

    /// `true` for statuses that hold back later events of the same aggregate in
    /// ordered mode (`Pending`, `Retry`, `Held`, `Dead`).
    pub const fn blocks_aggregate(self) -> bool {
        matches!(
            self,
            EventStatus::Pending | EventStatus::Retry | EventStatus::Held | EventStatus::Dead
        )
    }

    /// The lowercase name stored in the database (`"pending"`, `"retry"`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            EventStatus::Pending => "pending",
            EventStatus::Retry => "retry",
            EventStatus::Sent => "sent",
            EventStatus::Dead => "dead",
            EventStatus::Skipped => "skipped",
            EventStatus::Held => "held",
        }
    }
}

impl fmt::Display for EventStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EventStatus {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| Error::UnknownStatus(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRANSITIONS: [Transition; 7] = [
        Transition::Publish,
        Transition::Retry,
        Transition::Kill,
        Transition::Replay,
        Transition::Skip,
        Transition::Hold,
        Transition::Release,
    ];

    #[test]
    fn legal_transitions_are_exactly_the_documented_ones() {
        use EventStatus::*;
        let legal = [
            (Pending, Transition::Publish, Sent),
            (Pending, Transition::Retry, Retry),
            (Pending, Transition::Kill, Dead),
            (Retry, Transition::Publish, Sent),
            (Retry, Transition::Retry, Retry),
            (Retry, Transition::Kill, Dead),
            (Dead, Transition::Replay, Pending),
            (Dead, Transition::Skip, Skipped),
            (Retry, Transition::Skip, Skipped),
            (Pending, Transition::Hold, Held),
            (Retry, Transition::Hold, Held),
            (Held, Transition::Release, Pending),
        ];
        for from in EventStatus::ALL {
            for t in TRANSITIONS {
                let expected = legal
                    .iter()
                    .find(|(f, tr, _)| *f == from && *tr == t)
                    .map(|(_, _, to)| *to);
                match (from.apply(t), expected) {
                    (Ok(got), Some(want)) => assert_eq!(got, want, "{from} {t:?}"),
                    (Err(Error::InvalidTransition { .. }), None) => {}
                    (got, want) => panic!("{from} {t:?}: got {got:?}, want {want:?}"),
                }
            }
        }
    }

    #[test]
    fn sent_and_skipped_are_terminal_and_dead_leaves_only_by_operator() {
        for t in TRANSITIONS {
            assert!(EventStatus::Sent.apply(t).is_err());
            assert!(EventStatus::Skipped.apply(t).is_err());
        }
        assert!(EventStatus::Dead.apply(Transition::Publish).is_err());
        assert!(EventStatus::Dead.apply(Transition::Retry).is_err());
    }

    #[test]
    fn next_steps_lead_to_retry_and_dead() {
        let at = Utc::now();
        assert_eq!(NextStep::RetryAt(at).transition(), Transition::Retry);
        assert_eq!(NextStep::RetryAt(at).transition().to(), EventStatus::Retry);
        assert_eq!(NextStep::RetryAt(at).next_attempt_at(), Some(at));
        assert_eq!(NextStep::Dead.transition(), Transition::Kill);
        assert_eq!(NextStep::Dead.transition().to(), EventStatus::Dead);
        assert_eq!(NextStep::Dead.next_attempt_at(), None);
        for step in [NextStep::RetryAt(at), NextStep::Dead] {
            for from in [EventStatus::Pending, EventStatus::Retry] {
                assert_eq!(
                    from.apply(step.transition()).ok(),
                    Some(step.transition().to())
                );
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for status in EventStatus::ALL {
            assert_eq!(status.as_str().parse::<EventStatus>().ok(), Some(status));
        }
        assert!(matches!(
            "in_flight".parse::<EventStatus>(),
            Err(Error::UnknownStatus(s)) if s == "in_flight"
        ));
    }
}
