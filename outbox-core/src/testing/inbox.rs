//! [`InMemoryInbox`]: an [`InboxStore`] with transaction semantics.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

use uuid::Uuid;

use crate::admin::DeadLetter;
use crate::{InboxDatabase, InboxOutcome, InboxStore};

/// An in-memory inbox. Entries written through an [`InboxTx`] become visible
/// to other transactions only when it is [committed](InboxTx::commit); a
/// dropped transaction rolls back. Dead letters the consumer records are
/// kept in order ([`dead_letters`](Self::dead_letters)).
#[derive(Debug, Clone, Default)]
pub struct InMemoryInbox {
    seen: Arc<Mutex<HashSet<(String, Uuid)>>>,
    dead_letters: Arc<Mutex<Vec<DeadLetter>>>,
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
        self.dead_letters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
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
        self.dead_letters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(letter.clone());
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
