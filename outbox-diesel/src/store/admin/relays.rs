//! The relay registry as the admin sees it: the relays, pausing one, and
//! removing stale ones.

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Bool, Text, Timestamptz};
use diesel_async::RunQueryDsl;
use outbox_core::admin::RelayInfo;

use super::PgOutboxStore;
use super::row::{CountRow, RelayRow};
use crate::Result;

/// Every registered relay, by name.
pub(super) async fn relays(store: &PgOutboxStore) -> Result<Vec<RelayInfo>> {
    let rows: Vec<RelayRow> = diesel::sql_query(&store.shared.relays.list)
        .load(&mut *store.conn().await?)
        .await?;
    Ok(rows.into_iter().map(RelayInfo::from).collect())
}

/// Pauses or resumes `relay`, counted in audit row `audit`.
pub(super) async fn set_paused(
    store: &PgOutboxStore,
    relay: &str,
    paused: bool,
    audit: i64,
) -> Result<bool> {
    let mut conn = store.conn().await?;
    let result = diesel::sql_query(&store.shared.relays.set_paused)
        .bind::<Text, _>(relay)
        .bind::<Bool, _>(paused)
        .bind::<BigInt, _>(audit)
        .get_result(&mut *conn)
        .await;
    let row: CountRow = store.checked(conn, result)?;
    Ok(row.n > 0)
}

/// Removes relays whose last heartbeat is before `before`, unless paused.
pub(super) async fn purge_stale_relays(
    store: &PgOutboxStore,
    before: DateTime<Utc>,
) -> Result<u64> {
    let mut conn = store.conn().await?;
    let result = diesel::sql_query(&store.shared.relays.purge_stale)
        .bind::<Timestamptz, _>(before)
        .execute(&mut *conn)
        .await;
    let deleted = store.checked(conn, result)?;
    Ok(deleted as u64)
}
