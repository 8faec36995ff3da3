//! [`SqliteInbox`] and [`SqliteInboxDatabase`]: consumer-side
//! deduplication on SQLite.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Bool, Integer, Nullable, Text};
use diesel::sqlite::Sqlite;
use diesel_async::RunQueryDsl;
use diesel_async::pooled_connection::deadpool::Pool;
use outbox_core::admin::DeadLetter;
use outbox_core::{InboxDatabase, InboxOutcome, InboxStore};
use uuid::Uuid;

use super::AsyncSqliteConnection;
use super::record::rolled_back;
use super::sql::{SqliteSql, micros};
use crate::connection::{in_transaction, sqlite_execute_if_open};
use crate::prepared::PreparedExt;
use crate::{Error, Result, SqliteTransaction};

/// The inbox of one SQLite database: which events each consumer has
/// received, so that a redelivered event is handled once. The
/// counterpart of `PgInbox`.
///
/// A delivery is one `INSERT … ON CONFLICT DO NOTHING` on the primary key
/// (consumer, event id): one row changed is the first time, none a
/// duplicate. Consumers are compared byte for byte (`"billing"`,
/// `"Billing"` and `"billing "` are three consumers).
#[derive(Clone)]
pub struct SqliteInbox {
    sql: Arc<SqliteSql>,
    prepare: bool,
}

impl std::fmt::Debug for SqliteInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteInbox")
            .field("prepare", &self.prepare)
            .finish()
    }
}

impl Default for SqliteInbox {
    fn default() -> Self {
        SqliteInbox::from_sql(SqliteSql::shared(), true)
    }
}

impl SqliteInbox {
    pub(crate) fn from_sql(sql: Arc<SqliteSql>, prepare: bool) -> Self {
        SqliteInbox { sql, prepare }
    }

    /// Deletes up to `limit` entries received before `before`, oldest
    /// first; returns how many. Call it in a loop, outside a long
    /// transaction (it takes the write lock), to purge in bounded chunks.
    ///
    /// # Errors
    /// [`Error::Database`].
    pub async fn purge(
        &self,
        conn: &mut AsyncSqliteConnection,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<u64> {
        let deleted = diesel::sql_query(&self.sql.inbox_purge)
            .bind::<BigInt, _>(micros(before))
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
        conn: &mut AsyncSqliteConnection,
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
            .bind::<BigInt, _>(micros(letter.dead_lettered_at))
            .execute(conn)
            .await?;
        Ok(())
    }
}

impl InboxStore for SqliteInbox {
    type Connection = AsyncSqliteConnection;
    type Error = Error;

    async fn receive(
        &self,
        conn: &mut AsyncSqliteConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<InboxOutcome> {
        in_transaction(conn)?;
        // In autocommit the entry would commit on its own, without the
        // handler's work: the event would be lost.
        let query = diesel::sql_query(self.sql.inbox_insert.clone())
            .into_boxed::<Sqlite>()
            .bind::<Text, _>(consumer.to_owned())
            .bind::<Text, _>(event_id.to_string())
            .bind::<BigInt, _>(micros(Utc::now()))
            .prepared(self.prepare);
        let changed = sqlite_execute_if_open(conn, query)
            .await?
            .ok_or_else(rolled_back)?;
        match changed {
            1 => Ok(InboxOutcome::FirstTime),
            0 => Ok(InboxOutcome::Duplicate),
            n => Err(Error::Config(format!(
                "the inbox INSERT changed {n} rows (0 or 1 expected)"
            ))),
        }
    }
}

/// [`SqliteInbox`] with a pool: the database an `InboxConsumer` runs its
/// handlers in, each in a [`SqliteTransaction`] (`&mut *tx` is a
/// `&mut AsyncSqliteConnection`).
#[derive(Clone)]
pub struct SqliteInboxDatabase {
    pool: Pool<AsyncSqliteConnection>,
    inbox: SqliteInbox,
}

impl std::fmt::Debug for SqliteInboxDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteInboxDatabase")
            .field("inbox", &self.inbox)
            .finish_non_exhaustive()
    }
}

impl SqliteInboxDatabase {
    /// Handlers' transactions from `pool`, deliveries recorded in `inbox`.
    pub fn new(pool: Pool<AsyncSqliteConnection>, inbox: SqliteInbox) -> Self {
        SqliteInboxDatabase { pool, inbox }
    }
}

impl InboxDatabase for SqliteInboxDatabase {
    type Tx = SqliteTransaction;
    type Error = Error;

    async fn begin(&self) -> Result<SqliteTransaction> {
        SqliteTransaction::begin(&self.pool).await
    }

    async fn receive(
        &self,
        tx: &mut SqliteTransaction,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<InboxOutcome> {
        InboxStore::receive(&self.inbox, tx, consumer, event_id).await
    }

    async fn commit(&self, tx: SqliteTransaction) -> Result<()> {
        tx.commit().await
    }

    async fn rollback(&self, tx: SqliteTransaction) -> Result<()> {
        tx.rollback().await
    }

    async fn record_dead_letter(&self, letter: &DeadLetter) -> Result<()> {
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        self.inbox.record_dead_letter(&mut conn, letter).await
    }
}
