//! [`PgInbox`]: consumer-side deduplication on PostgreSQL.

use std::collections::HashSet;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Text, Timestamptz};
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_core::admin::DeadLetter;
use outbox_core::{InboxDatabase, InboxOutcome, InboxStore};
use uuid::Uuid;

use crate::connection::in_transaction;
use crate::prepared::PreparedExt;
use crate::schema::Schema;
use crate::sql::Sql;
use crate::{Error, PgTransaction, Result};

/// The inbox (`inbox_events`): one row per `(consumer, event_id)`.
///
/// [`receive`](InboxStore::receive) runs `INSERT … ON CONFLICT DO NOTHING`
/// inside the consumer's transaction: one row inserted means first time, none
/// means duplicate. If the consumer's transaction rolls back, so does the
/// entry, and a redelivery is first-time again. A batch consumer's entries
/// ([`PgInboxDatabase`]'s `receive_all`) go in one statement,
/// `INSERT … SELECT unnest(…) ON CONFLICT DO NOTHING RETURNING event_id`:
/// the ids returned are first time.
///
/// **Retention**: keep inbox rows at least as long as the broker may
/// redeliver a message (the longest a message can sit unacknowledged or in a
/// retry/dead-letter loop and come back), plus the time a producer may
/// publish a duplicate (the relay's claim timeout and retries). Purge older
/// rows with [`purge`](Self::purge).
///
/// ```no_run
/// use diesel_async::{AsyncConnection, AsyncPgConnection};
/// use outbox_core::{InboxOutcome, InboxStore};
/// use outbox_diesel::PgInbox;
///
/// # async fn run(conn: &mut AsyncPgConnection, event_id: uuid::Uuid) -> Result<(), outbox_diesel::Error> {
/// let inbox = PgInbox::default();
/// conn.transaction::<_, outbox_diesel::Error, _>(async |conn| {
///     if inbox.receive(conn, "loyalty", event_id).await? == InboxOutcome::FirstTime {
///         // ... apply the effect on `conn`, in the same transaction ...
///     }
///     Ok(())
/// })
/// .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PgInbox {
    schema: Schema,
    /// The schema's SQL, shared with the other parts of its settings.
    pub(crate) sql: Arc<Sql>,
    prepare: bool,
}

impl std::fmt::Debug for PgInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgInbox")
            .field("schema", &self.schema.name())
            .field("prepare", &self.prepare)
            .finish_non_exhaustive()
    }
}

impl Default for PgInbox {
    fn default() -> Self {
        PgInbox::from_sql(Sql::public())
    }
}

impl PgInbox {
    /// The inbox in `schema`.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid schema name.
    pub fn new(schema: &str) -> Result<Self> {
        Ok(PgInbox::from_sql(Sql::for_schema(&Schema::new(schema)?)))
    }

    /// The inbox on `sql` (of [`PgSettings::inbox`](crate::PgSettings::inbox)).
    pub(crate) fn from_sql(sql: Arc<Sql>) -> Self {
        PgInbox {
            schema: sql.schema.clone(),
            sql,
            prepare: true,
        }
    }

    /// Whether the inbox `INSERT` stays prepared on each connection
    /// (default on: one round trip per message instead of two). Turn it off
    /// behind PgBouncer in transaction pooling mode older than 1.21 (or
    /// without `max_prepared_statements`).
    #[must_use]
    pub fn prepared_statements(mut self, on: bool) -> Self {
        self.prepare = on;
        self
    }

    /// The schema of this inbox.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// `true` when the inbox `INSERT` stays prepared on each connection.
    pub fn prepares_statements(&self) -> bool {
        self.prepare
    }

    /// Deletes up to `limit` entries received before `before`; returns how
    /// many. Call repeatedly until it returns less than `limit`.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn purge(
        &self,
        conn: &mut AsyncPgConnection,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<u64> {
        let deleted = diesel::sql_query(&self.sql.inbox.purge)
            .bind::<Timestamptz, _>(before)
            .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
            .execute(conn)
            .await?;
        Ok(deleted as u64)
    }

    /// Records a consumer's dead letter in `inbox_dead_letters` (read them
    /// with [`PgDeadLetters`](crate::PgDeadLetters)), in its own statement:
    /// call it outside the handler's transaction, which may roll back.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn record_dead_letter(
        &self,
        conn: &mut AsyncPgConnection,
        letter: &DeadLetter,
    ) -> Result<()> {
        crate::dead_letters::insert(conn, &self.sql.dead_letters, letter).await
    }
}

