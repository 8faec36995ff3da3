//! One chunk of a chunked admin mutation (replay, skip, retry now): the
//! chunk selected after the cursor, locked (waiting for rows a relay holds,
//! bounded), changed and counted in its audit row, in one statement.

use diesel_async::RunQueryDsl;
use outbox_core::EventStatus;
use outbox_core::admin::{Chunk, EventFilter};

use super::PgOutboxStore;
use super::query::{Bind, Query};
use super::row::{ChunkRow, count};
use crate::store::sql::literals;
use crate::{Error, Result};

/// How long an admin chunk waits for rows a relay holds.
const ADMIN_LOCK_TIMEOUT: &str = "5s";

/// How an admin chunk's transaction starts (the same timeout).
const ADMIN_BEGIN: &str = "BEGIN; SET LOCAL lock_timeout = '5s'";

impl PgOutboxStore {
    /// One chunk of an `UPDATE` of the rows `filter` selects (restricted to
    /// `from`): `set` is the `SET` list, `extra` more conditions.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn change_chunk(
        &self,
        filter: &EventFilter,
        from: &[EventStatus],
        set: &str,
        extra: &str,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk> {
        let Some(filter) = filter.restricted_to(from) else {
            return Ok(Chunk::default());
        };
        let t = self.table("outbox_events");
        let a = self.table("outbox_audit");
        // `FOR UPDATE` waits for a row a relay's claim holds (a claim is
        // short and bounded by the claim timeout) instead of skipping it,
        // which would leave it unchanged without a word; `lock_timeout`
        // bounds the wait. After the wait the row's status is checked again.
        let mut q = Query::new(format!("WITH c AS (SELECT seq FROM {t} WHERE true"));
        self.push_filter(&mut q, &filter).await?;
        let after = q.bind(Bind::Big(after.unwrap_or(0)));
        let limit = q.bind(Bind::Big(i64::try_from(limit).unwrap_or(i64::MAX)));
        let audit = q.bind(Bind::Big(audit));
        q.push(&format!(
            " AND seq > {after} ORDER BY seq LIMIT {limit} FOR UPDATE), \
             u AS (UPDATE {t} SET {set} WHERE seq IN (SELECT seq FROM c) \
               AND status IN ({from}){extra} RETURNING seq), \
             x AS (UPDATE {a} SET count = count + (SELECT count(*) FROM u) WHERE id = {audit}) \
             SELECT (SELECT max(seq) FROM c) AS last, (SELECT count(*) FROM u) AS changed",
            from = literals(from),
        ));
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
