//! Consumer-side deduplication: [`InboxStore`] and [`InboxDatabase`].

use std::future::Future;

use uuid::Uuid;

use crate::admin::DeadLetter;

/// Whether a consumer sees a message for the first time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InboxOutcome {
    /// Not seen before: run the handler (in the same transaction).
    FirstTime,
    /// Already processed and committed: skip the handler, acknowledge.
    Duplicate,
}

/// Consumer-side deduplication (the inbox).
///
/// [`receive`](Self::receive) runs inside the consumer's transaction, before
/// its handler: if that transaction rolls back, the inbox entry goes with it
/// and a redelivery is `FirstTime` again.
pub trait InboxStore: Send + Sync {
    /// The connection (inside an open transaction) the entry is written on.
    type Connection: Send;
    /// The store's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Records that `consumer` received `event_id`.
    fn receive(
        &self,
        conn: &mut Self::Connection,
        consumer: &str,
        event_id: Uuid,
    ) -> impl Future<Output = Result<InboxOutcome, Self::Error>> + Send;
}

/// Transactions for consumers: begin one, record the inbox entry in it, run
/// the handler on it, commit. Lets a broker adapter (the RabbitMQ
/// `InboxConsumer`) run handlers in database transactions without depending
/// on a database crate.
///
/// Dropping a [`Tx`](Self::Tx) without [`commit`](Self::commit) must roll
/// it back. Implementations: `outbox-diesel`'s `PgInboxDatabase` and, for
/// tests, `testing::InMemoryInbox`.
pub trait InboxDatabase: Send + Sync + 'static {
    /// An open transaction; the handler works on it.
    type Tx: Send;
    /// The database's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Opens a transaction.
    fn begin(&self) -> impl Future<Output = Result<Self::Tx, Self::Error>> + Send;

    /// Records in `tx` that `consumer` received `event_id` (see
    /// [`InboxStore::receive`]).
    fn receive(
        &self,
        tx: &mut Self::Tx,
        consumer: &str,
        event_id: Uuid,
    ) -> impl Future<Output = Result<InboxOutcome, Self::Error>> + Send;

    /// Records in `tx` that `consumer` received each of `event_ids`,
    /// answering for each in the same order; an id that appears twice is
    /// `Duplicate` the second time. For consumers that apply several
    /// events in one transaction (the RabbitMQ `InboxConsumer`'s batch
    /// mode): a database that can record them in one statement overrides
    /// it (`PgInboxDatabase` does: one round trip instead of one per
    /// event). The default calls [`receive`](Self::receive) for each, in
    /// order, and stops at the first error.
    fn receive_all(
        &self,
        tx: &mut Self::Tx,
        consumer: &str,
        event_ids: &[Uuid],
    ) -> impl Future<Output = Result<Vec<InboxOutcome>, Self::Error>> + Send {
        async move {
            let mut outcomes = Vec::with_capacity(event_ids.len());
            for &event_id in event_ids {
                outcomes.push(self.receive(tx, consumer, event_id).await?);
            }
            Ok(outcomes)
        }
    }

    /// Commits `tx`.
    fn commit(&self, tx: Self::Tx) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Rolls `tx` back. The default drops it (which must roll back);
    /// implementations override it when an explicit rollback is cheaper
    /// (e.g. keeps a pooled connection).
    fn rollback(&self, tx: Self::Tx) -> impl Future<Output = Result<(), Self::Error>> + Send {
        drop(tx);
        std::future::ready(Ok(()))
    }

    /// Records a message the consumer dead-lettered, once the broker
    /// confirmed its copy in the dead-letter exchange and before the
    /// consumer acks the delivery. Outside any handler transaction (its own
    /// short statement). The broker's copy is the truth, this the index
    /// operators list and group: the consumer logs a failure and acks
    /// anyway. The default records nothing.
    fn record_dead_letter(
        &self,
        letter: &DeadLetter,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        let _ = letter;
        std::future::ready(Ok(()))
    }
}
