//! [`MysqlDeadLetters`]: consumers' dead letters on MariaDB
//! (`inbox_dead_letters`), recorded by
//! [`MysqlInboxDatabase`](super::MysqlInboxDatabase), read and settled
//! here.

use std::sync::Arc;

use chrono::NaiveDateTime;
use diesel::sql_types::{BigInt, Bool, Datetime, Integer, Nullable, Text};
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};
use outbox_core::admin::{
    AuditEntry, DeadLetterGroup, DeadLetterQuery, DeadLetterRecord, DeadLetterStore, Page,
    ReplayedMessage, group_dead_letters,
};
use serde_json::json;

use super::audit;
use super::sql::MysqlSql;
use super::sql::admin::MysqlAuditSql;
use super::sql::dead_letters::MysqlDeadLetterSql;
use crate::rows::{GROUP_ROWS, LetterFields, letter_page};
use crate::{Error, Result};

/// Consumers' dead letters as
/// [`MysqlInboxDatabase`](super::MysqlInboxDatabase) recorded them, as a
/// [`DeadLetterStore`]: list, show and group them, and mark them replayed
/// or purged when [`DeadLetters`](outbox_core::admin::DeadLetters) replays
/// or purges the queue (the broker's queue holds the messages; these rows
/// are their index, and listing them never touches the queue). Audit rows
/// go to `outbox_audit` in the same database. The counterpart of
/// `PgDeadLetters`.
///
/// "Open" rows are neither replayed nor purged. Open rows are never
/// deleted; the [`Janitor`](outbox_core::admin::Janitor) deletes replayed
/// and purged ones past the inbox retention.
///
/// On MariaDB a dead letter's own id (header `x-outbox-dead-letter-id`) is
/// matched through a stored column cut to 255 characters (the consumer
/// writes a 36-character UUID there), and a payload keeps NUL characters
/// (PostgreSQL's text cannot: there they become U+FFFD).
///
/// ```no_run
/// use outbox_core::admin::{DeadLetterQuery, DeadLetterStore as _};
/// use outbox_diesel::mysql::{self, MysqlDeadLetters};
///
/// # async fn run() -> outbox_diesel::Result<()> {
/// let letters = MysqlDeadLetters::new(mysql::pool("mysql://shop:secret@127.0.0.1/shop", 2)?);
/// let page = letters
///     .list(&DeadLetterQuery::new().queue("loyalty.orders").limit(50))
///     .await?;
/// for record in &page.items {
///     tracing::info!(id = record.id, reason = %record.letter.reason, "dead letter");
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MysqlDeadLetters {
    pool: Pool<AsyncMysqlConnection>,
    sql: Arc<MysqlDeadLetterSql>,
    audit: Arc<MysqlAuditSql>,
}

impl std::fmt::Debug for MysqlDeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlDeadLetters")
            .field("table", &self.sql.table)
            .finish_non_exhaustive()
    }
}

#[derive(diesel::QueryableByName)]
struct DeadLetterRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    consumer: String,
    #[diesel(sql_type = Text)]
    queue: String,
    #[diesel(sql_type = Text)]
    exchange: String,
    #[diesel(sql_type = Text)]
    routing_key: String,
    #[diesel(sql_type = Nullable<Text>)]
    event_id: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    message_id: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    event_type: Option<String>,
    #[diesel(sql_type = Integer)]
    attempts: i32,
    #[diesel(sql_type = Text)]
    reason: String,
    #[diesel(sql_type = Text)]
    headers: String,
    #[diesel(sql_type = Text)]
    payload: String,
    #[diesel(sql_type = Bool)]
    payload_truncated: bool,
    #[diesel(sql_type = Datetime)]
    dead_lettered_at: NaiveDateTime,
    #[diesel(sql_type = Nullable<Datetime>)]
    replayed_at: Option<NaiveDateTime>,
    #[diesel(sql_type = Nullable<Datetime>)]
    purged_at: Option<NaiveDateTime>,
}

impl From<DeadLetterRow> for LetterFields {
    fn from(row: DeadLetterRow) -> Self {
        LetterFields {
            id: row.id,
            consumer: row.consumer,
            queue: row.queue,
            exchange: row.exchange,
            routing_key: row.routing_key,
            event_id: row.event_id.and_then(|id| id.parse().ok()),
            message_id: row.message_id,
            event_type: row.event_type,
            attempts: row.attempts,
            reason: row.reason,
            headers: serde_json::from_str(&row.headers).unwrap_or_default(),
            payload: row.payload,
            payload_truncated: row.payload_truncated,
            dead_lettered_at: row.dead_lettered_at.and_utc(),
            replayed_at: row.replayed_at.map(|t| t.and_utc()),
            purged_at: row.purged_at.map(|t| t.and_utc()),
        }
    }
}

#[derive(diesel::QueryableByName)]
struct GroupRow {
    #[diesel(sql_type = Text)]
    consumer: String,
    #[diesel(sql_type = Nullable<Text>)]
    event_type: Option<String>,
    #[diesel(sql_type = Text)]
    reason: String,
    #[diesel(sql_type = BigInt)]
    n: i64,
    #[diesel(sql_type = Datetime)]
    first: NaiveDateTime,
    #[diesel(sql_type = Datetime)]
    last: NaiveDateTime,
}

#[derive(diesel::QueryableByName)]
struct Max {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

impl MysqlDeadLetters {
    /// The dead letters in the connection's own database (its URL's), on
    /// `pool`.
    pub fn new(pool: Pool<AsyncMysqlConnection>) -> Self {
        MysqlDeadLetters::from_sql(pool, &MysqlSql::default_database())
    }

