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
//!
//! This file holds the [`OutboxAdmin`] impl; the parts:
//! - `query.rs`: an [`EventFilter`] as SQL (a query with numbered binds),
//!   and the failure groups it may name;
//! - `chunk.rs`: one chunk of a replay, skip or retry-now, with its audit
//!   count, in one statement;
//! - `row.rs`: the rows the admin reads, and their columns.

mod chunk;
mod query;
mod row;

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Bool, Text, Timestamptz};
use diesel_async::RunQueryDsl;
use outbox_core::admin::{
    Attempt, AttemptOutcome, AuditEntry, AuditRecord, Chunk, EventDetail, EventFilter,
    EventSummary, EventTypeCounts, FailureGroup, OutboxAdmin, Page, RelayInfo, StatusCounts,
    StatusReport, group_failures,
};
use outbox_core::{EventStatus, OutboxStore, Transition};
use uuid::Uuid;

use super::PgOutboxStore;
use super::row::EventRow;
use crate::sql::AdminSql;
use crate::{Error, Result};
use query::{Bind, Query};
use row::{
    AttemptRow, AuditRow, CountRow, DoneRow, LastRow, PurgeRow, RelayRow, TypeRow, count,
    status_name,
};

/// `sent` and `skipped` rows counted exactly at most; beyond, the status
/// report estimates from the table's statistics.
const EXACT_COUNT_LIMIT: i64 = 100_000;

impl PgOutboxStore {
    /// The admin's statements.
    fn admin_sql(&self) -> &AdminSql {
        &self.shared.admin
    }

    /// Deletes up to `limit` attempt rows whose event is gone (deleted when
    /// sent, with `keep_sent(false)`, or by hand); returns how many.
    pub(crate) async fn purge_orphan_attempts(&self, limit: usize) -> Result<u64> {
        let deleted = diesel::sql_query(&self.admin_sql().purge_orphan_attempts)
            .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
            .execute(&mut *self.conn().await?)
            .await?;
        Ok(deleted as u64)
    }
}

impl OutboxAdmin for PgOutboxStore {
    type Error = Error;

    async fn status(&self) -> Result<StatusReport> {
        let stats = self.stats().await?;
        let by_type: Vec<TypeRow> = diesel::sql_query(&self.admin_sql().status_by_type)
            .load(&mut *self.conn().await?)
            .await?;
        let mut counts = StatusCounts::default();
        let mut types: std::collections::BTreeMap<String, StatusCounts> = Default::default();
        for row in by_type {
            let status = status_name(&row.status);
            counts.add(status, count(row.n));
            types
                .entry(row.event_type)
                .or_default()
                .add(status, count(row.n));
        }
        let done: DoneRow = diesel::sql_query(&self.admin_sql().status_done)
            .bind::<BigInt, _>(EXACT_COUNT_LIMIT)
            .bind::<Text, _>(self.schema.name())
            .get_result(&mut *self.conn().await?)
            .await?;
        counts.skipped = count(done.skipped);
        counts.estimated = done.skipped >= EXACT_COUNT_LIMIT;
        if done.sent < EXACT_COUNT_LIMIT {
            counts.sent = count(done.sent);
        } else {
            counts.estimated = true;
            let others = counts.unsent() + counts.dead + counts.skipped;
            counts.sent = count(done.estimate)
                .saturating_sub(others)
                .max(count(done.sent));
        }
        let mut by_event_type: Vec<EventTypeCounts> = types
            .into_iter()
            .map(|(t, c)| EventTypeCounts::new(t, c))
            .collect();
        by_event_type.sort_by_key(|t| std::cmp::Reverse(t.counts.unsent() + t.counts.dead));
        let mut report = StatusReport::default();
        report.counts = counts;
        report.oldest_unsent_age_seconds = stats.oldest_unsent_age.map(|a| a.as_secs_f64());
        report.blocked_aggregates = stats.blocked_aggregates;
        report.unroutable = stats.unroutable;
        report.by_event_type = by_event_type;
        report.relays = self.relays().await?;
        report.delivery_order = self.delivery_order().await?.into();
        Ok(report)
    }

