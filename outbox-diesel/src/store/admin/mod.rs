//! The admin API ([`OutboxAdmin`]) on PostgreSQL.
//!
//! Every chunked mutation is one statement: it selects its chunk in `seq`
//! order after the cursor, changes it, and adds the count to its audit row,
//! so a run stopped half way has changed whole chunks and says how many.
//! Replay, skip and retry-now lock their chunk with `FOR UPDATE` under a
//! 5 s `lock_timeout` (a row a relay's claim holds is waited for, not left
//! unchanged without a word; a claim that holds it longer is an error the
//! operator sees); the purges use `FOR UPDATE SKIP LOCKED` (several
//! janitors share the work, and a row held now is taken by a later run).
//! The statements themselves are rendered once per schema, in
//! [`AdminSql`].
//!
//! This file holds the [`OutboxAdmin`] impl, which hands each verb to the
//! file of its concern:
//! - `reads.rs`: the status report, event pages, one event, failure
//!   groups, counts, an aggregate's head;
//! - `chunk.rs`: the mutations, one chunk of a replay, skip or retry-now
//!   with its audit count, in one statement;
//! - `purge.rs`: the janitor's purges (sent events, orphaned attempts, inbox
//!   entries, settled dead-letter records);
//! - `relays.rs`: the relay registry (list, pause, stale relays);
//! - `audit.rs`: the audit trail;
//! - `query.rs`: an [`EventFilter`] as SQL (a query with numbered binds),
//!   and the failure groups it may name;
//! - `row.rs`: the rows the admin reads.

mod audit;
mod chunk;
mod purge;
mod query;
mod reads;
mod relays;
mod row;

use chrono::{DateTime, Utc};
use outbox_core::admin::{
    AuditEntry, AuditRecord, Chunk, EventDetail, EventFilter, EventSummary, FailureGroup,
    OutboxAdmin, Page, RelayInfo, StatusReport,
};
use uuid::Uuid;

use super::PgOutboxStore;
use crate::sql::AdminSql;
use crate::{Error, Result};

impl PgOutboxStore {
    /// The admin's statements.
    fn admin_sql(&self) -> &AdminSql {
        &self.shared.admin
    }
}

impl OutboxAdmin for PgOutboxStore {
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
        audit::begin_audit(self, entry).await
    }

    async fn finish_audit(&self, audit: i64, outcome: &str) -> Result<()> {
        audit::finish_audit(self, audit, outcome).await
    }

    async fn audit_log(&self, before: Option<i64>, limit: usize) -> Result<Vec<AuditRecord>> {
        audit::audit_log(self, before, limit).await
    }

    async fn replay_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk> {
        // The table's trigger releases, in the same statement, the events
        // the replayed ones held back.
        let chunk = &self.admin_sql().replay_chunk;
        self.change_chunk(chunk, filter, after, limit, audit).await
    }

    async fn skip_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk> {
        let chunk = &self.admin_sql().skip_chunk;
        self.change_chunk(chunk, filter, after, limit, audit).await
    }

    async fn retry_now_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk> {
        let chunk = &self.admin_sql().retry_now_chunk;
        self.change_chunk(chunk, filter, after, limit, audit).await
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

    async fn purge_stale_relays(&self, before: DateTime<Utc>) -> Result<u64> {
        relays::purge_stale_relays(self, before).await
    }

    async fn purge_dead_letter_records_chunk(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<u64> {
        purge::purge_dead_letter_records_chunk(self, before, limit).await
    }

    async fn relays(&self) -> Result<Vec<RelayInfo>> {
        relays::relays(self).await
    }

    async fn set_paused(&self, relay: &str, paused: bool, audit: i64) -> Result<bool> {
        relays::set_paused(self, relay, paused, audit).await
    }
}
