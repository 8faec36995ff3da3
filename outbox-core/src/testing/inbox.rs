//! [`InMemoryInbox`]: an [`InboxStore`] with transaction semantics.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::Utc;
use uuid::Uuid;

use crate::admin::{
    AuditEntry, AuditRecord, DeadLetter, DeadLetterGroup, DeadLetterQuery, DeadLetterRecord,
    DeadLetterStore, Page, ReplayedMessage, group_dead_letters,
};
use crate::{InboxDatabase, InboxOutcome, InboxStore};

/// An in-memory inbox. Entries written through an [`InboxTx`] become visible
/// to other transactions only when it is [committed](InboxTx::commit); a
/// dropped transaction rolls back. Dead letters the consumer records are
/// kept in order ([`dead_letters`](Self::dead_letters)); it is a
/// [`DeadLetterStore`] with its own audit trail
/// ([`audit_log`](Self::audit_log)).
#[derive(Debug, Clone, Default)]
pub struct InMemoryInbox {
    seen: Arc<Mutex<HashSet<(String, Uuid)>>>,
    dead_letters: Arc<Mutex<DeadLetterState>>,
}

#[derive(Debug, Default)]
struct DeadLetterState {
    records: Vec<DeadLetterRecord>,
    audit: Vec<AuditRecord>,
}

/// A transaction on an [`InMemoryInbox`].
#[derive(Debug)]
pub struct InboxTx {
    inbox: InMemoryInbox,
    pending: HashSet<(String, Uuid)>,
}

impl InMemoryInbox {
    /// An empty inbox.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, HashSet<(String, Uuid)>> {
        self.seen
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Opens a transaction.
    pub fn begin(&self) -> InboxTx {
        InboxTx {
            inbox: self.clone(),
            pending: HashSet::new(),
        }
    }

    /// Committed entries.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// `true` when nothing was committed.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Whether `consumer` committed `event_id`.
    pub fn contains(&self, consumer: &str, event_id: Uuid) -> bool {
        self.lock().contains(&(consumer.to_owned(), event_id))
    }

    /// The dead letters recorded so far, in the order they were recorded.
    pub fn dead_letters(&self) -> Vec<DeadLetter> {
        self.letters()
            .records
            .iter()
            .map(|r| r.letter.clone())
            .collect()
    }

    /// The audit rows of the dead-letter verbs, oldest first.
    pub fn audit_log(&self) -> Vec<AuditRecord> {
        self.letters().audit.clone()
    }

    fn letters(&self) -> MutexGuard<'_, DeadLetterState> {
        self.dead_letters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl InboxTx {
    /// Makes this transaction's entries permanent.
    pub fn commit(self) {
        let mut seen = self.inbox.lock();
        seen.extend(self.pending.iter().cloned());
    }
}

impl InboxStore for InMemoryInbox {
    type Connection = InboxTx;
    type Error = std::convert::Infallible;

    async fn receive(
        &self,
        conn: &mut InboxTx,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<InboxOutcome, Self::Error> {
        let key = (consumer.to_owned(), event_id);
        if self.lock().contains(&key) || !conn.pending.insert(key) {
            return Ok(InboxOutcome::Duplicate);
        }
        Ok(InboxOutcome::FirstTime)
    }
}

impl InboxDatabase for InMemoryInbox {
    type Tx = InboxTx;
    type Error = std::convert::Infallible;

    async fn begin(&self) -> Result<InboxTx, Self::Error> {
        Ok(InMemoryInbox::begin(self))
    }

    async fn receive(
        &self,
        tx: &mut InboxTx,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<InboxOutcome, Self::Error> {
        InboxStore::receive(self, tx, consumer, event_id).await
    }

    async fn commit(&self, tx: InboxTx) -> Result<(), Self::Error> {
        tx.commit();
        Ok(())
    }

    async fn record_dead_letter(&self, letter: &DeadLetter) -> Result<(), Self::Error> {
        let mut state = self.letters();
        let id = state.records.last().map_or(1, |r| r.id + 1);
        state
            .records
            .push(DeadLetterRecord::new(id, letter.clone(), None, None));
        Ok(())
    }
}

impl DeadLetterStore for InMemoryInbox {
    type Error = std::convert::Infallible;

    async fn list(&self, query: &DeadLetterQuery) -> Result<Page<DeadLetterRecord>, Self::Error> {
        let limit = query.limit.max(1);
        let state = self.letters();
        let mut items: Vec<DeadLetterRecord> = state
            .records
            .iter()
            .filter(|r| query.queue.as_ref().is_none_or(|q| r.letter.queue == *q))
            .filter(|r| r.id > query.after.unwrap_or(0))
            .filter(|r| query.include_settled || r.is_open())
            .take(limit + 1)
            .map(|r| {
                if query.payloads {
                    r.clone()
                } else {
                    r.clone().redacted()
                }
            })
            .collect();
        let next = if items.len() > limit {
            items.truncate(limit);
            items.last().map(|r| r.id)
        } else {
            None
        };
        Ok(Page::new(items, next))
    }

    async fn show(&self, id: i64) -> Result<Option<DeadLetterRecord>, Self::Error> {
        Ok(self.letters().records.iter().find(|r| r.id == id).cloned())
    }

