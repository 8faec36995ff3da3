//! An [`EventFilter`] as SQL: a query with its binds numbered as they are
//! pushed, the filter's conditions, and the failure groups a filter may
//! name (resolved into the raw event type and error pairs they stand for).

use chrono::{DateTime, Utc};
use diesel::pg::Pg;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{Array, BigInt, Text, Timestamptz};
use diesel_async::RunQueryDsl;
use outbox_core::EventStatus;
use outbox_core::admin::EventFilter;
use uuid::Uuid;

use super::PgOutboxStore;
use super::row::GroupRow;
use crate::Result;
use crate::rows::GROUP_ROWS;
use crate::sql::{ERROR_KEY, literals};

/// A value bound to a `$n` placeholder.
pub(super) enum Bind {
    Text(String),
    Texts(Vec<String>),
    Uuids(Vec<Uuid>),
    Time(DateTime<Utc>),
    Big(i64),
}

/// SQL with its binds, numbered as they are pushed.
#[derive(Default)]
pub(super) struct Query {
    sql: String,
    binds: Vec<Bind>,
}

impl Query {
    /// `head` (a fixed statement's start), whose placeholders `$1`, … are
    /// `binds` in order; later binds are numbered after them.
    pub(super) fn new(head: &str, binds: Vec<Bind>) -> Self {
        Query {
            sql: head.to_owned(),
            binds,
        }
    }

    /// Binds `value`; returns its placeholder.
    pub(super) fn bind(&mut self, value: Bind) -> String {
        self.binds.push(value);
        format!("${}", self.binds.len())
    }

    pub(super) fn push(&mut self, sql: &str) {
        self.sql.push_str(sql);
    }

    pub(super) fn build(self) -> BoxedSqlQuery<'static, Pg, SqlQuery> {
        let mut query = diesel::sql_query(self.sql).into_boxed::<Pg>();
        for bind in self.binds {
            query = match bind {
                Bind::Text(v) => query.bind::<Text, _>(v),
                Bind::Texts(v) => query.bind::<Array<Text>, _>(v),
                Bind::Uuids(v) => query.bind::<Array<diesel::sql_types::Uuid>, _>(v),
                Bind::Time(v) => query.bind::<Timestamptz, _>(v),
                Bind::Big(v) => query.bind::<BigInt, _>(v),
            };
        }
        query
    }
}

impl PgOutboxStore {
    /// Appends `filter`'s conditions (each ` AND ...`) to `q`. A group is
    /// resolved first into the raw (event type, error) pairs it stands for.
    pub(super) async fn push_filter(&self, q: &mut Query, filter: &EventFilter) -> Result<()> {
        if !filter.ids.is_empty() {
            let p = q.bind(Bind::Uuids(filter.ids.clone()));
            q.push(&format!(" AND id = ANY({p})"));
        }
        if !filter.statuses.is_empty() {
            q.push(&format!(" AND status IN ({})", literals(&filter.statuses)));
        }
        if let Some(t) = &filter.aggregate_type {
            let p = q.bind(Bind::Text(t.clone()));
            q.push(&format!(" AND aggregate_type = {p}"));
        }
        if let Some(i) = &filter.aggregate_id {
            let p = q.bind(Bind::Text(i.clone()));
            q.push(&format!(" AND aggregate_id = {p}"));
        }
        if let Some(t) = &filter.event_type {
            let p = q.bind(Bind::Text(t.clone()));
            q.push(&format!(" AND event_type = {p}"));
        }
        if let Some(text) = &filter.error_contains {
            let p = q.bind(Bind::Text(text.to_lowercase()));
            q.push(&format!(" AND strpos(lower(last_error), {p}) > 0"));
        }
        if let Some(at) = filter.occurred_after {
            let p = q.bind(Bind::Time(at));
            q.push(&format!(" AND occurred_at >= {p}"));
        }
        if let Some(at) = filter.occurred_before {
            let p = q.bind(Bind::Time(at));
            q.push(&format!(" AND occurred_at < {p}"));
        }
        if let Some(seq) = filter.seq_at_most {
            let p = q.bind(Bind::Big(seq));
            q.push(&format!(" AND seq <= {p}"));
        }
        if let Some(group) = &filter.group {
            let (types, errors) = self.group_members(filter, group).await?;
            let t = q.bind(Bind::Texts(types));
            let e = q.bind(Bind::Texts(errors));
            q.push(&format!(
                " AND status IN ({}) AND (event_type, {ERROR_KEY}) IN \
                 (SELECT * FROM unnest({t}::text[], {e}::text[]))",
                literals(&[EventStatus::Retry, EventStatus::Dead])
            ));
        }
        Ok(())
    }

    /// The (event type, raw error) pairs of the failures in `group` among
    /// the events `filter` selects otherwise.
    async fn group_members(
        &self,
        filter: &EventFilter,
        group: &str,
    ) -> Result<(Vec<String>, Vec<String>)> {
        let mut others = filter.clone();
        others.group = None;
        let rows = self.group_rows(&others).await?;
        Ok(crate::rows::group_members(
            rows.into_iter().map(|r| (r.event_type, r.last_error)),
            group,
        ))
    }

    pub(super) async fn group_rows(&self, filter: &EventFilter) -> Result<Vec<GroupRow>> {
        let Some(filter) = filter.restricted_to(&[EventStatus::Dead, EventStatus::Retry]) else {
            return Ok(Vec::new());
        };
        let sql = &self.shared.admin.groups;
        let mut q = Query::new(&sql.head, vec![Bind::Big(GROUP_ROWS)]);
        Box::pin(self.push_filter(&mut q, &filter)).await?;
        q.push(&sql.tail);
        let mut conn = self.conn().await?;
        Ok(q.build().load(&mut *conn).await?)
    }
}