impl PgInbox {
    /// [`InboxDatabase::receive_all`] in one statement
    /// (`INSERT … SELECT unnest(…) ON CONFLICT DO NOTHING RETURNING`): the
    /// ids it returns were inserted (first time), the others are
    /// duplicates; an id given twice is a duplicate the second time.
    async fn receive_all(
        &self,
        conn: &mut AsyncPgConnection,
        consumer: &str,
        event_ids: &[Uuid],
    ) -> Result<Vec<InboxOutcome>> {
        #[derive(QueryableByName)]
        struct Inserted {
            #[diesel(sql_type = diesel::sql_types::Uuid)]
            event_id: Uuid,
        }
        in_transaction(conn)?;
        let inserted: Vec<Inserted> = diesel::sql_query(&self.sql.inbox.insert_all)
            .bind::<Text, _>(consumer)
            .bind::<Array<diesel::sql_types::Uuid>, _>(event_ids)
            .prepared(self.prepare)
            .load(conn)
            .await?;
        let mut first: HashSet<Uuid> = inserted.into_iter().map(|row| row.event_id).collect();
        Ok(event_ids
            .iter()
            .map(|event_id| {
                if first.remove(event_id) {
                    InboxOutcome::FirstTime
                } else {
                    InboxOutcome::Duplicate
                }
            })
            .collect())
    }
}

impl InboxStore for PgInbox {
    type Connection = AsyncPgConnection;
    type Error = Error;

    async fn receive(
        &self,
        conn: &mut AsyncPgConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<InboxOutcome> {
        in_transaction(conn)?;
        let inserted = diesel::sql_query(&self.sql.inbox.insert)
            .bind::<Text, _>(consumer)
            .bind::<diesel::sql_types::Uuid, _>(event_id)
            .prepared(self.prepare)
            .execute(conn)
            .await?;
        Ok(if inserted == 1 {
            InboxOutcome::FirstTime
        } else {
            InboxOutcome::Duplicate
        })
    }
}

/// [`InboxDatabase`] on a pool: what an inbox consumer (e.g. `outbox-lapin`'s
/// `InboxConsumer`) uses to run each handler in a transaction that also
/// records the inbox entry. Handlers get the [`PgTransaction`], usable as a
/// `&mut AsyncPgConnection`, and may [`record`](crate::Outbox::record)
/// new events on it.
#[derive(Clone)]
pub struct PgInboxDatabase {
    pool: Pool<AsyncPgConnection>,
    inbox: PgInbox,
}

impl std::fmt::Debug for PgInboxDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgInboxDatabase")
            .field("inbox", &self.inbox)
            .finish_non_exhaustive()
    }
}

impl PgInboxDatabase {
    /// Transactions on `pool`, inbox entries in `inbox`.
    pub fn new(pool: Pool<AsyncPgConnection>, inbox: PgInbox) -> Self {
        PgInboxDatabase { pool, inbox }
    }
}

impl InboxDatabase for PgInboxDatabase {
    type Tx = PgTransaction;
    type Error = Error;

    async fn begin(&self) -> Result<PgTransaction> {
        PgTransaction::begin(&self.pool).await
    }

    async fn receive(
        &self,
        tx: &mut PgTransaction,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<InboxOutcome> {
        let received = InboxStore::receive(&self.inbox, &mut **tx, consumer, event_id).await;
        // A read-only answer (a standby, a fenced old primary): the
        // consumer's rollback then closes the connection, not pools it.
        tx.note(&received);
        received
    }

    /// One statement for all of them (see [`PgInbox`]).
    async fn receive_all(
        &self,
        tx: &mut PgTransaction,
        consumer: &str,
        event_ids: &[Uuid],
    ) -> Result<Vec<InboxOutcome>> {
        let received = self.inbox.receive_all(tx, consumer, event_ids).await;
        tx.note(&received);
        received
    }

    async fn commit(&self, tx: PgTransaction) -> Result<()> {
        tx.commit().await
    }

    async fn rollback(&self, tx: PgTransaction) -> Result<()> {
        tx.rollback().await
    }

    /// On a pooled connection of its own, outside any transaction. A
    /// read-only answer closes that connection rather than pooling it.
    async fn record_dead_letter(&self, letter: &DeadLetter) -> Result<()> {
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        let recorded = self.inbox.record_dead_letter(&mut conn, letter).await;
        if let Err(error) = &recorded
            && error.is_read_only()
        {
            tracing::warn!(
                "the database is read-only (a standby?): closing the connection; new ones go \
                 to a server that takes writes (target_session_attrs=read-write)"
            );
            drop(deadpool::managed::Object::take(conn));
        }
        recorded
    }
}
