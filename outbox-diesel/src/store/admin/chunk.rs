//! One chunk of a chunked admin mutation (replay, skip, retry now): the
//! chunk selected after the cursor, locked (waiting for rows a relay holds,
//! bounded), changed and counted in its audit row, in one statement.

use diesel_async::RunQueryDsl;
use outbox_core::admin::{Chunk, EventFilter};

use super::PgOutboxStore;
use super::query::{Bind, Query};
use super::row::{ChunkRow, count};
use crate::sql::{ADMIN_BEGIN, ADMIN_LOCK_TIMEOUT, ChunkSql};
use crate::{Error, Result};

impl PgOutboxStore {
    /// One chunk of the mutation `chunk` of the rows `filter` selects
    /// (restricted to the statuses it changes).
    pub(super) async fn change_chunk(
        &self,
        chunk: &ChunkSql,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk> {
        let Some(filter) = filter.restricted_to(chunk.from) else {
            return Ok(Chunk::default());
        };
        let sql = &chunk.sql;
        let mut q = Query::new(
            &sql.head,
            vec![
                Bind::Big(after.unwrap_or(0)),
                Bind::Big(i64::try_from(limit).unwrap_or(i64::MAX)),
                Bind::Big(audit),
            ],
        );
        self.push_filter(&mut q, &filter).await?;
        q.push(&sql.tail);
        let mut tx = crate::PgTransaction::begin_with(&self.pool, ADMIN_BEGIN).await?;
        let row: ChunkRow = q.build().get_result(&mut *tx).await.map_err(|e| match e {
            diesel::result::Error::DatabaseError(_, ref info)
                if info.message().contains("lock timeout") =>
            {
                Error::Config(format!(
                    "a relay held the selected events for over {ADMIN_LOCK_TIMEOUT} \
                         (publishing them); nothing of this chunk changed: run it again"
                ))
            }
            e => Error::Database(e),
        })?;
        tx.commit().await?;
        Ok(Chunk {
            changed: count(row.changed),
            last: row.last,
        })
    }
}