    async fn groups(&self, queue: Option<&str>) -> Result<Vec<DeadLetterGroup>, Self::Error> {
        let state = self.letters();
        Ok(group_dead_letters(
            state
                .records
                .iter()
                .filter(|r| r.is_open() && queue.is_none_or(|q| r.letter.queue == q))
                .map(|r| {
                    let l = &r.letter;
                    (
                        l.consumer.clone(),
                        l.event_type.clone(),
                        l.reason.clone(),
                        1,
                        l.dead_lettered_at,
                        l.dead_lettered_at,
                    )
                }),
        ))
    }

    async fn mark_replayed(&self, messages: &[ReplayedMessage]) -> Result<u64, Self::Error> {
        let now = Utc::now();
        let mut state = self.letters();
        let mut marked = 0;
        for m in messages {
            let record = state.records.iter_mut().find(|r| {
                let own = r
                    .letter
                    .headers
                    .get("x-outbox-dead-letter-id")
                    .and_then(|id| Uuid::parse_str(id).ok());
                r.is_open()
                    && match m.dead_letter_id {
                        Some(id) => own == Some(id),
                        None => {
                            own.is_none()
                                && m.event_id.is_some()
                                && m.event_id == r.letter.event_id
                                && m.queue == r.letter.queue
                        }
                    }
            });
            if let Some(record) = record {
                record.replayed_at = Some(now);
                marked += 1;
            }
        }
        Ok(marked)
    }

    async fn watermark(&self) -> Result<i64, Self::Error> {
        Ok(self.letters().records.last().map_or(0, |r| r.id))
    }

    async fn mark_purged(&self, queues: &[String], watermark: i64) -> Result<u64, Self::Error> {
        let now = Utc::now();
        let mut state = self.letters();
        let mut marked = 0;
        for record in state.records.iter_mut() {
            if record.is_open() && queues.contains(&record.letter.queue) && record.id <= watermark {
                record.purged_at = Some(now);
                marked += 1;
            }
        }
        Ok(marked)
    }

    async fn begin_audit(&self, entry: &AuditEntry) -> Result<i64, Self::Error> {
        let mut state = self.letters();
        let id = state.audit.last().map_or(1, |r| r.id + 1);
        state
            .audit
            .push(AuditRecord::new(id, Utc::now(), entry.clone(), 0));
        Ok(id)
    }

    async fn record_audit(
        &self,
        audit: i64,
        count: u64,
        outcome: Option<&str>,
    ) -> Result<(), Self::Error> {
        let mut state = self.letters();
        if let Some(row) = state.audit.iter_mut().find(|r| r.id == audit) {
            row.count = count;
            if let Some(outcome) = outcome {
                *row = row.clone().finished(Utc::now(), outcome);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn duplicates_per_consumer_and_rollback() {
        let inbox = InMemoryInbox::new();
        let id = Uuid::now_v7();

        let mut tx = inbox.begin();
        assert_eq!(
            InboxStore::receive(&inbox, &mut tx, "a", id).await,
            Ok(InboxOutcome::FirstTime)
        );
        assert_eq!(
            InboxStore::receive(&inbox, &mut tx, "a", id).await,
            Ok(InboxOutcome::Duplicate)
        );
        drop(tx); // rolled back
        assert!(inbox.is_empty());
        assert!(!inbox.contains("a", id));

        let mut tx = inbox.begin();
        assert_eq!(
            InboxStore::receive(&inbox, &mut tx, "a", id).await,
            Ok(InboxOutcome::FirstTime)
        );
        tx.commit();
        let mut tx = inbox.begin();
        assert_eq!(
            InboxStore::receive(&inbox, &mut tx, "a", id).await,
            Ok(InboxOutcome::Duplicate)
        );
        assert_eq!(
            InboxStore::receive(&inbox, &mut tx, "b", id).await,
            Ok(InboxOutcome::FirstTime)
        );
        tx.commit();
        assert_eq!(inbox.len(), 2);
    }

    #[tokio::test]
    async fn receive_all_answers_each_id_in_order() {
        let inbox = InMemoryInbox::new();
        let (known, new, twice) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        let mut tx = InboxDatabase::begin(&inbox).await.unwrap();
        InboxDatabase::receive(&inbox, &mut tx, "a", known)
            .await
            .unwrap();
        tx.commit();
        let mut tx = InboxDatabase::begin(&inbox).await.unwrap();
        let outcomes =
            InboxDatabase::receive_all(&inbox, &mut tx, "a", &[known, new, twice, twice])
                .await
                .unwrap();
        use InboxOutcome::{Duplicate, FirstTime};
        assert_eq!(outcomes, [Duplicate, FirstTime, FirstTime, Duplicate]);
        tx.commit();
        assert_eq!(inbox.len(), 3);
    }

    #[tokio::test]
    async fn dead_letters_are_kept_in_order() {
        let inbox = InMemoryInbox::new();
        for reason in ["first", "second"] {
            let letter = DeadLetter::new("a", "q", "q.dlx", "k", reason, b"{}");
            InboxDatabase::record_dead_letter(&inbox, &letter)
                .await
                .unwrap();
        }
        let reasons: Vec<String> = inbox.dead_letters().into_iter().map(|l| l.reason).collect();
        assert_eq!(reasons, ["first", "second"]);
        // Clones share them, as they share the entries.
        assert_eq!(inbox.clone().dead_letters().len(), 2);
    }
}
