//! [`MysqlInbox`] and [`MysqlInboxDatabase`]: consumer-side deduplication
//! on MariaDB.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Bool, Datetime, Integer, Nullable, Text};
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};
use outbox_core::admin::DeadLetter;
use outbox_core::{InboxDatabase, InboxOutcome, InboxStore};
use uuid::Uuid;

use super::record::rolled_back;
use super::sql::MysqlSql;
use crate::connection::in_transaction;
use crate::prepared::PreparedExt;
use crate::{Error, MysqlTransaction, Result};

/// The inbox of one MariaDB database: which events each consumer has
/// received, so that a redelivered event is handled once. The
/// counterpart of `PgInbox`.
///
/// A delivery is one `INSERT … ON DUPLICATE KEY UPDATE duplicates =
/// duplicates + 1` (not `INSERT IGNORE`, which would turn every other
/// error, a truncation or a missing table included, into a warning): the
/// row's `duplicates` counts redeliveries.
#[derive(Clone)]
pub struct MysqlInbox {
    sql: Arc<MysqlSql>,
    prepare: bool,
}

impl std::fmt::Debug for MysqlInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlInbox")
            .field("database", &self.sql.database)
            .field("prepare", &self.prepare)
            .finish()
    }
}

impl Default for MysqlInbox {
    fn default() -> Self {
        MysqlInbox::from_sql(MysqlSql::default_database(), true)
    }
}

impl MysqlInbox {
    pub(crate) fn from_sql(sql: Arc<MysqlSql>, prepare: bool) -> Self {
        MysqlInbox { sql, prepare }
    }

    /// Deletes up to `limit` entries received before `before`, oldest
    /// first; returns how many. Call it in a loop, outside a long
    /// transaction, to purge in bounded chunks.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn purge(
        &self,
        conn: &mut AsyncMysqlConnection,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<u64> {
        let deleted = diesel::sql_query(&self.sql.inbox_purge)
            .bind::<Datetime, _>(before.naive_utc())
            .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
            .execute(conn)
            .await?;
        Ok(deleted as u64)
    }

    /// Records a dead-lettered message in `inbox_dead_letters`, in its own
    /// statement.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn record_dead_letter(
        &self,
        conn: &mut AsyncMysqlConnection,
        letter: &DeadLetter,
    ) -> Result<()> {
        let headers: serde_json::Map<String, serde_json::Value> = letter
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
            .collect();
        diesel::sql_query(&self.sql.dead_letter_insert)
            .bind::<Text, _>(&letter.consumer)
            .bind::<Text, _>(&letter.queue)
            .bind::<Text, _>(&letter.exchange)
            .bind::<Text, _>(&letter.routing_key)
            .bind::<Nullable<Text>, _>(letter.event_id.map(|id| id.to_string()))
            .bind::<Nullable<Text>, _>(letter.message_id.as_deref())
            .bind::<Nullable<Text>, _>(letter.event_type.as_deref())
            .bind::<Integer, _>(i32::try_from(letter.attempts).unwrap_or(i32::MAX))
            .bind::<Text, _>(&letter.reason)
            .bind::<Text, _>(serde_json::Value::Object(headers).to_string())
            .bind::<Text, _>(&letter.payload)
            .bind::<Bool, _>(letter.payload_truncated)
            .bind::<Datetime, _>(letter.dead_lettered_at.naive_utc())
            .execute(conn)
            .await?;
        Ok(())
    }
}

impl InboxStore for MysqlInbox {
    type Connection = AsyncMysqlConnection;
    type Error = Error;

    async fn receive(
        &self,
        conn: &mut AsyncMysqlConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<InboxOutcome> {
        in_transaction(conn)?;
        let affected = diesel::sql_query(&self.sql.inbox_insert)
            .bind::<Text, _>(consumer)
            .bind::<Text, _>(event_id.to_string())
            .prepared(self.prepare)
            .execute(conn)
            .await?;
        match affected {
            1 => Ok(InboxOutcome::FirstTime),
            2 => Ok(InboxOutcome::Duplicate),
            0 => Err(rolled_back()),
            n => Err(Error::Config(format!(
                "the inbox INSERT affected {n} rows (1 or 2 expected): was the connection \
                 opened without CLIENT_FOUND_ROWS?"
            ))),
        }
    }
}

/// [`MysqlInbox`] with a pool: the database an `InboxConsumer` runs its
/// handlers in, each in a [`MysqlTransaction`] (`&mut *tx` is a
/// `&mut AsyncMysqlConnection`).
#[derive(Clone)]
pub struct MysqlInboxDatabase {
    pool: Pool<AsyncMysqlConnection>,
    inbox: MysqlInbox,
}

impl std::fmt::Debug for MysqlInboxDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlInboxDatabase")
            .field("inbox", &self.inbox)
            .finish_non_exhaustive()
    }
}

impl MysqlInboxDatabase {
    /// Handlers' transactions from `pool`, deliveries recorded in `inbox`.
    pub fn new(pool: Pool<AsyncMysqlConnection>, inbox: MysqlInbox) -> Self {
        MysqlInboxDatabase { pool, inbox }
    }
}

impl InboxDatabase for MysqlInboxDatabase {
    type Tx = MysqlTransaction;
    type Error = Error;

    async fn begin(&self) -> Result<MysqlTransaction> {
        MysqlTransaction::begin(&self.pool).await
    }

    async fn receive(
        &self,
        tx: &mut MysqlTransaction,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<InboxOutcome> {
        InboxStore::receive(&self.inbox, tx, consumer, event_id).await
    }

    async fn commit(&self, tx: MysqlTransaction) -> Result<()> {
        tx.commit().await
    }

    async fn rollback(&self, tx: MysqlTransaction) -> Result<()> {
        tx.rollback().await
    }

    async fn record_dead_letter(&self, letter: &DeadLetter) -> Result<()> {
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        self.inbox.record_dead_letter(&mut conn, letter).await
    }
}
