//! The audit trail (`outbox_audit`) on SQLite: one row per admin mutation,
//! written before it acts and ended when it is done. Shared by the store's
//! admin verbs and [`SqliteDeadLetters`](super::SqliteDeadLetters).

use diesel::sql_types::{BigInt, Nullable, Text};
use diesel_async::RunQueryDsl;
use outbox_core::admin::{AuditEntry, AuditRecord};

use super::AsyncSqliteConnection;
use super::sql::{SqliteAdminSql, micros, time};
use crate::Result;
use crate::rows::AuditFields;

#[derive(diesel::QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// An audit row as SQLite stores it (times as µs since the epoch).
#[derive(diesel::QueryableByName)]
struct AuditRow {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = BigInt)]
    at: i64,
    #[diesel(sql_type = Text)]
    identity: String,
    #[diesel(sql_type = Text)]
    action: String,
    #[diesel(sql_type = Text)]
    target: String,
    #[diesel(sql_type = BigInt)]
    count: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    finished_at: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    outcome: Option<String>,
}

fn now() -> i64 {
    micros(chrono::Utc::now())
}

fn big(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// Inserts the row of `entry`; returns its id.
pub(crate) async fn begin(
    conn: &mut AsyncSqliteConnection,
    sql: &SqliteAdminSql,
    entry: &AuditEntry,
) -> Result<i64> {
    let row: Id = diesel::sql_query(&sql.audit_begin)
        .bind::<Text, _>(&entry.identity)
        .bind::<Text, _>(&entry.action)
        .bind::<Text, _>(entry.target.to_string())
        .bind::<BigInt, _>(now())
        .get_result(conn)
        .await?;
    Ok(row.id)
}

/// Sets the row's count when `count` is given, and ends it with `outcome`
/// when that is given.
pub(crate) async fn record(
    conn: &mut AsyncSqliteConnection,
    sql: &SqliteAdminSql,
    audit: i64,
    count: Option<u64>,
    outcome: Option<&str>,
) -> Result<()> {
    diesel::sql_query(&sql.audit_record)
        .bind::<BigInt, _>(audit)
        .bind::<Nullable<BigInt>, _>(count.map(big))
        .bind::<Nullable<Text>, _>(outcome)
        .bind::<BigInt, _>(now())
        .execute(conn)
        .await?;
    Ok(())
}

/// Adds `n` to the count of audit row `audit` (in the transaction of the
/// change it counts).
pub(crate) async fn add_count(
    conn: &mut AsyncSqliteConnection,
    sql: &SqliteAdminSql,
    audit: i64,
    n: usize,
) -> Result<()> {
    diesel::sql_query(&sql.add_count)
        .bind::<BigInt, _>(audit)
        .bind::<BigInt, _>(big(n))
        .execute(conn)
        .await?;
    Ok(())
}

/// Up to `limit` audit rows before `before`, newest first.
pub(crate) async fn log(
    conn: &mut AsyncSqliteConnection,
    sql: &SqliteAdminSql,
    before: Option<i64>,
    limit: usize,
) -> Result<Vec<AuditRecord>> {
    let rows: Vec<AuditRow> = diesel::sql_query(&sql.audit_log)
        .bind::<BigInt, _>(before.unwrap_or(i64::MAX))
        .bind::<BigInt, _>(big(limit))
        .load(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            AuditRecord::from(AuditFields {
                id: r.id,
                at: time(r.at),
                identity: r.identity,
                action: r.action,
                target: r.target,
                count: r.count,
                finished_at: r.finished_at.map(time),
                outcome: r.outcome,
            })
        })
        .collect())
}
