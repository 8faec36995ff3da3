//! One chunk of a chunked admin mutation (replay, skip, retry now) on
//! SQLite: in one short `BEGIN IMMEDIATE`, the chunk selected after the
//! cursor, checked for rows a relay's live lease holds, changed, and
//! counted in its audit row.
//!
//! A leased row is one a relay is publishing (PostgreSQL's row lock). The
//! chunk does not change it under the relay, nor skip it without a word:
//! it rolls back, waits (without the write lock, so the relay can finish)
//! and tries again, for up to [`HELD_WAIT`], as PostgreSQL's chunk waits
//! for the row lock under its `lock_timeout`; past that it fails, having
//! changed nothing of the chunk, and says to run it again.

use std::time::Duration;

use diesel::sql_types::{BigInt, Text};
use diesel_async::RunQueryDsl;
use outbox_core::admin::{Chunk, EventFilter};

use super::super::SqliteOutboxStore;
use super::super::row::SeqRow;
use super::filter::{Bind, Query, limit};
use super::row::CountRow;
use crate::sqlite::audit;
use crate::sqlite::sql::{ChunkSql, micros};
use crate::{Error, Result, SqliteTransaction};

/// How long a chunk waits for rows a relay's lease holds (PostgreSQL's
/// admin `lock_timeout`).
pub(super) const HELD_WAIT: Duration = Duration::from_secs(5);

/// How often a chunk looks again at rows a relay holds.
const HELD_POLL: Duration = Duration::from_millis(50);

impl SqliteOutboxStore {
    /// One chunk of the mutation `chunk` of the rows `filter` selects
    /// (restricted to the statuses it changes).
    pub(super) async fn change_chunk(
        &self,
        chunk: &ChunkSql,
        filter: &EventFilter,
        after: Option<i64>,
        size: usize,
        audit: i64,
    ) -> Result<Chunk> {
        let Some(filter) = filter.restricted_to(chunk.from) else {
            return Ok(Chunk::default());
        };
        let sql = &self.admin.chunk;
        let binds = vec![Bind::Big(after.unwrap_or(0)), Bind::Big(limit(size))];
        let mut select = Query::new(&sql.head, binds);
        // A group is resolved here, before the write lock is taken.
        self.push_filter(&mut select, &filter).await?;
        select.push(&sql.tail);
        let deadline = tokio::time::Instant::now() + HELD_WAIT;
        loop {
            let mut tx = SqliteTransaction::begin(&self.pool).await?;
            let rows: Vec<SeqRow> = select.clone().build().load(&mut *tx).await?;
            let Some(last) = rows.last().map(|r| r.seq) else {
                tx.commit().await?;
                return Ok(Chunk::default());
            };
            let seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
            let seqs = serde_json::json!(seqs).to_string();
            let now = micros(chrono::Utc::now());
            let leased: CountRow = diesel::sql_query(&chunk.leased)
                .bind::<Text, _>(&seqs)
                .bind::<BigInt, _>(now)
                .get_result(&mut *tx)
                .await?;
            if leased.n > 0 {
                tx.rollback().await?;
                if tokio::time::Instant::now() >= deadline {
                    return Err(Error::Config(format!(
                        "a relay held the selected events for over {}s (publishing them); \
                         nothing of this chunk changed: run it again",
                        HELD_WAIT.as_secs()
                    )));
                }
                tokio::time::sleep(HELD_POLL).await;
                continue;
            }
            let mut change = diesel::sql_query(&chunk.change)
                .into_boxed()
                .bind::<Text, _>(seqs);
            if chunk.binds_now {
                change = change.bind::<BigInt, _>(now);
            }
            let changed = change.execute(&mut *tx).await?;
            audit::add_count(&mut tx, &self.admin, audit, changed).await?;
            tx.commit().await?;
            return Ok(Chunk {
                changed: changed as u64,
                last: Some(last),
            });
        }
    }
}
