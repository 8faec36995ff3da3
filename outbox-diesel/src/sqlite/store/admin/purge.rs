//! The janitor's purges on SQLite: sent and skipped events (with their
//! attempt history), orphaned attempts, inbox entries and settled
//! dead-letter records, each chunk one short write transaction.

use chrono::{DateTime, Utc};
use diesel::sql_types::BigInt;
use diesel_async::RunQueryDsl;
use outbox_core::admin::Chunk;

use super::super::SqliteOutboxStore;
use super::filter::limit;
use super::row::PurgeRow;
use crate::sqlite::audit;
use crate::sqlite::sql::micros;
use crate::{Result, SqliteTransaction};

impl SqliteOutboxStore {
    /// Deletes up to `size` attempt rows whose event is gone (deleted when
    /// sent, or by hand); returns how many.
    async fn purge_orphan_attempts(&self, size: usize) -> Result<u64> {
        let deleted = diesel::sql_query(&self.admin.purge_orphan_attempts)
            .bind::<BigInt, _>(limit(size))
            .execute(&mut *self.conn().await?)
            .await?;
        Ok(deleted as u64)
    }
}

/// One chunk of the purge of sent and skipped events published before
/// `before`: the next `size` rows by seq after `after`, whatever their
/// status, of which the sent and skipped ones published (or skipped)
/// before `before` are deleted with their attempts, counted in `audit`.
pub(super) async fn purge_sent_chunk(
    store: &SqliteOutboxStore,
    before: DateTime<Utc>,
    after: Option<i64>,
    size: usize,
    audit: Option<i64>,
) -> Result<Chunk> {
    if after.is_none() {
        store.purge_orphan_attempts(size).await?;
    }
    let (after, before) = (after.unwrap_or(0), micros(before));
    let sql = &store.admin;
    let mut tx = SqliteTransaction::begin(&store.pool).await?;
    let chunk: PurgeRow = diesel::sql_query(&sql.purge_sent_chunk)
        .bind::<BigInt, _>(after)
        .bind::<BigInt, _>(limit(size))
        .bind::<BigInt, _>(before)
        .get_result(&mut *tx)
        .await?;
    let Some(last) = chunk.last else {
        tx.commit().await?;
        return Ok(Chunk::default());
    };
    let delete = |statement: &String| {
        diesel::sql_query(statement)
            .bind::<BigInt, _>(after)
            .bind::<BigInt, _>(last)
            .bind::<BigInt, _>(before)
    };
    // The attempts first: once the events are gone nothing says which
    // attempts were theirs.
    delete(&sql.purge_sent_attempts).execute(&mut *tx).await?;
    let changed = delete(&sql.purge_sent).execute(&mut *tx).await?;
    if let Some(audit) = audit {
        audit::add_count(&mut tx, sql, audit, changed).await?;
    }
    tx.commit().await?;
    Ok(Chunk {
        changed: changed as u64,
        // A chunk whose rows all occurred after the cutoff ends the run.
        last: (!chunk.past).then_some(last),
    })
}

/// Deletes up to `size` inbox entries received before `before`, oldest
/// first, counted in `audit`.
pub(super) async fn purge_inbox_chunk(
    store: &SqliteOutboxStore,
    before: DateTime<Utc>,
    size: usize,
    audit: Option<i64>,
) -> Result<u64> {
    let mut tx = SqliteTransaction::begin(&store.pool).await?;
    let deleted = diesel::sql_query(&store.admin.purge_inbox)
        .bind::<BigInt, _>(micros(before))
        .bind::<BigInt, _>(limit(size))
        .execute(&mut *tx)
        .await?;
    if let Some(audit) = audit {
        audit::add_count(&mut tx, &store.admin, audit, deleted).await?;
    }
    tx.commit().await?;
    Ok(deleted as u64)
}

/// Deletes up to `size` dead-letter records replayed or purged before
/// `before` (open ones are kept).
pub(super) async fn purge_dead_letter_records_chunk(
    store: &SqliteOutboxStore,
    before: DateTime<Utc>,
    size: usize,
) -> Result<u64> {
    let deleted = diesel::sql_query(&store.admin.purge_dead_letter_records)
        .bind::<BigInt, _>(micros(before))
        .bind::<BigInt, _>(limit(size))
        .execute(&mut *store.conn().await?)
        .await?;
    Ok(deleted as u64)
}
