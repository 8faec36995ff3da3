//! Consumers' dead letters in PostgreSQL (`inbox_dead_letters`): recorded
//! by [`PgInboxDatabase`](crate::PgInboxDatabase), read by
//! [`PgDeadLetters`].

use std::sync::Arc;

use chrono::{DateTime, Utc};
use diesel::sql_types::{Array, BigInt, Bool, Integer, Jsonb, Nullable, Text, Timestamptz};
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_core::admin::{
    AuditEntry, DeadLetter, DeadLetterGroup, DeadLetterQuery, DeadLetterRecord, DeadLetterStore,
    Page, ReplayedMessage, group_dead_letters,
};
use uuid::Uuid;

use crate::rows::{GROUP_ROWS, LetterFields, letter_page};
use crate::schema::Schema;
use crate::sql::{DeadLetterSql, Sql};
use crate::{Error, Result};

/// Runs `sql`'s insert for `letter` on `conn`. NUL characters (which a
/// lossy UTF-8 body may hold, and PostgreSQL text cannot) become U+FFFD.
pub(crate) async fn insert(
    conn: &mut AsyncPgConnection,
    sql: &DeadLetterSql,
    letter: &DeadLetter,
) -> Result<()> {
    let headers: serde_json::Map<String, serde_json::Value> = letter
        .headers
        .iter()
        .map(|(k, v)| (no_nul(k), serde_json::Value::String(no_nul(v))))
        .collect();
    diesel::sql_query(&sql.insert)
        .bind::<Text, _>(no_nul(&letter.consumer))
        .bind::<Text, _>(no_nul(&letter.queue))
        .bind::<Text, _>(no_nul(&letter.exchange))
        .bind::<Text, _>(no_nul(&letter.routing_key))
        .bind::<Nullable<diesel::sql_types::Uuid>, _>(letter.event_id)
        .bind::<Nullable<Text>, _>(letter.message_id.as_deref().map(no_nul))
        .bind::<Nullable<Text>, _>(letter.event_type.as_deref().map(no_nul))
        .bind::<Integer, _>(i32::try_from(letter.attempts).unwrap_or(i32::MAX))
        .bind::<Text, _>(no_nul(&letter.reason))
        .bind::<Jsonb, _>(serde_json::Value::Object(headers))
        .bind::<Text, _>(no_nul(&letter.payload))
        .bind::<Bool, _>(letter.payload_truncated)
        .bind::<Timestamptz, _>(letter.dead_lettered_at)
        .execute(conn)
        .await?;
    Ok(())
}

fn no_nul(text: &str) -> String {
    text.replace('\0', "\u{fffd}")
}

/// Consumers' dead letters as [`PgInboxDatabase`](crate::PgInboxDatabase)
/// recorded them, as a [`DeadLetterStore`]: list, show and group them, and
/// mark them replayed or purged when
/// [`DeadLetters`](outbox_core::admin::DeadLetters) replays or purges the
/// queue over [`outbox_lapin::DeadLetterQueues`] (the broker's queue holds
/// the messages; these rows are their index, and listing them never touches
/// the queue). Audit rows go to `outbox_audit` in the same schema.
///
/// "Open" rows are neither replayed nor purged. Open rows are never
/// deleted; the [`Janitor`](outbox_core::admin::Janitor) deletes replayed
/// and purged ones past the inbox retention.
///
/// ```no_run
/// use outbox_core::admin::{DeadLetterQuery, DeadLetterStore as _};
/// use outbox_diesel::PgDeadLetters;
///
/// # async fn run() -> outbox_diesel::Result<()> {
/// let letters = PgDeadLetters::new(outbox_diesel::pool("postgres://postgres@127.0.0.1/shop", 2)?);
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
///
/// [`outbox_lapin::DeadLetterQueues`]: https://docs.rs/outbox-lapin/latest/outbox_lapin/struct.DeadLetterQueues.html
#[derive(Clone)]
pub struct PgDeadLetters {
    pool: Pool<AsyncPgConnection>,
    /// The schema's SQL, shared with the other parts of its settings.
    sql: Arc<Sql>,
}

impl std::fmt::Debug for PgDeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgDeadLetters")
            .field("table", &self.sql.dead_letters.table)
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
    #[diesel(sql_type = Nullable<diesel::sql_types::Uuid>)]
    event_id: Option<Uuid>,
    #[diesel(sql_type = Nullable<Text>)]
    message_id: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    event_type: Option<String>,
    #[diesel(sql_type = Integer)]
    attempts: i32,
    #[diesel(sql_type = Text)]
    reason: String,
    #[diesel(sql_type = Jsonb)]
    headers: serde_json::Value,
    #[diesel(sql_type = Text)]
    payload: String,
    #[diesel(sql_type = Bool)]
    payload_truncated: bool,
    #[diesel(sql_type = Timestamptz)]
    dead_lettered_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    replayed_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    purged_at: Option<DateTime<Utc>>,
}

