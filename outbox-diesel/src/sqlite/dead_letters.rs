//! Consumers' dead letters in SQLite (`inbox_dead_letters`): recorded by
//! [`SqliteInboxDatabase`](super::SqliteInboxDatabase), read by
//! [`SqliteDeadLetters`].

use std::sync::Arc;

use diesel::sql_types::{BigInt, Bool, Integer, Nullable, Text};
use diesel_async::RunQueryDsl;
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use outbox_core::admin::{
    AuditEntry, DeadLetterGroup, DeadLetterQuery, DeadLetterRecord, DeadLetterStore, Page,
    ReplayedMessage, group_dead_letters,
};

use super::AsyncSqliteConnection;
use super::audit;
use super::sql::{SqliteAdminSql, SqliteDeadLetterSql, micros, time};
use crate::rows::{GROUP_ROWS, LetterFields, count, letter_page};
use crate::{Error, Result};

/// Consumers' dead letters as
/// [`SqliteInboxDatabase`](super::SqliteInboxDatabase) recorded them, as a
/// [`DeadLetterStore`]: list, show and group them, and mark them replayed
/// or purged when [`DeadLetters`](outbox_core::admin::DeadLetters) replays
/// or purges the queue over `outbox_lapin::DeadLetterQueues` (the broker's
/// queue holds the messages; these rows are their index, and listing them
/// never touches the queue). Audit rows go to `outbox_audit` in the same
/// file. The counterpart of `PgDeadLetters`, with the same behaviour.
///
/// "Open" rows are neither replayed nor purged. Open rows are never
/// deleted; the [`Janitor`](outbox_core::admin::Janitor) deletes replayed
/// and purged ones past the inbox retention.
///
/// ```no_run
/// use outbox_core::admin::{DeadLetterQuery, DeadLetterStore as _};
/// use outbox_diesel::sqlite::{self, SqliteDeadLetters};
///
/// # async fn run() -> outbox_diesel::Result<()> {
/// let letters = SqliteDeadLetters::new(sqlite::pool("sqlite:///var/lib/shop.db", 2)?);
/// let page = letters
///     .list(&DeadLetterQuery::new().queue("loyalty.orders").limit(50))
///     .await?;
/// for record in &page.items {
///     println!("{} {:?} {}", record.id, record.letter.event_type, record.letter.reason);
/// }
/// for group in letters.groups(None).await? {
///     println!("{} × {} {}", group.count, group.consumer, group.reason);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqliteDeadLetters {
    pool: Pool<AsyncSqliteConnection>,
    sql: Arc<SqliteDeadLetterSql>,
    admin: Arc<SqliteAdminSql>,
}

impl std::fmt::Debug for SqliteDeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteDeadLetters")
            .field("table", &"inbox_dead_letters")
            .finish_non_exhaustive()
    }
}

/// A dead-letter row as SQLite stores it (uuid and headers as text, times
/// as µs since the epoch).
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
    #[diesel(sql_type = BigInt)]
    dead_lettered_at: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    replayed_at: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    purged_at: Option<i64>,
}

impl From<DeadLetterRow> for LetterFields {
    fn from(row: DeadLetterRow) -> Self {
        LetterFields {
            id: row.id,
            consumer: row.consumer,
            queue: row.queue,
            exchange: row.exchange,
            routing_key: row.routing_key,
            // The schema checks the uuid's form.
            event_id: row.event_id.and_then(|id| id.parse().ok()),
            message_id: row.message_id,
            event_type: row.event_type,
            attempts: row.attempts,
            reason: row.reason,
            headers: serde_json::from_str(&row.headers).unwrap_or(serde_json::Value::Null),
            payload: row.payload,
            payload_truncated: row.payload_truncated,
            dead_lettered_at: time(row.dead_lettered_at),
            replayed_at: row.replayed_at.map(time),
            purged_at: row.purged_at.map(time),
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
    #[diesel(sql_type = BigInt)]
    first: i64,
    #[diesel(sql_type = BigInt)]
    last: i64,
}

#[derive(diesel::QueryableByName)]
struct Max {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

impl SqliteDeadLetters {
    /// The dead letters of the database file `pool` opens.
    pub fn new(pool: Pool<AsyncSqliteConnection>) -> Self {
        SqliteDeadLetters {
            pool,
            sql: SqliteDeadLetterSql::shared(),
            admin: SqliteAdminSql::shared(),
        }
    }

    async fn conn(&self) -> Result<Object<AsyncSqliteConnection>> {
        self.pool.get().await.map_err(Error::Pool)
    }
}

fn now() -> i64 {
    micros(chrono::Utc::now())
}

impl DeadLetterStore for SqliteDeadLetters {
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
            .bind::<BigInt, _>(GROUP_ROWS)
            .load(&mut *self.conn().await?)
            .await?;
        Ok(group_dead_letters(rows.into_iter().map(|r| {
            let (first, last) = (time(r.first), time(r.last));
            (r.consumer, r.event_type, r.reason, count(r.n), first, last)
        })))
    }

    /// In one statement: the records with the dead letters' own ids
    /// (header `x-outbox-dead-letter-id`, indexed: exactly the moved
    /// messages, undecodable ones and other copies of an event included),
    /// and, for messages without such an id (dead-lettered by the broker, or
    /// before consumers set it), the oldest open record without one of
    /// their event in the queue they went back to, one per message.
    async fn mark_replayed(&self, messages: &[ReplayedMessage]) -> Result<u64> {
        let letters: Vec<String> = messages
            .iter()
            .filter_map(|m| m.dead_letter_id)
            .map(|id| id.to_string())
            .collect();
        // PostgreSQL's two parallel arrays as one JSON array of pairs.
        let pairs: Vec<(String, &str)> = messages
            .iter()
            .filter(|m| m.dead_letter_id.is_none())
            .filter_map(|m| m.event_id.map(|id| (id.to_string(), m.queue.as_str())))
            .collect();
        if letters.is_empty() && pairs.is_empty() {
            return Ok(0);
        }
        let changed = diesel::sql_query(&self.sql.mark_replayed)
            .bind::<Text, _>(serde_json::json!(letters).to_string())
            .bind::<Text, _>(serde_json::json!(pairs).to_string())
            .bind::<BigInt, _>(now())
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
    /// messages the purge deleted, and later ones stay open. (Not the
    /// records' times: those are the consumers' clocks.)
    async fn mark_purged(&self, queues: &[String], watermark: i64) -> Result<u64> {
        let changed = diesel::sql_query(&self.sql.mark_purged)
            .bind::<Text, _>(serde_json::json!(queues).to_string())
            .bind::<BigInt, _>(watermark)
            .bind::<BigInt, _>(now())
            .execute(&mut *self.conn().await?)
            .await?;
        Ok(changed as u64)
    }

    async fn begin_audit(&self, entry: &AuditEntry) -> Result<i64> {
        audit::begin(&mut *self.conn().await?, &self.admin, entry).await
    }

    async fn record_audit(&self, audit: i64, count: u64, outcome: Option<&str>) -> Result<()> {
        audit::record(
            &mut *self.conn().await?,
            &self.admin,
            audit,
            Some(count),
            outcome,
        )
        .await
    }
}
