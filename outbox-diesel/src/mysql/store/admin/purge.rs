//! The janitor's purges on MariaDB: sent and skipped events (with their
//! attempt history, rows another transaction holds skipped), orphaned
//! attempts, inbox entries and settled dead-letter records.
//!
//! Two janitors (every relay of a fleet may run one) purge the same rows
//! at the same time. Each chunk runs at `READ COMMITTED` (no gap locks),
//! but InnoDB can still pick one as the victim of a deadlock (the sent
//! purge locks events, then their attempts; the orphan purge reads events
//! while it deletes attempts), or a chunk's lock wait can time out: both
//! roll back the whole chunk and nothing of it changed, so the chunk runs
//! again (after a short random pause, a few times) instead of failing the
//! janitor's run.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Datetime, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};
use outbox_core::admin::Chunk;

use super::super::MysqlOutboxStore;
use super::super::row::SeqRow;
use super::row::PurgeWindowRow;
use crate::mysql::sql::admin::ADMIN_BEGIN;
use crate::{MysqlTransaction, Result};

/// How many times a chunk runs again after a deadlock or a lock wait
/// timeout before its error is returned.
const LOCK_CONFLICT_RETRIES: u32 = 5;

/// Whether `error` is InnoDB's "try restarting transaction": a deadlock
/// (1213) or a lock wait timeout (1205). diesel-async passes MariaDB's
/// message but not its code: the message is matched (in English, the
/// server's default `lc_messages`).
fn is_lock_conflict(error: &crate::Error) -> bool {
    matches!(error, crate::Error::Database(diesel::result::Error::DatabaseError(_, info))
        if info.message().starts_with("Deadlock found")
            || info.message().starts_with("Lock wait timeout exceeded"))
}

/// Runs `chunk`, again after a lock conflict (see the module docs): each
/// run is a transaction of its own that the conflict rolled back whole.
async fn retrying<T, F, Fut>(what: &str, mut chunk: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut retries = 0;
    loop {
        match chunk().await {
            Err(e) if retries < LOCK_CONFLICT_RETRIES && is_lock_conflict(&e) => {
                retries += 1;
                tracing::debug!(error = %e, retries, "janitor: {what} chunk rolled back, running it again");
                // 10–40 ms, doubling: the other janitor's chunk finishes.
                let pause = fastrand::u64(10..=40) << (retries - 1);
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            result => return result,
        }
    }
}

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
        retrying("orphaned attempts", || purge_orphan_attempts(store, limit)).await?;
    }
    retrying("sent events", || {
        purge_sent_window(store, before, after, limit, audit)
    })
    .await
}

/// Deletes up to `limit` attempt rows of events deleted when sent
/// (`keep_sent(false)`) or by hand.
async fn purge_orphan_attempts(store: &MysqlOutboxStore, limit: usize) -> Result<()> {
    let mut tx = MysqlTransaction::begin_with(&store.pool, ADMIN_BEGIN).await?;
    diesel::sql_query(&store.admin.purge_orphan_attempts)
        .bind::<BigInt, _>(big(limit))
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

/// One transaction of [`purge_sent_chunk`].
async fn purge_sent_window(
    store: &MysqlOutboxStore,
    before: DateTime<Utc>,
    after: Option<i64>,
    limit: usize,
    audit: Option<i64>,
) -> Result<Chunk> {
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
    retrying("inbox", || purge_inbox_once(store, before, limit, audit)).await
}

/// One transaction of [`purge_inbox_chunk`].
async fn purge_inbox_once(
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
    retrying("dead-letter records", || async {
        let mut tx = MysqlTransaction::begin_with(&store.pool, ADMIN_BEGIN).await?;
        let deleted = diesel::sql_query(&store.admin.purge_dead_letter_records_chunk)
            .bind::<Datetime, _>(before.naive_utc())
            .bind::<BigInt, _>(big(limit))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(deleted as u64)
    })
    .await
}

#[cfg(test)]
mod tests {
    use diesel::result::{DatabaseErrorKind, Error as DieselError};

    use super::is_lock_conflict;

    fn server(message: &str) -> crate::Error {
        crate::Error::Database(DieselError::DatabaseError(
            DatabaseErrorKind::Unknown,
            Box::new(message.to_owned()),
        ))
    }

    #[test]
    fn deadlocks_and_lock_wait_timeouts_are_run_again_and_nothing_else() {
        assert!(is_lock_conflict(&server(
            "Deadlock found when trying to get lock; try restarting transaction"
        )));
        assert!(is_lock_conflict(&server(
            "Lock wait timeout exceeded; try restarting transaction"
        )));
        assert!(!is_lock_conflict(&server(
            "Table 'outbox_events' doesn't exist"
        )));
        assert!(!is_lock_conflict(&crate::Error::Config("x".into())));
    }
}
