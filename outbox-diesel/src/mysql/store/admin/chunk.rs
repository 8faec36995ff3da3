//! One chunk of a chunked admin mutation (replay, skip, retry now) on
//! MariaDB: in one `READ COMMITTED` transaction, the chunk's seqs after the
//! cursor locked (waiting, bounded, for rows a relay's claim holds), the
//! change, the audit count and, after a replay or a skip, the release of
//! the events they held back (PostgreSQL's trigger does that there).

use diesel::result::Error as DieselError;
use diesel::sql_types::{BigInt, Text};
use diesel_async::RunQueryDsl;
use outbox_core::admin::{Chunk, EventFilter};
use outbox_core::{EventStatus, Transition};

use super::super::MysqlOutboxStore;
use super::super::claim::release_seqs;
use super::super::row::SeqRow;
use super::filter::{Bind, limit};
use crate::mysql::sql::admin::{ADMIN_BEGIN, ADMIN_LOCK_WAIT_SECS};
use crate::{Error, MysqlTransaction, Result};

/// The mutation of a chunk.
#[derive(Debug, Clone, Copy)]
pub(super) enum Change {
    /// `dead` → `pending`.
    Replay,
    /// `retry`/`dead` → `skipped`.
    Skip,
    /// Waiting `retry` → due now.
    RetryNow,
}

impl Change {
    /// The statuses it changes (the filter is restricted to them).
    fn from(self) -> &'static [EventStatus] {
        match self {
            Change::Replay => Transition::Replay.from(),
            Change::Skip => Transition::Skip.from(),
            Change::RetryNow => &[EventStatus::Retry],
        }
    }

    /// Whether the changed rows stop holding their aggregates back.
    fn releases(self) -> bool {
        !matches!(self, Change::RetryNow)
    }
}

impl MysqlOutboxStore {
    /// One chunk of `change` of the rows `filter` selects.
    pub(super) async fn change_chunk(
        &self,
        change: Change,
        filter: &EventFilter,
        after: Option<i64>,
        n: usize,
        audit: i64,
    ) -> Result<Chunk> {
        let Some(filter) = filter.restricted_to(change.from()) else {
            return Ok(Chunk::default());
        };
        // Built (a group resolved) before the transaction begins.
        let select = self
            .filtered(
                &self.admin.chunk_select,
                vec![Bind::Big(after.unwrap_or(0))],
                &filter,
                vec![limit(n)],
            )
            .await?;
        // Dropped on an error: its connection is closed, which rolls back.
        let mut tx = MysqlTransaction::begin_with(&self.pool, ADMIN_BEGIN).await?;
        let picked: Vec<SeqRow> = select.build().load(&mut *tx).await.map_err(lock_timeout)?;
        let Some(last) = picked.iter().map(|r| r.seq).max() else {
            tx.commit().await?;
            return Ok(Chunk::default());
        };
        let seqs =
            serde_json::Value::from(picked.iter().map(|r| r.seq).collect::<Vec<_>>()).to_string();
        let sql = match change {
            Change::Replay => &self.admin.replay_chunk,
            Change::Skip => &self.admin.skip_chunk,
            Change::RetryNow => &self.admin.retry_now_chunk,
        };
        let changed = diesel::sql_query(sql)
            .bind::<Text, _>(&seqs)
            .execute(&mut *tx)
            .await?;
        if changed > 0 {
            diesel::sql_query(&self.admin.audit_add_count)
                .bind::<BigInt, _>(i64::try_from(changed).unwrap_or(i64::MAX))
                .bind::<BigInt, _>(audit)
                .execute(&mut *tx)
                .await?;
            if change.releases() {
                let held: Vec<SeqRow> = diesel::sql_query(&self.admin.release_pick_seqs)
                    .bind::<Text, _>(&seqs)
                    .load(&mut *tx)
                    .await?;
                release_seqs(&self.sql, self.prepare, &mut tx, held).await?;
            }
        }
        tx.commit().await?;
        Ok(Chunk {
            changed: changed as u64,
            last: Some(last),
        })
    }
}

/// A chunk's locking read that waited too long for a relay's claim: what
/// to do about it (nothing of the chunk changed).
fn lock_timeout(e: DieselError) -> Error {
    match e {
        DieselError::DatabaseError(_, ref info)
            if info.message().contains("Lock wait timeout exceeded") =>
        {
            Error::Config(format!(
                "a relay held the selected events for over {ADMIN_LOCK_WAIT_SECS}s \
                 (publishing them); nothing of this chunk changed: run it again"
            ))
        }
        e => Error::Database(e),
    }
}
