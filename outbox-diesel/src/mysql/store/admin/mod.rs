//! The admin API ([`OutboxAdmin`]) on MariaDB: the same verbs and the same
//! contract as on PostgreSQL (see `outbox_core::admin`), from the
//! statements of `docs/design/mysql-statements.md` section 8.
//!
//! # What differs from PostgreSQL
//! - **A chunk is several statements in one transaction** (MariaDB has no
//!   data-modifying CTEs, no `UPDATE … RETURNING`): at `READ COMMITTED`,
//!   the chunk's seqs are read with `FOR UPDATE` under a 5 s
//!   `innodb_lock_wait_timeout` (PostgreSQL: `lock_timeout`), then changed
//!   by primary key, then counted in the audit row. A row a relay's claim
//!   holds is waited for; held longer, the chunk changes nothing and says
//!   "run it again", as on PostgreSQL.
//! - **Replays and skips release the events they held back themselves**,
//!   in the chunk's transaction (PostgreSQL's trigger does it there: a
//!   MariaDB trigger cannot update its own table).
//! - **The inbox purge waits for locked entries** instead of skipping them
//!   (a single-table `DELETE … ORDER BY … LIMIT` cannot `SKIP LOCKED`);
//!   the purge of sent events skips rows another transaction holds, as on
//!   PostgreSQL. So does the purge of orphaned attempt rows not: it waits.
//! - **`error_contains` lower-cases with MariaDB's case mapping** on the
//!   column and Rust's on the text: they differ on a few letters (`İ`).
//! - **The status report's estimate** of sent events past 100,000 is
//!   InnoDB's `TABLE_ROWS`, rougher than PostgreSQL's `reltuples`.
//!
//! This file holds the [`OutboxAdmin`] impl, which hands each verb to the
//! file of its concern: `reads.rs` (status, pages, one event, groups,
//! counts, head), `chunk.rs` (replay, skip, retry-now chunks), `purge.rs`
//! (the janitor's purges), `relays.rs` (the relay registry), `filter.rs`
//! (an [`EventFilter`] as SQL) and `row.rs` (the rows read).

mod chunk;
mod filter;
mod purge;
mod reads;
mod relays;
mod row;

use chrono::{DateTime, Utc};
use outbox_core::admin::{
    AuditEntry, AuditRecord, Chunk, EventDetail, EventFilter, EventSummary, FailureGroup,
    OutboxAdmin, Page, RelayInfo, StatusReport,
};
use uuid::Uuid;

use super::MysqlOutboxStore;
use crate::mysql::audit;
use crate::{Error, Result};
use chunk::Change;

impl OutboxAdmin for MysqlOutboxStore {
    type Error = Error;

    async fn status(&self) -> Result<StatusReport> {
        reads::status(self).await
    }

    async fn list(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Page<EventSummary>> {
        reads::list(self, filter, after, limit).await
    }

    async fn show(&self, id: Uuid) -> Result<Option<EventDetail>> {
        reads::show(self, id).await
    }

    async fn failure_groups(&self, filter: &EventFilter) -> Result<Vec<FailureGroup>> {
        reads::failure_groups(self, filter).await
    }

    async fn count(&self, filter: &EventFilter) -> Result<u64> {
        reads::count_events(self, filter).await
    }

    async fn last_seq(&self) -> Result<Option<i64>> {
        reads::last_seq(self).await
    }

    async fn head(&self, aggregate_type: &str, aggregate_id: &str) -> Result<Option<EventSummary>> {
        reads::head(self, aggregate_type, aggregate_id).await
    }

    async fn begin_audit(&self, entry: &AuditEntry) -> Result<i64> {
        audit::begin(&mut *self.conn().await?, &self.audit, entry).await
    }

    async fn finish_audit(&self, audit: i64, outcome: &str) -> Result<()> {
        audit::record(
            &mut *self.conn().await?,
            &self.audit,
            audit,
            None,
            Some(outcome),
        )
        .await
    }

    async fn audit_log(&self, before: Option<i64>, limit: usize) -> Result<Vec<AuditRecord>> {
        audit::log(&mut *self.conn().await?, &self.audit, before, limit).await
    }

    async fn replay_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk> {
        self.change_chunk(Change::Replay, filter, after, limit, audit)
            .await
    }

    async fn skip_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk> {
        self.change_chunk(Change::Skip, filter, after, limit, audit)
            .await
    }

    async fn retry_now_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk> {
        self.change_chunk(Change::RetryNow, filter, after, limit, audit)
            .await
    }

    async fn purge_sent_chunk(
        &self,
        before: DateTime<Utc>,
        after: Option<i64>,
        limit: usize,
        audit: Option<i64>,
    ) -> Result<Chunk> {
        purge::purge_sent_chunk(self, before, after, limit, audit).await
    }

    async fn purge_inbox_chunk(
        &self,
        before: DateTime<Utc>,
        limit: usize,
        audit: Option<i64>,
    ) -> Result<u64> {
        purge::purge_inbox_chunk(self, before, limit, audit).await
    }

    async fn purge_dead_letter_records_chunk(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<u64> {
        purge::purge_dead_letter_records_chunk(self, before, limit).await
    }

    async fn purge_stale_relays(&self, before: DateTime<Utc>) -> Result<u64> {
        relays::purge_stale_relays(self, before).await
    }

    async fn relays(&self) -> Result<Vec<RelayInfo>> {
        relays::relays(self).await
    }

    async fn set_paused(&self, relay: &str, paused: bool, audit: i64) -> Result<bool> {
        relays::set_paused(self, relay, paused, audit).await
    }
}
