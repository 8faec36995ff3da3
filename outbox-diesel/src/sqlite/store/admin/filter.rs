//! An [`EventFilter`] as SQLite SQL: a query with its binds numbered as
//! they are pushed, the filter's conditions (as the catalogue spells them:
//! id lists and group pairs are one JSON text read with `json_each`), and
//! the failure groups a filter may name (resolved into the raw event type
//! and error pairs they stand for).

use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{BigInt, Text};
use diesel::sqlite::Sqlite;
use diesel_async::RunQueryDsl;
use outbox_core::EventStatus;
use outbox_core::admin::EventFilter;

use super::super::SqliteOutboxStore;
use super::row::GroupRow;
use crate::Result;
use crate::rows::{GROUP_ROWS, group_members};
use crate::sqlite::sql::micros;

/// A value bound to a `?n` placeholder.
#[derive(Clone)]
pub(super) enum Bind {
    Text(String),
    Big(i64),
}

/// SQL with its binds, numbered as they are pushed.
#[derive(Clone)]
pub(super) struct Query {
    sql: String,
    binds: Vec<Bind>,
}

impl Query {
    /// `head` (a fixed statement's start), whose placeholders `?1`, … are
    /// `binds` in order; later binds are numbered after them.
    pub(super) fn new(head: &str, binds: Vec<Bind>) -> Self {
        Query {
            sql: head.to_owned(),
            binds,
        }
    }

    /// Binds `value`; returns its placeholder.
    fn bind(&mut self, value: Bind) -> String {
        self.binds.push(value);
        format!("?{}", self.binds.len())
    }

    pub(super) fn push(&mut self, sql: &str) {
        self.sql.push_str(sql);
    }

    pub(super) fn build(self) -> BoxedSqlQuery<'static, Sqlite, SqlQuery> {
        let mut query = diesel::sql_query(self.sql).into_boxed::<Sqlite>();
        for bind in self.binds {
            query = match bind {
                Bind::Text(v) => query.bind::<Text, _>(v),
                Bind::Big(v) => query.bind::<BigInt, _>(v),
            };
        }
        query
    }
}

/// A limit as SQLite binds it.
pub(super) fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl SqliteOutboxStore {
    /// Appends `filter`'s conditions (each ` AND ...`) to `q`. A group is
    /// resolved first into the raw (event type, error) pairs it stands for.
    pub(super) async fn push_filter(&self, q: &mut Query, filter: &EventFilter) -> Result<()> {
        if !filter.ids.is_empty() {
            let ids: Vec<String> = filter.ids.iter().map(ToString::to_string).collect();
            let p = q.bind(Bind::Text(serde_json::json!(ids).to_string()));
            q.push(&format!(" AND id IN (SELECT value FROM json_each({p}))"));
        }
        if !filter.statuses.is_empty() {
            let quoted: Vec<String> = filter.statuses.iter().map(|s| format!("'{s}'")).collect();
            q.push(&format!(" AND status IN ({})", quoted.join(", ")));
        }
        let equal = [
            ("aggregate_type", &filter.aggregate_type),
            ("aggregate_id", &filter.aggregate_id),
            ("event_type", &filter.event_type),
        ];
        for (column, value) in equal {
            if let Some(value) = value {
                let p = q.bind(Bind::Text(value.clone()));
                q.push(&format!(" AND {column} = {p}"));
            }
        }
        if let Some(text) = &filter.error_contains {
            // SQLite's `lower` folds ASCII only (PostgreSQL's folds all).
            let p = q.bind(Bind::Text(text.to_lowercase()));
            q.push(&format!(" AND instr(lower(last_error), {p}) > 0"));
        }
        let bounds = [
            ("occurred_at >=", filter.occurred_after.map(micros)),
            ("occurred_at <", filter.occurred_before.map(micros)),
            ("seq <=", filter.seq_at_most),
        ];
        for (condition, value) in bounds {
            if let Some(value) = value {
                let p = q.bind(Bind::Big(value));
                q.push(&format!(" AND {condition} {p}"));
            }
        }
        if let Some(group) = &filter.group {
            let pairs = self.group_members(filter, group).await?;
            let p = q.bind(Bind::Text(serde_json::json!(pairs).to_string()));
            q.push(&format!(
                " AND status IN ('retry', 'dead') AND (event_type, {}) IN \
                 (SELECT value ->> 0, value ->> 1 FROM json_each({p}))",
                crate::sqlite::sql::ERROR_KEY
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
    ) -> Result<Vec<(String, String)>> {
        let mut others = filter.clone();
        others.group = None;
        let rows = self.group_rows(&others).await?;
        let (types, errors) = group_members(
            rows.into_iter().map(|r| (r.event_type, r.last_error)),
            group,
        );
        Ok(types.into_iter().zip(errors).collect())
    }

    /// The failure groups' rows of the `dead` and `retry` events `filter`
    /// selects.
    pub(super) async fn group_rows(&self, filter: &EventFilter) -> Result<Vec<GroupRow>> {
        let Some(filter) = filter.restricted_to(&[EventStatus::Dead, EventStatus::Retry]) else {
            return Ok(Vec::new());
        };
        let sql = &self.admin.groups;
        let mut q = Query::new(&sql.head, vec![Bind::Big(GROUP_ROWS)]);
        Box::pin(self.push_filter(&mut q, &filter)).await?;
        q.push(&sql.tail);
        let mut conn = self.conn().await?;
        Ok(q.build().load(&mut *conn).await?)
    }
}
