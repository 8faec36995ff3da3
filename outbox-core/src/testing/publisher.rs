//! [`RecordingPublisher`]: a [`Publisher`] that records what it was given and
//! answers with scripted outcomes.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use uuid::Uuid;

use crate::failpoints;
use crate::{EventEnvelope, PublishOutcome, Publisher};

type Behaviour = Box<dyn FnMut(&EventEnvelope) -> PublishOutcome + Send>;
type BatchBehaviour = Box<dyn FnMut(&[&EventEnvelope]) -> Vec<PublishOutcome> + Send>;
type Delay = Box<dyn Fn(&[&EventEnvelope]) -> Duration + Send>;

/// One call's view of one message: what was sent and what the "broker" said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishAttempt {
    /// The event id.
    pub id: Uuid,
    /// The outcome returned for it.
    pub outcome: PublishOutcome,
    /// Index of the `publish` call (wave) it was part of, from 0.
    pub call: usize,
}

#[derive(Default)]
struct Inner {
    acked: Vec<EventEnvelope>,
    attempts: Vec<PublishAttempt>,
    deadlines: Vec<Option<Instant>>,
    calls: usize,
    behaviour: Option<Behaviour>,
    batch_behaviour: Option<BatchBehaviour>,
    delay: Option<Delay>,
}

/// A publisher for tests: acks everything by default, or answers with a
/// closure; records every acked envelope in order and every attempt.
///
/// Cloning gives another handle to the same recorder.
///
/// ```
/// use outbox_core::PublishOutcome;
/// use outbox_core::testing::RecordingPublisher;
///
/// // Refuse everything of aggregate "42", ack the rest.
/// let publisher = RecordingPublisher::with_behaviour(|event| {
///     if event.aggregate_id == "42" {
///         PublishOutcome::rejected("NO_ROUTE")
///     } else {
///         PublishOutcome::Acked
///     }
/// });
/// # let _ = publisher;
/// ```
#[derive(Clone, Default)]
pub struct RecordingPublisher {
    inner: Arc<Mutex<Inner>>,
    progress: Arc<Notify>,
}

impl fmt::Debug for RecordingPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        f.debug_struct("RecordingPublisher")
            .field("acked", &inner.acked.len())
            .field("attempts", &inner.attempts.len())
            .field("calls", &inner.calls)
            .finish()
    }
}

impl RecordingPublisher {
    /// Acks every message.
    pub fn new() -> Self {
        Self::default()
    }

    /// Answers each message with `behaviour`.
    pub fn with_behaviour(
        behaviour: impl FnMut(&EventEnvelope) -> PublishOutcome + Send + 'static,
    ) -> Self {
        let publisher = Self::default();
        publisher.set_behaviour(behaviour);
        publisher
    }

    /// Replaces the behaviour.
    pub fn set_behaviour(
        &self,
        behaviour: impl FnMut(&EventEnvelope) -> PublishOutcome + Send + 'static,
    ) {
        self.lock().behaviour = Some(Box::new(behaviour));
    }

    /// Answers each `publish` call (wave) as a whole with `behaviour`, which
    /// returns one outcome per event (a missing one is `ConnectionLost`);
    /// e.g. a message that kills the connection fails every message of its
    /// call. Takes precedence over [`set_behaviour`](Self::set_behaviour).
    pub fn set_batch_behaviour(
        &self,
        behaviour: impl FnMut(&[&EventEnvelope]) -> Vec<PublishOutcome> + Send + 'static,
    ) {
        self.lock().batch_behaviour = Some(Box::new(behaviour));
    }

    /// Makes each `publish` call take `delay(events)` (tokio time, without
    /// blocking) before it is answered, as a slow broker would; e.g. slow
    /// for one event only.
    pub fn set_delay(&self, delay: impl Fn(&[&EventEnvelope]) -> Duration + Send + 'static) {
        self.lock().delay = Some(Box::new(delay));
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Acked envelopes, in publish order.
    pub fn published(&self) -> Vec<EventEnvelope> {
        self.lock().acked.clone()
    }

    /// Ids of acked envelopes, in publish order.
    pub fn published_ids(&self) -> Vec<Uuid> {
        self.lock().acked.iter().map(|e| e.id).collect()
    }

    /// Every message handed to the publisher with its outcome, in order.
    pub fn attempts(&self) -> Vec<PublishAttempt> {
        self.lock().attempts.clone()
    }

    /// The `deadline` of each `publish` call (wave), in order.
    pub fn deadlines(&self) -> Vec<Option<Instant>> {
        self.lock().deadlines.clone()
    }

    /// Number of `publish` calls (waves) so far.
    pub fn calls(&self) -> usize {
        self.lock().calls
    }

    /// Waits until at least `n` messages were acked.
    pub async fn wait_for(&self, n: usize) {
        loop {
            let notified = self.progress.notified();
            if self.lock().acked.len() >= n {
                return;
            }
            notified.await;
        }
    }
}

impl Publisher for RecordingPublisher {
    async fn publish(
        &self,
        events: &[&EventEnvelope],
        deadline: Option<Instant>,
    ) -> Vec<PublishOutcome> {
        let delay = self
            .lock()
            .delay
            .as_ref()
            .map_or(Duration::ZERO, |delay| delay(events));
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        failpoints::hit(failpoints::AFTER_PUBLISH_BEFORE_CONFIRM);
        let outcomes = {
            let mut inner = self.lock();
            let call = inner.calls;
            inner.calls += 1;
            inner.deadlines.push(deadline);
            let mut outcomes = Vec::with_capacity(events.len());
            let mut scripted = inner
                .batch_behaviour
                .as_mut()
                .map(|behaviour| behaviour(events).into_iter());
            for event in events {
                let outcome = match (scripted.as_mut(), inner.behaviour.as_mut()) {
                    (Some(scripted), _) => scripted.next().unwrap_or_else(|| {
                        PublishOutcome::connection_lost("the batch behaviour gave no outcome")
                    }),
                    (None, Some(behaviour)) => behaviour(event),
                    (None, None) => PublishOutcome::Acked,
                };
                if outcome == PublishOutcome::Acked {
                    inner.acked.push((*event).clone());
                }
                inner.attempts.push(PublishAttempt {
                    id: event.id,
                    outcome: outcome.clone(),
                    call,
                });
                outcomes.push(outcome);
            }
            outcomes
        };
        self.progress.notify_waiters();
        // Let other tasks run between waves, as a real broker round trip would.
        tokio::task::yield_now().await;
        outcomes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestEvent;

    #[tokio::test(start_paused = true)]
    async fn a_delay_holds_each_call_back_before_it_is_answered() {
        let publisher = RecordingPublisher::new();
        publisher.set_delay(|events| Duration::from_millis(100) * events.len() as u32);
        let event = EventEnvelope::from_event(&TestEvent::new("a")).unwrap();
        let started = tokio::time::Instant::now();
        let outcomes = publisher.publish(&[&event, &event], None).await;
        assert_eq!(outcomes, [PublishOutcome::Acked, PublishOutcome::Acked]);
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert_eq!(publisher.published_ids(), [event.id, event.id]);
    }
}
