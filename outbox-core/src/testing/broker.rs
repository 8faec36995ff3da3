//! [`InMemoryDeadLetterQueues`]: a [`DeadLetterBroker`] of named queues in
//! memory, for unit tests of code that drives
//! [`DeadLetters`](crate::admin::DeadLetters).

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use uuid::Uuid;

use crate::admin::{DeadLetterBroker, DlqReplayReport, ReplayedMessage, SkippedMessage};

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

    /// Makes the next `n` broker calls (depth, each message a replay takes,
    /// purge) fail with [`BrokerError`].
    pub fn fail_next(&self, n: usize) {
        self.lock().fail_next = n;
    }

    fn injected(state: &mut State) -> Result<(), BrokerError> {
        if state.fail_next > 0 {
            state.fail_next -= 1;
            return Err(BrokerError);
        }
        Ok(())
    }
}

impl DeadLetterBroker for InMemoryDeadLetterQueues {
    type Error = BrokerError;

    async fn depth(&self, queue: &str) -> Result<Option<u32>, BrokerError> {
        let mut state = self.lock();
        Self::injected(&mut state)?;
        Ok(state
            .queues
            .get(queue)
            .map(|q| u32::try_from(q.len()).unwrap_or(u32::MAX)))
    }

    async fn replay(
        &self,
        queue: &str,
        limit: usize,
        skip_unreplayable: bool,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<DlqReplayReport, BrokerError> {
        let mut report = DlqReplayReport::default();
        while report.handled() < limit {
            let mut state = self.lock();
            if Self::injected(&mut state).is_err() {
                report.error = Some(BrokerError.to_string());
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
                Some(origin) => {
                    report.replayed += 1;
                    report.messages.push(ReplayedMessage::new(
                        origin.clone(),
                        message.message_id.clone(),
                        message.dead_letter_id,
                    ));
                    state.queues.entry(origin).or_default().push_back(message);
                }
                None => {
                    let reason = format!("no queue {:?} to send it back to", message.origin);
                    if !skip_unreplayable {
                        state
                            .queues
                            .entry(queue.to_owned())
                            .or_default()
                            .push_front(message);
                        report.error = Some(reason);
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
