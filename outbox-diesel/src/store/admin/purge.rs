//! The janitor's purges: sent and skipped events (with their attempt
//! history), orphaned attempts, inbox entries and settled dead-letter
//! records, each chunk one statement under `FOR UPDATE SKIP LOCKED`.

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Timestamptz};
use diesel_async::RunQueryDsl;
use outbox_core::admin::Chunk;

use super::PgOutboxStore;
use super::row::{CountRow, PurgeRow, count};
use crate::Result;

impl PgOutboxStore {
    /// Deletes up to `limit` attempt rows whose event is gone (deleted when
    /// sent, with `keep_sent(false)`, or by hand); returns how many.
    pub(crate) async fn purge_orphan_attempts(&self, limit: usize) -> Result<u64> {
        let mut conn = self.conn().await?;
        let result = diesel::sql_query(&self.admin_sql().purge_orphan_attempts)
            .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
            .execute(&mut *conn)
            .await;
        let deleted = self.checked(conn, result)?;
        Ok(deleted as u64)
    }
}

/// One chunk of the purge of sent and skipped events published before `before`.
pub(super) async fn purge_sent_chunk(
    store: &PgOutboxStore,
    before: DateTime<Utc>,
    after: Option<i64>,
    limit: usize,
    audit: Option<i64>,
) -> Result<Chunk> {
    if after.is_none() {
        store.purge_orphan_attempts(limit).await?;
    }
    let mut conn = store.conn().await?;
    let result = diesel::sql_query(&store.admin_sql().purge_sent_chunk)
        .bind::<BigInt, _>(after.unwrap_or(0))
        .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
        .bind::<Timestamptz, _>(before)
        .bind::<BigInt, _>(audit.unwrap_or(0))
        .get_result(&mut *conn)
        .await;
    let row: PurgeRow = store.checked(conn, result)?;
    Ok(Chunk {
        changed: count(row.changed),
        last: if row.past { None } else { row.last },
    })
}

/// Deletes up to `limit` inbox entries received before `before`.
pub(super) async fn purge_inbox_chunk(
    store: &PgOutboxStore,
    before: DateTime<Utc>,
    limit: usize,
    audit: Option<i64>,
) -> Result<u64> {
    let mut conn = store.conn().await?;
    let result = diesel::sql_query(&store.admin_sql().purge_inbox_chunk)
        .bind::<Timestamptz, _>(before)
        .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
        .bind::<BigInt, _>(audit.unwrap_or(0))
        .get_result(&mut *conn)
        .await;
    let row: CountRow = store.checked(conn, result)?;
    Ok(count(row.n))
}

/// Deletes up to `limit` dead-letter records settled before `before`.
pub(super) async fn purge_dead_letter_records_chunk(
    store: &PgOutboxStore,
    before: DateTime<Utc>,
    limit: usize,
) -> Result<u64> {
    let mut conn = store.conn().await?;
    let result = diesel::sql_query(&store.admin_sql().purge_dead_letter_records_chunk)
        .bind::<Timestamptz, _>(before)
        .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
        .execute(&mut *conn)
        .await;
    let deleted = store.checked(conn, result)?;
    Ok(deleted as u64)
}
