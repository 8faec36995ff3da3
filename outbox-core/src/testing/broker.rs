//! [`InMemoryDeadLetterQueues`]: a [`DeadLetterBroker`] of named queues in
//! memory, for unit tests of code that drives
//! [`DeadLetters`](crate::admin::DeadLetters).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use uuid::Uuid;

use crate::admin::{
    DeadLetterBroker, DeadLetterSession, DlqReplay, DlqReplayReport, QueueDepth, ReplayedMessage,
    SkippedMessage, StopCause,
};

/// A message in an [`InMemoryDeadLetterQueues`] queue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueuedMessage {
    /// Its `message_id`.
    pub message_id: Option<String>,
    /// The id the consumer gave the dead letter.
    pub dead_letter_id: Option<Uuid>,
    /// The queue it was dead-lettered from (where a replay sends it).
    pub origin: Option<String>,
    /// Whether it carries the signs of a dead letter (a live message does
    /// not: a replay stops at it).
    pub dead_lettered: bool,
}

impl QueuedMessage {
    /// A dead letter of `origin` (or of nowhere known).
    pub fn new(
        message_id: Option<String>,
        dead_letter_id: Option<Uuid>,
        origin: Option<String>,
    ) -> Self {
        QueuedMessage {
            message_id,
            dead_letter_id,
            origin,
            dead_lettered: true,
        }
    }

    /// A message that was never dead-lettered (as in a live queue).
    pub fn live(message_id: impl Into<String>) -> Self {
        QueuedMessage {
            message_id: Some(message_id.into()),
            dead_letter_id: None,
            origin: None,
            dead_lettered: false,
        }
    }
}

/// The in-memory broker failed (see
/// [`InMemoryDeadLetterQueues::fail_next`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("injected broker failure")]
pub struct BrokerError;

/// Named queues in memory. A replay moves a message to its origin queue
/// when that queue exists; otherwise it stops there (the message stays at
/// the head) or, skipping, moves it to the tail. Clones share the queues.
#[derive(Debug, Clone, Default)]
pub struct InMemoryDeadLetterQueues {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    queues: BTreeMap<String, VecDeque<QueuedMessage>>,
    /// Consumers per queue (sessions hold one).
    consumers: BTreeMap<String, u32>,
    /// Calls that pass before `fail_next` starts.
    pass_first: usize,
    fail_next: usize,
}

impl InMemoryDeadLetterQueues {
    /// No queues.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Creates `queue` (empty) if it does not exist.
    pub fn declare(&self, queue: &str) {
        self.lock().queues.entry(queue.to_owned()).or_default();
    }

    /// Appends `message` to `queue` (created if needed).
    pub fn push(&self, queue: &str, message: QueuedMessage) {
        self.lock()
            .queues
            .entry(queue.to_owned())
            .or_default()
            .push_back(message);
    }

    /// The messages of `queue`, head first (empty when there is no such
    /// queue).
    pub fn messages(&self, queue: &str) -> Vec<QueuedMessage> {
        self.lock()
            .queues
            .get(queue)
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Attaches a consumer to `queue` (as a live consumer would), or
    /// detaches one with `attach == false`.
    pub fn consumer(&self, queue: &str, attach: bool) {
        let mut state = self.lock();
        let n = state.consumers.entry(queue.to_owned()).or_default();
        *n = if attach { *n + 1 } else { n.saturating_sub(1) };
    }

    /// Makes the next `n` broker calls (inspect, open, each message a replay
    /// takes, purge) fail with [`BrokerError`].
    pub fn fail_next(&self, n: usize) {
        self.fail_after(0, n);
    }

    /// Lets `pass` broker calls through, then fails the `n` after them.
    pub fn fail_after(&self, pass: usize, n: usize) {
        let mut state = self.lock();
        state.pass_first = pass;
        state.fail_next = n;
    }

    fn injected(state: &mut State) -> Result<(), BrokerError> {
        if state.pass_first > 0 {
            state.pass_first -= 1;
            return Ok(());
        }
        if state.fail_next > 0 {
            state.fail_next -= 1;
            return Err(BrokerError);
        }
        Ok(())
    }
}

impl DeadLetterBroker for InMemoryDeadLetterQueues {
    type Error = BrokerError;
    type Session = InMemorySession;

    async fn inspect(&self, queue: &str) -> Result<Option<QueueDepth>, BrokerError> {
        let mut state = self.lock();
        Self::injected(&mut state)?;
        let consumers = state.consumers.get(queue).copied().unwrap_or(0);
        Ok(state
            .queues
            .get(queue)
            .map(|q| QueueDepth::new(q.len() as u64, consumers)))
    }

    async fn open(&self, queue: &str) -> Result<Option<InMemorySession>, BrokerError> {
        let mut state = self.lock();
        Self::injected(&mut state)?;
        let consumers = state.consumers.entry(queue.to_owned()).or_default();
        if *consumers > 0 {
            return Ok(None);
        }
        *consumers = 1;
        Ok(Some(InMemorySession {
            broker: self.clone(),
            queue: queue.to_owned(),
        }))
    }

    async fn purge(&self, queue: &str) -> Result<u64, BrokerError> {
        let mut state = self.lock();
        Self::injected(&mut state)?;
        Ok(state
            .queues
            .get_mut(queue)
            .map(|q| {
                let n = q.len() as u64;
                q.clear();
                n
            })
            .unwrap_or(0))
    }
}

/// A replay's hold on a queue of [`InMemoryDeadLetterQueues`]: its only
/// consumer until closed.
#[derive(Debug)]
pub struct InMemorySession {
    broker: InMemoryDeadLetterQueues,
    queue: String,
}

impl DeadLetterSession for InMemorySession {
    type Error = BrokerError;

    async fn replay(
        &mut self,
        limit: usize,
        request: &DlqReplay,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<DlqReplayReport, BrokerError> {
        let queue = self.queue.as_str();
        let mut report = DlqReplayReport::default();
        while report.handled() < limit {
            let mut state = self.broker.lock();
            if InMemoryDeadLetterQueues::injected(&mut state).is_err() {
                report.stop(StopCause::Broker, BrokerError.to_string());
                break;
            }
            let Some(message) = state.queues.get_mut(queue).and_then(VecDeque::pop_front) else {
                break;
            };
            let origin = message
                .origin
                .clone()
                .filter(|o| state.queues.contains_key(o));
            match origin {
                Some(origin) if message.dead_lettered => {
                    report.replayed += 1;
                    report.messages.push(ReplayedMessage::new(
                        origin.clone(),
                        message.message_id.clone(),
                        message.dead_letter_id,
                    ));
                    state.queues.entry(origin).or_default().push_back(message);
                }
                _ => {
                    let reason = if message.dead_lettered {
                        format!("no queue {:?} to send it back to", message.origin)
                    } else {
                        "it was never dead-lettered: is this a dead-letter queue?".to_owned()
                    };
                    if !(request.skip_unreplayable && message.dead_lettered) {
                        state
                            .queues
                            .entry(queue.to_owned())
                            .or_default()
                            .push_front(message);
                        report.stop(StopCause::Unreplayable, reason);
                        break;
                    }
                    report.skipped.push(SkippedMessage::new(
                        message.message_id.clone(),
                        message.dead_letter_id,
                        reason,
                    ));
                    state
                        .queues
                        .entry(queue.to_owned())
                        .or_default()
                        .push_back(message);
                }
            }
            drop(state);
            progress(report.handled() as u64);
        }
        Ok(report)
    }

    async fn close(self) {
        self.broker.consumer(&self.queue, false);
    }
}
