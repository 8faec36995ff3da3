//! The janitor's purges on MariaDB: sent and skipped events (with their
//! attempt history, rows another transaction holds skipped), orphaned
//! attempts, inbox entries and settled dead-letter records.

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Datetime, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};
use outbox_core::admin::Chunk;

use super::super::MysqlOutboxStore;
use super::super::row::SeqRow;
use super::row::PurgeWindowRow;
use crate::mysql::sql::admin::ADMIN_BEGIN;
use crate::{MysqlTransaction, Result};

/// `n` as a bound `BIGINT`.
fn big(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl MysqlOutboxStore {
    /// Adds `n` to audit row `audit`, if any.
    async fn add_count(
        &self,
        conn: &mut AsyncMysqlConnection,
        audit: Option<i64>,
        n: usize,
    ) -> Result<()> {
        if let Some(audit) = audit.filter(|_| n > 0) {
            diesel::sql_query(&self.admin.audit_add_count)
                .bind::<BigInt, _>(big(n))
                .bind::<BigInt, _>(audit)
                .execute(conn)
                .await?;
        }
        Ok(())
    }
}

/// One chunk of the purge of sent and skipped events done before
/// `before`: the next `limit` rows by seq after `after`, whatever their
/// status (never rescanning from the head); a chunk whose rows all
/// occurred after `before` ends the run.
pub(super) async fn purge_sent_chunk(
    store: &MysqlOutboxStore,
    before: DateTime<Utc>,
    after: Option<i64>,
    limit: usize,
    audit: Option<i64>,
) -> Result<Chunk> {
    if after.is_none() {
        // Attempt rows of events deleted when sent (`keep_sent(false)`) or
        // by hand.
        diesel::sql_query(&store.admin.purge_orphan_attempts)
            .bind::<BigInt, _>(big(limit))
            .execute(&mut *store.conn().await?)
            .await?;
    }
    let before = before.naive_utc();
    let after = after.unwrap_or(0);
    let mut tx = MysqlTransaction::begin_with(&store.pool, ADMIN_BEGIN).await?;
    let window: PurgeWindowRow = diesel::sql_query(&store.admin.purge_sent_window)
        .bind::<Datetime, _>(before)
        .bind::<BigInt, _>(after)
        .bind::<BigInt, _>(big(limit))
        .get_result(&mut *tx)
        .await?;
    let Some(last) = window.last else {
        tx.commit().await?;
        return Ok(Chunk::default());
    };
    let picked: Vec<SeqRow> = diesel::sql_query(&store.admin.purge_sent_pick)
        .bind::<BigInt, _>(after)
        .bind::<BigInt, _>(last)
        .bind::<Datetime, _>(before)
        .load(&mut *tx)
        .await?;
    if !picked.is_empty() {
        let seqs = serde_json::Value::from(picked.iter().map(|r| r.seq).collect::<Vec<_>>());
        diesel::sql_query(&store.admin.purge_sent_delete)
            .bind::<Text, _>(seqs.to_string())
            .execute(&mut *tx)
            .await?;
        store.add_count(&mut tx, audit, picked.len()).await?;
    }
    tx.commit().await?;
    Ok(Chunk {
        // Each picked row was locked by this transaction: all are deleted
        // (the statement's count adds their attempt rows).
        changed: picked.len() as u64,
        last: if window.past { None } else { Some(last) },
    })
}

/// Deletes up to `limit` inbox entries received before `before`.
pub(super) async fn purge_inbox_chunk(
    store: &MysqlOutboxStore,
    before: DateTime<Utc>,
    limit: usize,
    audit: Option<i64>,
) -> Result<u64> {
    // At READ COMMITTED: no gap locks that would block consumers' inserts.
    let mut tx = MysqlTransaction::begin_with(&store.pool, ADMIN_BEGIN).await?;
    let deleted = diesel::sql_query(&store.admin.purge_inbox_chunk)
        .bind::<Datetime, _>(before.naive_utc())
        .bind::<BigInt, _>(big(limit))
        .execute(&mut *tx)
        .await?;
    store.add_count(&mut tx, audit, deleted).await?;
    tx.commit().await?;
    Ok(deleted as u64)
}

/// Deletes up to `limit` dead-letter records settled before `before`.
pub(super) async fn purge_dead_letter_records_chunk(
    store: &MysqlOutboxStore,
    before: DateTime<Utc>,
    limit: usize,
) -> Result<u64> {
    let deleted = diesel::sql_query(&store.admin.purge_dead_letter_records_chunk)
        .bind::<Datetime, _>(before.naive_utc())
        .bind::<BigInt, _>(big(limit))
        .execute(&mut *store.conn().await?)
        .await?;
    Ok(deleted as u64)
}
