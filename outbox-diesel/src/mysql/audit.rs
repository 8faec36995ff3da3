//! The audit trail (`outbox_audit`) on MariaDB: one row per admin
//! mutation, written before it acts and ended when it is done. Shared by
//! the store's admin verbs and [`MysqlDeadLetters`](super::MysqlDeadLetters).

use chrono::NaiveDateTime;
use diesel::sql_types::{BigInt, Datetime, Nullable, Text};
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};
use outbox_core::admin::{AuditEntry, AuditRecord};

use super::sql::admin::MysqlAuditSql;
use crate::Result;
use crate::rows::AuditFields;

#[derive(diesel::QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

#[derive(diesel::QueryableByName)]
struct AuditRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Datetime)]
    at: NaiveDateTime,
    #[diesel(sql_type = Text)]
    identity: String,
    #[diesel(sql_type = Text)]
    action: String,
    #[diesel(sql_type = Text)]
    target: String,
    #[diesel(sql_type = BigInt)]
    count: i64,
    #[diesel(sql_type = Nullable<Datetime>)]
    finished_at: Option<NaiveDateTime>,
    #[diesel(sql_type = Nullable<Text>)]
    outcome: Option<String>,
}

impl From<AuditRow> for AuditFields {
    fn from(r: AuditRow) -> Self {
        AuditFields {
            id: r.id,
            at: r.at.and_utc(),
            identity: r.identity,
            action: r.action,
            target: r.target,
            count: r.count,
            finished_at: r.finished_at.map(|t| t.and_utc()),
            outcome: r.outcome,
        }
    }
}

/// Inserts the row of `entry`; returns its id.
pub(crate) async fn begin(
    conn: &mut AsyncMysqlConnection,
    sql: &MysqlAuditSql,
    entry: &AuditEntry,
) -> Result<i64> {
    let row: Id = diesel::sql_query(&sql.begin)
        .bind::<Text, _>(&entry.identity)
        .bind::<Text, _>(&entry.action)
        .bind::<Text, _>(entry.target.to_string())
        .get_result(conn)
        .await?;
    Ok(row.id)
}

/// Sets the row's count when `count` is given, and ends it with `outcome`
/// when that is given.
pub(crate) async fn record(
    conn: &mut AsyncMysqlConnection,
    sql: &MysqlAuditSql,
    audit: i64,
    count: Option<u64>,
    outcome: Option<&str>,
) -> Result<()> {
    diesel::sql_query(&sql.record)
        .bind::<Nullable<BigInt>, _>(count.map(|n| i64::try_from(n).unwrap_or(i64::MAX)))
        .bind::<Nullable<Text>, _>(outcome)
        .bind::<Nullable<Text>, _>(outcome)
        .bind::<BigInt, _>(audit)
        .execute(conn)
        .await?;
    Ok(())
}

/// Up to `limit` rows before `before`, newest first.
pub(crate) async fn log(
    conn: &mut AsyncMysqlConnection,
    sql: &MysqlAuditSql,
    before: Option<i64>,
    limit: usize,
) -> Result<Vec<AuditRecord>> {
    let rows: Vec<AuditRow> = diesel::sql_query(&sql.log)
        .bind::<BigInt, _>(before.unwrap_or(i64::MAX))
        .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
        .load(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| AuditRecord::from(AuditFields::from(r)))
        .collect())
}
