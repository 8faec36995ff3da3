//! The relay registry as the admin sees it on SQLite: the relays, pausing
//! one (counted in its audit row in the same transaction), and removing
//! stale ones.

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Bool, Text};
use diesel_async::RunQueryDsl;
use outbox_core::admin::RelayInfo;

use super::super::SqliteOutboxStore;
use super::row::RelayRow;
use crate::rows::RelayFields;
use crate::sqlite::audit;
use crate::sqlite::sql::micros;
use crate::{Result, SqliteTransaction};

/// Every registered relay, by name.
pub(super) async fn relays(store: &SqliteOutboxStore) -> Result<Vec<RelayInfo>> {
    let rows: Vec<RelayRow> = diesel::sql_query(&store.admin.relays)
        .bind::<BigInt, _>(micros(Utc::now()))
        .load(&mut *store.conn().await?)
        .await?;
    Ok(rows
        .into_iter()
        .map(|row| RelayInfo::from(RelayFields::from(row)))
        .collect())
}

/// Pauses or resumes `relay`, counted in audit row `audit`.
pub(super) async fn set_paused(
    store: &SqliteOutboxStore,
    relay: &str,
    paused: bool,
    audit: i64,
) -> Result<bool> {
    let mut tx = SqliteTransaction::begin(&store.pool).await?;
    let changed = diesel::sql_query(&store.admin.set_paused)
        .bind::<Text, _>(relay)
        .bind::<Bool, _>(paused)
        .execute(&mut *tx)
        .await?;
    audit::add_count(&mut tx, &store.admin, audit, changed).await?;
    tx.commit().await?;
    Ok(changed > 0)
}

/// Removes relays whose last heartbeat is before `before`, unless paused.
pub(super) async fn purge_stale_relays(
    store: &SqliteOutboxStore,
    before: DateTime<Utc>,
) -> Result<u64> {
    let deleted = diesel::sql_query(&store.admin.purge_stale_relays)
        .bind::<BigInt, _>(micros(before))
        .execute(&mut *store.conn().await?)
        .await?;
    Ok(deleted as u64)
}