    /// The dead letters in `database` (on the connection's server), on
    /// `pool`.
    ///
    /// # Errors
    /// [`Error::Config`] if `database` is empty, longer than 64 bytes or
    /// contains NUL.
    pub fn with_database(pool: Pool<AsyncMysqlConnection>, database: &str) -> Result<Self> {
        Ok(MysqlDeadLetters::from_sql(
            pool,
            &MysqlSql::new(Some(database))?,
        ))
    }

    /// The dead letters on `shared` (of
    /// [`MysqlSettings::dead_letters`](super::MysqlSettings::dead_letters)).
    pub(crate) fn from_sql(pool: Pool<AsyncMysqlConnection>, shared: &MysqlSql) -> Self {
        MysqlDeadLetters {
            pool,
            sql: Arc::new(MysqlDeadLetterSql::new(shared)),
            audit: Arc::new(MysqlAuditSql::new(shared)),
        }
    }

    async fn conn(&self) -> Result<Object<AsyncMysqlConnection>> {
        self.pool.get().await.map_err(Error::Pool)
    }
}

impl DeadLetterStore for MysqlDeadLetters {
    type Error = Error;

    /// Without payloads, the payload and headers columns are not read.
    async fn list(&self, query: &DeadLetterQuery) -> Result<Page<DeadLetterRecord>> {
        let sql = if query.payloads {
            &self.sql.list
        } else {
            &self.sql.list_without_payloads
        };
        let limit = query.limit.max(1);
        let rows: Vec<DeadLetterRow> = diesel::sql_query(sql)
            .bind::<Nullable<Text>, _>(query.queue.as_deref())
            .bind::<Nullable<Text>, _>(query.queue.as_deref())
            .bind::<BigInt, _>(query.after.unwrap_or(0))
            .bind::<Bool, _>(query.include_settled)
            .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1))
            .load(&mut *self.conn().await?)
            .await?;
        Ok(letter_page(
            rows.into_iter().map(LetterFields::from),
            limit,
            query.payloads,
        ))
    }

    async fn show(&self, id: i64) -> Result<Option<DeadLetterRecord>> {
        let rows: Vec<DeadLetterRow> = diesel::sql_query(&self.sql.show)
            .bind::<BigInt, _>(id)
            .load(&mut *self.conn().await?)
            .await?;
        Ok(rows
            .into_iter()
            .next()
            .map(|row| DeadLetterRecord::from(LetterFields::from(row))))
    }

    async fn groups(&self, queue: Option<&str>) -> Result<Vec<DeadLetterGroup>> {
        let rows: Vec<GroupRow> = diesel::sql_query(&self.sql.groups)
            .bind::<Nullable<Text>, _>(queue)
            .bind::<Nullable<Text>, _>(queue)
            .bind::<BigInt, _>(GROUP_ROWS)
            .load(&mut *self.conn().await?)
            .await?;
        Ok(group_dead_letters(rows.into_iter().map(|r| {
            (
                r.consumer,
                r.event_type,
                r.reason,
                u64::try_from(r.n).unwrap_or(0),
                r.first.and_utc(),
                r.last.and_utc(),
            )
        })))
    }

    /// In one statement: the records with the dead letters' own ids
    /// (header `x-outbox-dead-letter-id`, indexed), and, for messages
    /// without such an id, the oldest open record without one of their
    /// event in the queue they went back to, one per message.
    async fn mark_replayed(&self, messages: &[ReplayedMessage]) -> Result<u64> {
        let letters: Vec<String> = messages
            .iter()
            .filter_map(|m| m.dead_letter_id)
            .map(|id| id.to_string())
            .collect();
        let pairs: Vec<serde_json::Value> = messages
            .iter()
            .filter(|m| m.dead_letter_id.is_none())
            .filter_map(|m| m.event_id.map(|id| json!([id.to_string(), m.queue])))
            .collect();
        if letters.is_empty() && pairs.is_empty() {
            return Ok(0);
        }
        let changed = diesel::sql_query(&self.sql.mark_replayed)
            .bind::<Text, _>(serde_json::Value::from(letters).to_string())
            .bind::<Text, _>(serde_json::Value::from(pairs).to_string())
            .execute(&mut *self.conn().await?)
            .await?;
        Ok(changed as u64)
    }

    async fn watermark(&self) -> Result<i64> {
        let row: Max = diesel::sql_query(&self.sql.watermark)
            .get_result(&mut *self.conn().await?)
            .await?;
        Ok(row.id)
    }

    /// Take `watermark` from [`watermark`](DeadLetterStore::watermark) just
    /// before purging the queue: a record is written after its message
    /// reached the dead-letter queue, so the records up to it are of
    /// messages the purge deleted, and later ones stay open.
    async fn mark_purged(&self, queues: &[String], watermark: i64) -> Result<u64> {
        if queues.is_empty() {
            return Ok(0);
        }
        let changed = diesel::sql_query(&self.sql.mark_purged)
            .bind::<Text, _>(serde_json::Value::from(queues).to_string())
            .bind::<BigInt, _>(watermark)
            .execute(&mut *self.conn().await?)
            .await?;
        Ok(changed as u64)
    }

    async fn begin_audit(&self, entry: &AuditEntry) -> Result<i64> {
        audit::begin(&mut *self.conn().await?, &self.audit, entry).await
    }

    async fn record_audit(&self, audit: i64, count: u64, outcome: Option<&str>) -> Result<()> {
        audit::record(
            &mut *self.conn().await?,
            &self.audit,
            audit,
            Some(count),
            outcome,
        )
        .await
    }
}
