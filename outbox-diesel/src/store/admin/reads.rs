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

use super::PgOutboxStore;
use super::query::{Bind, Query};
use super::row::{AttemptRow, CountRow, DoneRow, LastRow, TypeRow, count};
use crate::Result;
use crate::rows::EXACT_COUNT_LIMIT;
use crate::store::row::EventRow;

/// The status report: counts per status and event type, the oldest unsent event, relays and the delivery order.
pub(super) async fn status(store: &PgOutboxStore) -> Result<StatusReport> {
    let stats = store.stats().await?;
    let by_type: Vec<TypeRow> = diesel::sql_query(&store.admin_sql().status_by_type)
        .load(&mut *store.conn().await?)
        .await?;
    let done: DoneRow = diesel::sql_query(&store.admin_sql().status_done)
        .bind::<BigInt, _>(EXACT_COUNT_LIMIT)
        .bind::<Text, _>(store.schema.name())
        .get_result(&mut *store.conn().await?)
        .await?;
    let (counts, by_event_type) = crate::rows::status_counts(
        by_type.into_iter().map(|r| (r.event_type, r.status, r.n)),
        &crate::rows::DoneCounts {
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
    Ok(crate::rows::page_of(items, limit, |e| e.seq))
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
        .map(|a| crate::rows::attempt(a.at, a.relay, &a.outcome, a.error))
        .collect();
    Ok(Some(EventDetail::new(&row.into_record_lenient(), history)))
}

/// The failure groups of the events `filter` selects.
pub(super) async fn failure_groups(
    store: &PgOutboxStore,
    filter: &EventFilter,
) -> Result<Vec<FailureGroup>> {
    let rows = store.group_rows(filter).await?;
    Ok(crate::rows::failure_groups(
        rows.into_iter().map(|r| crate::rows::GroupFields {
            event_type: r.event_type,
            error: r.last_error,
            status: r.status,
            n: r.n,
            first: r.first,
            last: r.last,
        }),
        filter.group.as_deref(),
    ))
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
