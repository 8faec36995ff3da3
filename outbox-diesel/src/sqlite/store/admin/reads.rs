//! The admin's reads: the status report, event pages, one event with its
//! attempt history, failure groups, counts, the last seq and an
//! aggregate's head.

use diesel::sql_types::{BigInt, Text};
use diesel_async::RunQueryDsl;
use outbox_core::OutboxStore as _;
use outbox_core::admin::{
    EventDetail, EventFilter, EventSummary, FailureGroup, OutboxAdmin as _, Page, StatusReport,
};
use uuid::Uuid;

use super::super::SqliteOutboxStore;
use super::super::row::EventRow;
use super::filter::{Bind, Query, limit};
use super::row::{AttemptRow, CountRow, DoneRow, LastRow, TypeRow};
use crate::Result;
use crate::rows::{
    DoneCounts, EXACT_COUNT_LIMIT, GroupFields, attempt, count,
    failure_groups as failure_groups_of, page_of, status_counts,
};
use crate::sqlite::sql::time;

/// The status report: counts per status and event type, the oldest unsent
/// event, relays and the delivery order.
pub(super) async fn status(store: &SqliteOutboxStore) -> Result<StatusReport> {
    let stats = store.stats().await?;
    let mut conn = store.conn().await?;
    let by_type: Vec<TypeRow> = diesel::sql_query(&store.admin.status_by_type)
        .load(&mut *conn)
        .await?;
    let done: DoneRow = diesel::sql_query(&store.admin.status_done)
        .bind::<BigInt, _>(EXACT_COUNT_LIMIT)
        .get_result(&mut *conn)
        .await?;
    drop(conn);
    let (counts, by_event_type) = status_counts(
        by_type.into_iter().map(|r| (r.event_type, r.status, r.n)),
        &DoneCounts {
            sent: done.sent,
            skipped: done.skipped,
            estimate: done.estimate,
        },
    );
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
    store: &SqliteOutboxStore,
    filter: &EventFilter,
    after: Option<i64>,
    page: usize,
) -> Result<Page<EventSummary>> {
    let sql = &store.admin.list;
    let binds = vec![Bind::Big(after.unwrap_or(0)), Bind::Big(limit(page))];
    let mut q = Query::new(&sql.head, binds);
    store.push_filter(&mut q, filter).await?;
    q.push(&sql.tail);
    let rows: Vec<EventRow> = q.build().load(&mut *store.conn().await?).await?;
    let items: Vec<EventSummary> = rows
        .into_iter()
        .map(|row| EventSummary::from(&row.into_record_lenient()))
        .collect();
    Ok(page_of(items, page, |e| e.seq))
}

/// The event with `id` and its attempt history.
pub(super) async fn show(store: &SqliteOutboxStore, id: Uuid) -> Result<Option<EventDetail>> {
    let mut conn = store.conn().await?;
    let rows: Vec<EventRow> = diesel::sql_query(&store.admin.show)
        .bind::<Text, _>(id.to_string())
        .load(&mut *conn)
        .await?;
    let Some(row) = rows.into_iter().next() else {
        return Ok(None);
    };
    let attempts: Vec<AttemptRow> = diesel::sql_query(&store.admin.attempts)
        .bind::<BigInt, _>(row.seq)
        .load(&mut *conn)
        .await?;
    let history = attempts
        .into_iter()
        .map(|a| attempt(time(a.at), a.relay, &a.outcome, a.error))
        .collect();
    Ok(Some(EventDetail::new(&row.into_record_lenient(), history)))
}

/// The failure groups of the events `filter` selects.
pub(super) async fn failure_groups(
    store: &SqliteOutboxStore,
    filter: &EventFilter,
) -> Result<Vec<FailureGroup>> {
    let rows = store.group_rows(filter).await?;
    Ok(failure_groups_of(
        rows.into_iter().map(GroupFields::from),
        filter.group.as_deref(),
    ))
}

/// How many events `filter` selects.
pub(super) async fn count_events(store: &SqliteOutboxStore, filter: &EventFilter) -> Result<u64> {
    let sql = &store.admin.count;
    let mut q = Query::new(&sql.head, Vec::new());
    store.push_filter(&mut q, filter).await?;
    q.push(&sql.tail);
    let row: CountRow = q.build().get_result(&mut *store.conn().await?).await?;
    Ok(count(row.n))
}

/// The largest seq (the rowid b-tree's last entry).
pub(super) async fn last_seq(store: &SqliteOutboxStore) -> Result<Option<i64>> {
    let row: LastRow = diesel::sql_query(&store.admin.last_seq)
        .get_result(&mut *store.conn().await?)
        .await?;
    Ok(row.last)
}

/// What holds an aggregate back: its first `retry` or `dead` event (a held
/// event always has one before it), one probe of the `blocking` index.
pub(super) async fn head(
    store: &SqliteOutboxStore,
    aggregate_type: &str,
    aggregate_id: &str,
) -> Result<Option<EventSummary>> {
    let rows: Vec<EventRow> = diesel::sql_query(&store.admin.head)
        .bind::<Text, _>(aggregate_type)
        .bind::<Text, _>(aggregate_id)
        .load(&mut *store.conn().await?)
        .await?;
    Ok(rows
        .into_iter()
        .next()
        .map(|row| EventSummary::from(&row.into_record_lenient())))
}
