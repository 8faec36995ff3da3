//! The admin's reads: the status report, event pages, one event with its
//! attempt history, failure groups, counts, the last seq and an
//! aggregate's head.

use diesel::sql_types::{BigInt, Text};
use diesel_async::RunQueryDsl;
use outbox_core::OutboxStore as _;
use outbox_core::admin::{
    Attempt, AttemptOutcome, EventDetail, EventFilter, EventSummary, EventTypeCounts, FailureGroup,
    OutboxAdmin as _, Page, StatusCounts, StatusReport, group_failures,
};
use uuid::Uuid;

use super::PgOutboxStore;
use super::query::{Bind, Query};
use super::row::{AttemptRow, CountRow, DoneRow, LastRow, TypeRow, count, status_name};
use crate::Result;
use crate::store::row::EventRow;

/// `sent` and `skipped` rows counted exactly at most; beyond, the status
/// report estimates from the table's statistics.
const EXACT_COUNT_LIMIT: i64 = 100_000;

/// The status report: counts per status and event type, the oldest unsent event, relays and the delivery order.
pub(super) async fn status(store: &PgOutboxStore) -> Result<StatusReport> {
    let stats = store.stats().await?;
    let by_type: Vec<TypeRow> = diesel::sql_query(&store.admin_sql().status_by_type)
        .load(&mut *store.conn().await?)
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
    let done: DoneRow = diesel::sql_query(&store.admin_sql().status_done)
        .bind::<BigInt, _>(EXACT_COUNT_LIMIT)
        .bind::<Text, _>(store.schema.name())
        .get_result(&mut *store.conn().await?)
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
    report.relays = store.relays().await?;
    report.delivery_order = store.delivery_order().await?;
    Ok(report)
}

/// A page of the events `filter` selects, in seq order after `after`.
pub(super) async fn list(
    store: &PgOutboxStore,
    filter: &EventFilter,
    after: Option<i64>,
    limit: usize,
) -> Result<Page<EventSummary>> {
    let sql = &store.admin_sql().list;
    let mut q = Query::new(
        &sql.head,
        vec![
            Bind::Big(after.unwrap_or(0)),
            Bind::Big(i64::try_from(limit).unwrap_or(i64::MAX)),
        ],
    );
    store.push_filter(&mut q, filter).await?;
    q.push(&sql.tail);
    let rows: Vec<EventRow> = q.build().load(&mut *store.conn().await?).await?;
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

/// The event with `id` and its attempt history.
pub(super) async fn show(store: &PgOutboxStore, id: Uuid) -> Result<Option<EventDetail>> {
    let mut conn = store.conn().await?;
    let row: Option<EventRow> = diesel::sql_query(&store.admin_sql().show)
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
    let attempts: Vec<AttemptRow> = diesel::sql_query(&store.admin_sql().attempts)
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

/// The failure groups of the events `filter` selects.
pub(super) async fn failure_groups(
    store: &PgOutboxStore,
    filter: &EventFilter,
) -> Result<Vec<FailureGroup>> {
    let rows = store.group_rows(filter).await?;
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

/// How many events `filter` selects.
pub(super) async fn count_events(store: &PgOutboxStore, filter: &EventFilter) -> Result<u64> {
    let sql = &store.admin_sql().count;
    let mut q = Query::new(&sql.head, Vec::new());
    store.push_filter(&mut q, filter).await?;
    q.push(&sql.tail);
    let row: CountRow = q.build().get_result(&mut *store.conn().await?).await?;
    Ok(count(row.n))
}

/// The largest seq.
pub(super) async fn last_seq(store: &PgOutboxStore) -> Result<Option<i64>> {
    // The primary key's last entry: a few pages whatever the table's size.
    let row: LastRow = diesel::sql_query(&store.admin_sql().last_seq)
        .get_result(&mut *store.conn().await?)
        .await?;
    Ok(row.last)
}

/// What holds an aggregate back: its first `retry` or `dead` event.
pub(super) async fn head(
    store: &PgOutboxStore,
    aggregate_type: &str,
    aggregate_id: &str,
) -> Result<Option<EventSummary>> {
    // What holds an aggregate back is its first `retry` or `dead` event
    // (a held event always has one before it): one probe of the
    // `blocking` index.
    let rows: Vec<EventRow> = diesel::sql_query(&store.admin_sql().head)
        .bind::<Text, _>(aggregate_type)
        .bind::<Text, _>(aggregate_id)
        .load(&mut *store.conn().await?)
        .await?;
    Ok(rows
        .into_iter()
        .next()
        .map(|row| EventSummary::from(&row.into_record_lenient())))
}
