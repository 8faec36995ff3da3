//! The admin API ([`OutboxAdmin`]) on MariaDB: the same verbs and the same
//! contract as on PostgreSQL (see `outbox_core::admin`), from the
//! statements of `docs/design/mysql-statements.md` section 8.
//!
//! What differs from PostgreSQL is said in the docs of `crate::mysql`
//! ("The admin API"): a chunk is several statements in one `READ
//! COMMITTED` transaction (the chunk's seqs locked with `FOR UPDATE` under
//! a 5 s `innodb_lock_wait_timeout`, changed by primary key, counted in the
//! audit row, and for replays and skips the release of the events they
//! held back, which PostgreSQL's trigger does there).
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
