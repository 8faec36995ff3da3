//! The admin's audit trail: an entry begun before a mutation acts, ended
//! when it is done, and the log read back.

use diesel::sql_types::BigInt;
use diesel_async::RunQueryDsl;
use outbox_core::admin::{AuditEntry, AuditRecord};

use super::PgOutboxStore;
use super::row::AuditRow;
use crate::Result;

/// Starts the audit row of `entry`; returns its id.
pub(super) async fn begin_audit(store: &PgOutboxStore, entry: &AuditEntry) -> Result<i64> {
    let mut conn = store.conn().await?;
    let result = crate::audit::begin(&mut conn, &store.shared.audit, entry).await;
    store.checked_outcome(conn, result)
}

/// Ends audit row `audit` with `outcome`.
pub(super) async fn finish_audit(store: &PgOutboxStore, audit: i64, outcome: &str) -> Result<()> {
    let mut conn = store.conn().await?;
    let result =
        crate::audit::record(&mut conn, &store.shared.audit, audit, None, Some(outcome)).await;
    store.checked_outcome(conn, result)
}

/// Up to `limit` audit rows before `before`, newest first.
pub(super) async fn audit_log(
    store: &PgOutboxStore,
    before: Option<i64>,
    limit: usize,
) -> Result<Vec<AuditRecord>> {
    let rows: Vec<AuditRow> = diesel::sql_query(&store.shared.audit.log)
        .bind::<BigInt, _>(before.unwrap_or(i64::MAX))
        .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
        .load(&mut *store.conn().await?)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            AuditRecord::from(crate::rows::AuditFields {
                id: r.id,
                at: r.at,
                identity: r.identity,
                action: r.action,
                target: r.target,
                count: r.count,
                finished_at: r.finished_at,
                outcome: r.outcome,
            })
        })
        .collect())
}
