//! The audit trail (`outbox_audit`): one row per admin mutation, written
//! before it acts and ended when it is done. Shared by the outbox store's
//! admin verbs and [`PgDeadLetters`](crate::PgDeadLetters).

use diesel::sql_types::{BigInt, Jsonb, Nullable, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_core::admin::AuditEntry;

use crate::Result;
use crate::sql::AuditSql;

#[derive(diesel::QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// Inserts the row of `entry`; returns its id.
pub(crate) async fn begin(
    conn: &mut AsyncPgConnection,
    sql: &AuditSql,
    entry: &AuditEntry,
) -> Result<i64> {
    let row: Id = diesel::sql_query(&sql.begin)
        .bind::<Text, _>(no_nul(&entry.identity))
        .bind::<Text, _>(no_nul(&entry.action))
        .bind::<Jsonb, _>(&entry.target)
        .get_result(conn)
        .await?;
    Ok(row.id)
}

/// Sets the row's count when `count` is given, and ends it with `outcome`
/// when that is given.
pub(crate) async fn record(
    conn: &mut AsyncPgConnection,
    sql: &AuditSql,
    audit: i64,
    count: Option<u64>,
    outcome: Option<&str>,
) -> Result<()> {
    diesel::sql_query(&sql.record)
        .bind::<BigInt, _>(audit)
        .bind::<Nullable<BigInt>, _>(count.map(|n| i64::try_from(n).unwrap_or(i64::MAX)))
        .bind::<Nullable<Text>, _>(outcome.map(no_nul))
        .execute(conn)
        .await?;
    Ok(())
}

/// PostgreSQL text cannot hold NUL.
fn no_nul(text: &str) -> String {
    text.replace('\0', "\u{FFFD}")
}
