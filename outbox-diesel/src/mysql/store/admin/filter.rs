//! An [`EventFilter`] as MariaDB SQL: a query whose `?` binds are pushed
//! in text order, the filter's conditions (the table of
//! `docs/design/mysql-statements.md` section 8), and the failure groups a
//! filter may name, resolved into the raw (event type, error) pairs they
//! stand for.

use chrono::NaiveDateTime;
use diesel::mysql::Mysql;
use diesel::query_builder::{BoxedSqlQuery, SqlQuery};
use diesel::sql_types::{BigInt, Datetime, Text};
use diesel_async::RunQueryDsl;
use outbox_core::EventStatus;
use outbox_core::admin::EventFilter;

use super::super::MysqlOutboxStore;
use super::row::GroupRow;
use crate::Result;
use crate::mysql::sql::admin::{ERROR_KEY, FilteredSql};
use crate::rows::GROUP_ROWS;

/// A value bound to a `?`.
pub(super) enum Bind {
    Text(String),
    Time(NaiveDateTime),
    Big(i64),
}

/// SQL with its binds, in text order.
pub(super) struct Query {
    sql: String,
    binds: Vec<Bind>,
}

impl Query {
    /// `head` (a statement's start) with the binds of its `?`s.
    pub(super) fn new(head: &str, binds: Vec<Bind>) -> Self {
        Query {
            sql: head.to_owned(),
            binds,
        }
    }

    /// Appends `sql`, whose `?`s are `binds` in order.
    pub(super) fn push(&mut self, sql: &str, binds: impl IntoIterator<Item = Bind>) {
        self.sql.push_str(sql);
        self.binds.extend(binds);
    }

    pub(super) fn build(self) -> BoxedSqlQuery<'static, Mysql, SqlQuery> {
        let mut query = diesel::sql_query(self.sql).into_boxed::<Mysql>();
        for bind in self.binds {
            query = match bind {
                Bind::Text(v) => query.bind::<Text, _>(v),
                Bind::Time(v) => query.bind::<Datetime, _>(v),
                Bind::Big(v) => query.bind::<BigInt, _>(v),
            };
        }
        query
    }
}

/// `n` as a `LIMIT` bind.
pub(super) fn limit(n: usize) -> Bind {
    Bind::Big(i64::try_from(n).unwrap_or(i64::MAX))
}

/// Status literals (`'retry', 'dead'`): a fixed set, never user text.
fn literals(statuses: &[EventStatus]) -> String {
    statuses
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

impl MysqlOutboxStore {
    /// `sql.head`, binds `head`, the filter's conditions, `sql.tail`,
    /// binds `tail`.
    pub(super) async fn filtered(
        &self,
        sql: &FilteredSql,
        head: Vec<Bind>,
        filter: &EventFilter,
        tail: Vec<Bind>,
    ) -> Result<Query> {
        let mut q = Query::new(&sql.head, head);
        self.push_filter(&mut q, filter).await?;
        q.push(&sql.tail, tail);
        Ok(q)
    }

    /// Appends `filter`'s conditions (each ` AND …`) to `q`. A group is
    /// resolved first into the raw (event type, error) pairs it stands for.
    async fn push_filter(&self, q: &mut Query, filter: &EventFilter) -> Result<()> {
        if !filter.ids.is_empty() {
            let ids: Vec<String> = filter.ids.iter().map(ToString::to_string).collect();
            q.push(
                " AND id IN (SELECT j.id FROM JSON_TABLE(?, '$[*]' COLUMNS (id CHAR(36) \
                   CHARACTER SET ascii COLLATE ascii_bin PATH '$')) AS j)",
                [Bind::Text(serde_json::Value::from(ids).to_string())],
            );
        }
        if !filter.statuses.is_empty() {
            q.push(
                &format!(" AND status IN ({})", literals(&filter.statuses)),
                [],
            );
        }
        match (&filter.aggregate_type, &filter.aggregate_id) {
            (Some(t), Some(i)) => q.push(
                " AND aggregate_key = UNHEX(SHA2(CONCAT(?, CHAR(0), ?), 256)) \
                 AND aggregate_type = ? AND aggregate_id = ?",
                [t, i, t, i].map(|v| Bind::Text(v.clone())),
            ),
            (Some(t), None) => q.push(" AND aggregate_type = ?", [Bind::Text(t.clone())]),
            (None, Some(i)) => q.push(" AND aggregate_id = ?", [Bind::Text(i.clone())]),
            (None, None) => {}
        }
        if let Some(t) = &filter.event_type {
            q.push(" AND event_type = ?", [Bind::Text(t.clone())]);
        }
        if let Some(text) = &filter.error_contains {
            q.push(
                " AND LOCATE(?, LOWER(last_error)) > 0",
                [Bind::Text(text.to_lowercase())],
            );
        }
        if let Some(at) = filter.occurred_after {
            q.push(" AND occurred_at >= ?", [Bind::Time(at.naive_utc())]);
        }
        if let Some(at) = filter.occurred_before {
            q.push(" AND occurred_at < ?", [Bind::Time(at.naive_utc())]);
        }
        if let Some(seq) = filter.seq_at_most {
            q.push(" AND seq <= ?", [Bind::Big(seq)]);
        }
        if let Some(group) = &filter.group {
            let (types, errors) = self.group_members(filter, group).await?;
            let pairs: Vec<serde_json::Value> = types
                .into_iter()
                .zip(errors)
                .map(|(t, e)| serde_json::json!([t, e]))
                .collect();
            q.push(
                &format!(
                    " AND status IN ({}) AND (event_type, {ERROR_KEY}) IN ( \
                       SELECT j.t, j.e FROM JSON_TABLE(?, '$[*]' COLUMNS ( \
                         t VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin \
                           PATH '$[0]', \
                         e LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin \
                           PATH '$[1]')) AS j)",
                    literals(&[EventStatus::Retry, EventStatus::Dead])
                ),
                [Bind::Text(serde_json::Value::from(pairs).to_string())],
            );
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

    /// The failure-group rows of the `retry` and `dead` events `filter`
    /// selects.
    pub(super) async fn group_rows(&self, filter: &EventFilter) -> Result<Vec<GroupRow>> {
        let Some(filter) = filter.restricted_to(&[EventStatus::Dead, EventStatus::Retry]) else {
            return Ok(Vec::new());
        };
        let sql = &self.admin.groups;
        let q =
            Box::pin(self.filtered(sql, Vec::new(), &filter, vec![Bind::Big(GROUP_ROWS)])).await?;
        Ok(q.build().load(&mut *self.conn().await?).await?)
    }
}
