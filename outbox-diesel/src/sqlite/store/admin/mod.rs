//! The admin API ([`OutboxAdmin`]) on SQLite: the same verbs and the same
//! contract as on PostgreSQL, with the statements of
//! `docs/design/sqlite-statements.md`.
//!
//! # What differs from PostgreSQL
//! - **A chunk is several statements in one short `BEGIN IMMEDIATE`**, not
//!   one statement: SQLite has no data-modifying CTEs. Replay, skip and
//!   retry-now select the chunk (at most the chunk size, in `seq` order
//!   after the cursor, every criterion of the filter, `seq_at_most`
//!   included), check it for live leases, change it and add the count to
//!   the audit row; the purge of sent events finds its chunk, deletes the
//!   events' attempts, then the events, and counts them. A chunk holds the
//!   file's write lock for as long as that takes, so keep chunks small
//!   (the default 1,000 rows is a few milliseconds); requests that record
//!   events wait that long at most, and chunks of several runs (or
//!   janitors) take turns.
//! - **A row a relay is publishing is leased, not locked.** A replay, skip
//!   or retry-now chunk that selects a row under a live lease (a claim's
//!   `lease_until` not yet passed) changes nothing: it rolls back, lets go
//!   of the write lock so that the relay can finish, and tries again, for
//!   up to 5 s (PostgreSQL's `lock_timeout` for the same wait); past that it
//!   fails with "run it again", as on PostgreSQL, and the run's audit row
//!   says so. A lease a dead relay left behind does not count once it has
//!   expired.
//! - **The purges skip nothing**: sent and skipped rows are never leased
//!   by a claim that may still mark them (a mark only matches `pending` and
//!   `retry` rows), and a chunk's transaction sees every committed row. Two
//!   janitors on one file purge in turns: what one deleted the other does
//!   not count.
//! - **`error_contains`** is matched with SQLite's `lower`, which folds
//!   ASCII letters only: `"échec"` does not find `"ÉCHEC"` (PostgreSQL's
//!   does).
//! - **The status report's estimate** of `sent` rows past 100,000 is an
//!   exact count of the table (SQLite keeps no row estimate): a few
//!   milliseconds per 200,000 rows.
//!
//! This file holds the [`OutboxAdmin`] impl, which hands each verb to the
//! file of its concern:
//! - `reads.rs`: the status report, event pages, one event, failure
//!   groups, counts, an aggregate's head;
//! - `chunk.rs`: one chunk of a replay, skip or retry-now with its audit
//!   count, and the wait for leased rows;
//! - `purge.rs`: the janitor's purges (sent events, orphaned attempts,
//!   inbox entries, settled dead-letter records);
//! - `relays.rs`: the relay registry (list, pause, stale relays);
//! - `filter.rs`: an [`EventFilter`] as SQL, and the failure groups it may
//!   name;
//! - `row.rs`: the rows the admin reads.
//!
//! The audit trail is `crate::sqlite::audit`, shared with
//! [`SqliteDeadLetters`](crate::sqlite::SqliteDeadLetters).

mod chunk;
mod filter;
mod purge;
mod reads;
mod relays;
mod row;

use chrono::{DateTime, Utc};
use diesel_async::pooled_connection::deadpool::Object;
use outbox_core::admin::{
    AuditEntry, AuditRecord, Chunk, EventDetail, EventFilter, EventSummary, FailureGroup,
    OutboxAdmin, Page, RelayInfo, StatusReport,
};
use uuid::Uuid;

use super::SqliteOutboxStore;
use crate::sqlite::{AsyncSqliteConnection, audit};
use crate::{Error, Result};

impl SqliteOutboxStore {
    /// A connection of the store's pool.
    async fn conn(&self) -> Result<Object<AsyncSqliteConnection>> {
        self.pool.get().await.map_err(Error::Pool)
    }
}

impl OutboxAdmin for SqliteOutboxStore {
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
        audit::begin(&mut *self.conn().await?, &self.admin, entry).await
    }

    async fn finish_audit(&self, audit: i64, outcome: &str) -> Result<()> {
        audit::record(
            &mut *self.conn().await?,
            &self.admin,
            audit,
            None,
            Some(outcome),
        )
        .await
    }

    async fn audit_log(&self, before: Option<i64>, limit: usize) -> Result<Vec<AuditRecord>> {
        audit::log(&mut *self.conn().await?, &self.admin, before, limit).await
    }

    async fn replay_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk> {
        // The schema's trigger releases, in the same statement, the events
        // the replayed ones held back.
        let chunk = &self.admin.replay;
        self.change_chunk(chunk, filter, after, limit, audit).await
    }

    async fn skip_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk> {
        let chunk = &self.admin.skip;
        self.change_chunk(chunk, filter, after, limit, audit).await
    }

    async fn retry_now_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk> {
        let chunk = &self.admin.retry_now;
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