impl From<DeadLetterRow> for crate::rows::LetterFields {
    fn from(row: DeadLetterRow) -> Self {
        crate::rows::LetterFields {
            id: row.id,
            consumer: row.consumer,
            queue: row.queue,
            exchange: row.exchange,
            routing_key: row.routing_key,
            event_id: row.event_id,
            message_id: row.message_id,
            event_type: row.event_type,
            attempts: row.attempts,
            reason: row.reason,
            headers: row.headers,
            payload: row.payload,
            payload_truncated: row.payload_truncated,
            dead_lettered_at: row.dead_lettered_at,
            replayed_at: row.replayed_at,
            purged_at: row.purged_at,
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
    #[diesel(sql_type = Timestamptz)]
    first: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    last: DateTime<Utc>,
}

impl PgDeadLetters {
    /// The dead letters in the default schema (`public`), on `pool`.
    pub fn new(pool: Pool<AsyncPgConnection>) -> Self {
        PgDeadLetters::from_sql(pool, Sql::public())
    }

    /// The dead letters in `schema`, on `pool`.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid schema name.
    pub fn with_schema(pool: Pool<AsyncPgConnection>, schema: &str) -> Result<Self> {
        Ok(PgDeadLetters::from_sql(
            pool,
            Sql::for_schema(&Schema::new(schema)?),
        ))
    }

    /// The dead letters on `sql` (of
    /// [`PgSettings::dead_letters`](crate::PgSettings::dead_letters)).
    pub(crate) fn from_sql(pool: Pool<AsyncPgConnection>, sql: Arc<Sql>) -> Self {
        PgDeadLetters { pool, sql }
    }

    async fn conn(
        &self,
    ) -> Result<diesel_async::pooled_connection::deadpool::Object<AsyncPgConnection>> {
        self.pool.get().await.map_err(Error::Pool)
    }
}

impl DeadLetterStore for PgDeadLetters {
    type Error = Error;

    /// Without payloads, the payload and headers columns are not read.
    async fn list(&self, query: &DeadLetterQuery) -> Result<Page<DeadLetterRecord>> {
        let sql = if query.payloads {
            &self.sql.dead_letters.list
        } else {
            &self.sql.dead_letters.list_without_payloads
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
            rows.into_iter().map(Into::into),
            limit,
            query.payloads,
        ))
    }

    async fn show(&self, id: i64) -> Result<Option<DeadLetterRecord>> {
        let rows: Vec<DeadLetterRow> = diesel::sql_query(&self.sql.dead_letters.show)
            .bind::<BigInt, _>(id)
            .load(&mut *self.conn().await?)
            .await?;
        Ok(rows
            .into_iter()
            .next()
            .map(|row| DeadLetterRecord::from(LetterFields::from(row))))
    }

    async fn groups(&self, queue: Option<&str>) -> Result<Vec<DeadLetterGroup>> {
        let rows: Vec<GroupRow> = diesel::sql_query(&self.sql.dead_letters.groups)
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
                r.first,
                r.last,
            )
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
        let (events, queues): (Vec<Uuid>, Vec<String>) = messages
            .iter()
            .filter(|m| m.dead_letter_id.is_none())
            .filter_map(|m| m.event_id.map(|id| (id, m.queue.clone())))
            .unzip();
        if letters.is_empty() && events.is_empty() {
            return Ok(0);
        }
        let changed = diesel::sql_query(&self.sql.dead_letters.mark_replayed)
            .bind::<Array<Text>, _>(letters)
            .bind::<Array<diesel::sql_types::Uuid>, _>(events)
            .bind::<Array<Text>, _>(queues)
            .execute(&mut *self.conn().await?)
            .await?;
        Ok(changed as u64)
    }

    async fn watermark(&self) -> Result<i64> {
        #[derive(diesel::QueryableByName)]
        struct Max {
            #[diesel(sql_type = BigInt)]
            id: i64,
        }
        let row: Max = diesel::sql_query(&self.sql.dead_letters.watermark)
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
        let changed = diesel::sql_query(&self.sql.dead_letters.mark_purged)
            .bind::<Array<Text>, _>(queues)
            .bind::<BigInt, _>(watermark)
            .execute(&mut *self.conn().await?)
            .await?;
        Ok(changed as u64)
    }

    async fn begin_audit(&self, entry: &AuditEntry) -> Result<i64> {
        crate::audit::begin(&mut *self.conn().await?, &self.sql.audit, entry).await
    }

    async fn record_audit(&self, audit: i64, count: u64, outcome: Option<&str>) -> Result<()> {
        crate::audit::record(
            &mut *self.conn().await?,
            &self.sql.audit,
            audit,
            Some(count),
            outcome,
        )
        .await
    }
}