    async fn list(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Page<EventSummary>> {
        let sql = &self.admin_sql().list;
        let mut q = Query::new(
            &sql.head,
            vec![
                Bind::Big(after.unwrap_or(0)),
                Bind::Big(i64::try_from(limit).unwrap_or(i64::MAX)),
            ],
        );
        self.push_filter(&mut q, filter).await?;
        q.push(&sql.tail);
        let rows: Vec<EventRow> = q.build().load(&mut *self.conn().await?).await?;
        let items: Vec<EventSummary> = rows
            .into_iter()
            .map(|row| EventSummary::from(&row.into_record_lenient()))
            .collect();
        let next = if items.len() == limit {
            items.last().map(|e| e.seq)
        } else {
            None
        };
        Ok(Page::new(items, next))
    }

    async fn show(&self, id: Uuid) -> Result<Option<EventDetail>> {
        let mut conn = self.conn().await?;
        let row: Option<EventRow> = diesel::sql_query(&self.admin_sql().show)
            .bind::<diesel::sql_types::Uuid, _>(id)
            .get_result(&mut *conn)
            .await
            .map(Some)
            .or_else(|e| match e {
                diesel::result::Error::NotFound => Ok(None),
                e => Err(e),
            })?;
        let Some(row) = row else { return Ok(None) };
        let seq = row.seq;
        let attempts: Vec<AttemptRow> = diesel::sql_query(&self.admin_sql().attempts)
            .bind::<BigInt, _>(seq)
            .load(&mut *conn)
            .await?;
        let history = attempts
            .into_iter()
            .map(|a| {
                Attempt::new(
                    a.at,
                    a.relay,
                    AttemptOutcome::parse(&a.outcome).unwrap_or(AttemptOutcome::Retry),
                    a.error,
                )
            })
            .collect();
        Ok(Some(EventDetail::new(&row.into_record_lenient(), history)))
    }

    async fn failure_groups(&self, filter: &EventFilter) -> Result<Vec<FailureGroup>> {
        let rows = self.group_rows(filter).await?;
        let rows = rows.into_iter().map(|r| {
            (
                r.event_type,
                r.last_error,
                status_name(&r.status),
                count(r.n),
                r.first,
                r.last,
            )
        });
        let mut groups = group_failures(rows);
        if let Some(group) = &filter.group {
            groups.retain(|g| g.id == *group);
        }
        Ok(groups)
    }

    async fn count(&self, filter: &EventFilter) -> Result<u64> {
        let sql = &self.admin_sql().count;
        let mut q = Query::new(&sql.head, Vec::new());
        self.push_filter(&mut q, filter).await?;
        q.push(&sql.tail);
        let row: CountRow = q.build().get_result(&mut *self.conn().await?).await?;
        Ok(count(row.n))
    }

    async fn last_seq(&self) -> Result<Option<i64>> {
        // The primary key's last entry: a few pages whatever the table's size.
        let row: LastRow = diesel::sql_query(&self.admin_sql().last_seq)
            .get_result(&mut *self.conn().await?)
            .await?;
        Ok(row.last)
    }

    async fn head(&self, aggregate_type: &str, aggregate_id: &str) -> Result<Option<EventSummary>> {
        // What holds an aggregate back is its first `retry` or `dead` event
        // (a held event always has one before it): one probe of the
        // `blocking` index.
        let rows: Vec<EventRow> = diesel::sql_query(&self.admin_sql().head)
            .bind::<Text, _>(aggregate_type)
            .bind::<Text, _>(aggregate_id)
            .load(&mut *self.conn().await?)
            .await?;
        Ok(rows
            .into_iter()
            .next()
            .map(|row| EventSummary::from(&row.into_record_lenient())))
    }

    async fn begin_audit(&self, entry: &AuditEntry) -> Result<i64> {
        crate::audit::begin(&mut *self.conn().await?, &self.shared.audit, entry).await
    }

    async fn finish_audit(&self, audit: i64, outcome: &str) -> Result<()> {
        crate::audit::record(
            &mut *self.conn().await?,
            &self.shared.audit,
            audit,
            None,
            Some(outcome),
        )
        .await
    }

    async fn audit_log(&self, before: Option<i64>, limit: usize) -> Result<Vec<AuditRecord>> {
        let rows: Vec<AuditRow> = diesel::sql_query(&self.shared.audit.log)
            .bind::<BigInt, _>(before.unwrap_or(i64::MAX))
            .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
            .load(&mut *self.conn().await?)
            .await?;
        Ok(rows
            .into_iter()
            .map(|r| {
                let target = serde_json::from_str(&r.target).unwrap_or(serde_json::Value::Null);
                let record = AuditRecord::new(
                    r.id,
                    r.at,
                    AuditEntry::new(r.identity, r.action, target),
                    count(r.count),
                );
                match (r.finished_at, r.outcome) {
                    (Some(at), Some(outcome)) => record.finished(at, outcome),
                    _ => record,
                }
            })
            .collect())
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
        self.change_chunk(
            filter,
            Transition::Replay.from(),
            &self.admin_sql().replay_chunk,
            after,
            limit,
            audit,
        )
        .await
    }

    async fn skip_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk> {
        self.change_chunk(
            filter,
            Transition::Skip.from(),
            &self.admin_sql().skip_chunk,
            after,
            limit,
            audit,
        )
        .await
    }

    async fn retry_now_chunk(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
        audit: i64,
    ) -> Result<Chunk> {
        self.change_chunk(
            filter,
            &[EventStatus::Retry],
            &self.admin_sql().retry_now_chunk,
            after,
            limit,
            audit,
        )
        .await
    }

    async fn purge_sent_chunk(
        &self,
        before: DateTime<Utc>,
        after: Option<i64>,
        limit: usize,
        audit: Option<i64>,
    ) -> Result<Chunk> {
        if after.is_none() {
            self.purge_orphan_attempts(limit).await?;
        }
        let row: PurgeRow = diesel::sql_query(&self.admin_sql().purge_sent_chunk)
            .bind::<BigInt, _>(after.unwrap_or(0))
            .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
            .bind::<Timestamptz, _>(before)
            .bind::<BigInt, _>(audit.unwrap_or(0))
            .get_result(&mut *self.conn().await?)
            .await?;
        Ok(Chunk {
            changed: count(row.changed),
            last: if row.past { None } else { row.last },
        })
    }

    async fn purge_inbox_chunk(
        &self,
        before: DateTime<Utc>,
        limit: usize,
        audit: Option<i64>,
    ) -> Result<u64> {
        let row: CountRow = diesel::sql_query(&self.admin_sql().purge_inbox_chunk)
            .bind::<Timestamptz, _>(before)
            .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
            .bind::<BigInt, _>(audit.unwrap_or(0))
            .get_result(&mut *self.conn().await?)
            .await?;
        Ok(count(row.n))
    }

    async fn purge_stale_relays(&self, before: DateTime<Utc>) -> Result<u64> {
        let deleted = diesel::sql_query(&self.shared.relays.purge_stale)
            .bind::<Timestamptz, _>(before)
            .execute(&mut *self.conn().await?)
            .await?;
        Ok(deleted as u64)
    }

    async fn purge_dead_letter_records_chunk(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<u64> {
        let deleted = diesel::sql_query(&self.admin_sql().purge_dead_letter_records_chunk)
            .bind::<Timestamptz, _>(before)
            .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
            .execute(&mut *self.conn().await?)
            .await?;
        Ok(deleted as u64)
    }

    async fn relays(&self) -> Result<Vec<RelayInfo>> {
        let rows: Vec<RelayRow> = diesel::sql_query(&self.shared.relays.list)
            .load(&mut *self.conn().await?)
            .await?;
        Ok(rows.into_iter().map(RelayInfo::from).collect())
    }

    async fn set_paused(&self, relay: &str, paused: bool, audit: i64) -> Result<bool> {
        let row: CountRow = diesel::sql_query(&self.shared.relays.set_paused)
            .bind::<Text, _>(relay)
            .bind::<Bool, _>(paused)
            .bind::<BigInt, _>(audit)
            .get_result(&mut *self.conn().await?)
            .await?;
        Ok(row.n > 0)
    }
}
