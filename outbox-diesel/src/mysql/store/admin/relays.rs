//! The relay registry as the admin sees it on MariaDB: the relays, pausing
//! one (counted in its audit row, in one transaction), and removing stale
//! ones.

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Bool, Datetime, Text};
use diesel_async::RunQueryDsl;
use outbox_core::admin::RelayInfo;

use super::super::MysqlOutboxStore;
use super::row::RelayRow;
use crate::rows::RelayFields;
use crate::{MysqlTransaction, Result};

/// Every registered relay, by name.
pub(super) async fn relays(store: &MysqlOutboxStore) -> Result<Vec<RelayInfo>> {
    let rows: Vec<RelayRow> = diesel::sql_query(&store.admin.relays_list)
        .load(&mut *store.conn().await?)
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| RelayInfo::from(RelayFields::from(r)))
        .collect())
}

/// Pauses or resumes `relay`, counted in audit row `audit`.
pub(super) async fn set_paused(
    store: &MysqlOutboxStore,
    relay: &str,
    paused: bool,
    audit: i64,
) -> Result<bool> {
    let mut tx = MysqlTransaction::begin(&store.pool).await?;
    // Matched rows (the driver's CLIENT_FOUND_ROWS): 1 also when the relay
    // already had that pause.
    let found = diesel::sql_query(&store.admin.relays_set_paused)
        .bind::<Bool, _>(paused)
        .bind::<Text, _>(relay)
        .execute(&mut *tx)
        .await?;
    diesel::sql_query(&store.admin.audit_add_count)
        .bind::<BigInt, _>(i64::try_from(found).unwrap_or(i64::MAX))
        .bind::<BigInt, _>(audit)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(found > 0)
}

/// Removes relays whose last heartbeat is before `before`, unless paused.
pub(super) async fn purge_stale_relays(
    store: &MysqlOutboxStore,
    before: DateTime<Utc>,
) -> Result<u64> {
    let deleted = diesel::sql_query(&store.admin.relays_purge_stale)
        .bind::<Datetime, _>(before.naive_utc())
        .execute(&mut *store.conn().await?)
        .await?;
    Ok(deleted as u64)
}
