//! [`MysqlOutboxStore`]: the relay's store on MariaDB.
//!
//! The same contract as PostgreSQL's store (the conformance checks of
//! `outbox_core::testing::conformance` run on both): per-aggregate order by
//! `seq`, a failing or dead event holds back only its own aggregate (the
//! events behind it are `held`), claims of several relays never overlap.
//!
//! # How a claim works here
//! A claim is a transaction at `READ COMMITTED` (at `REPEATABLE READ`
//! InnoDB's next-key locks would block producers' inserts for the whole
//! publish) whose row locks are held while the batch is published, as on
//! PostgreSQL, in three statements where PostgreSQL needs one (MariaDB has
//! no data-modifying CTEs): the window (a consistent read of the first due
//! events in `seq` order, each with whether an earlier event of its
//! aggregate holds it back), the lock (`FOR UPDATE SKIP LOCKED` of the
//! unblocked ones, at most the batch), and, only when the window has
//! blocked rows, their hold. The server bounds a claim left hanging with
//! `idle_transaction_timeout` (the claim timeout, set for the claim's
//! session and reset when it finishes): MariaDB closes the connection,
//! which rolls the claim back.
//!
//! # Held events are released explicitly
//! PostgreSQL releases the events held behind a head in a trigger when the
//! head leaves `retry`/`dead`; a MariaDB trigger cannot update its own
//! table. The store releases them in the same transaction as the change:
//! after marking a retry sent, after a replay or a skip; and
//! [`maintain`](OutboxStore::maintain) releases any held event that
//! nothing holds back (after an operator edited rows by hand).
//!
//! # No `NOTIFY`
//! Relays learn of new events by polling and from in-process wakeups
//! ([`wakeups`](OutboxStore::wakeups) never yields).

mod admin;
mod claim;
mod row;
mod sql;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Datetime, Integer, Text};
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncMysqlConnection, RunQueryDsl};
use outbox_core::{
    Claimed, DeadSelector, DeliveryOrder, OutboxStats, OutboxStore, RelayControl, RelayRegistration,
};
use uuid::Uuid;

pub use claim::MysqlClaim;
pub(crate) use sql::COLUMNS;

use super::sql::MysqlSql;
use super::sql::admin::{MysqlAdminSql, MysqlAuditSql};
use crate::prepared::PreparedExt;
use crate::{Error, MysqlTransaction, Result};
use row::{AggregateRow, OrderRow, PausedRow, SeqRow, StatsRow, VersionRow};
use sql::MysqlStoreSql;

/// How long the delivery order is cached (a change reaches every relay
/// within it).
const ORDER_CACHE_TTL: Duration = Duration::from_secs(1);

/// The relay's store on MariaDB: claims, marks, stats, replays, the relay
/// registry, and the admin API (`outbox_core::admin::OutboxAdmin`, for
/// `Admin` and the `Janitor`; see the [module docs](super) for what
/// differs from PostgreSQL). Get one from
/// [`MysqlSettings::store`](super::MysqlSettings::store).
#[derive(Clone)]
pub struct MysqlOutboxStore {
    pool: Pool<AsyncMysqlConnection>,
    shared: Arc<MysqlSql>,
    sql: Arc<MysqlStoreSql>,
    admin: Arc<MysqlAdminSql>,
    audit: Arc<MysqlAuditSql>,
    prepare: bool,
    keep_sent: bool,
    claim_timeout: Duration,
    claim_window: usize,
    order_cache: Arc<Mutex<Option<(DeliveryOrder, Instant)>>>,
    version_ok: Arc<AtomicBool>,
    relay: Arc<Mutex<Option<RelayRegistration>>>,
}

impl std::fmt::Debug for MysqlOutboxStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlOutboxStore")
            .field("database", &self.shared.database)
            .field("keep_sent", &self.keep_sent)
            .field("claim_timeout", &self.claim_timeout)
            .field("claim_window", &self.claim_window)
            .finish_non_exhaustive()
    }
}

impl MysqlOutboxStore {
    pub(crate) fn new(
        pool: Pool<AsyncMysqlConnection>,
        shared: Arc<MysqlSql>,
        prepare: bool,
    ) -> Self {
        MysqlOutboxStore {
            sql: Arc::new(MysqlStoreSql::new(&shared)),
            admin: Arc::new(MysqlAdminSql::new(&shared)),
            audit: Arc::new(MysqlAuditSql::new(&shared)),
            pool,
            shared,
            prepare,
            keep_sent: false,
            claim_timeout: Duration::from_secs(60),
            claim_window: 4,
            order_cache: Arc::new(Mutex::new(None)),
            version_ok: Arc::new(AtomicBool::new(false)),
            relay: Arc::new(Mutex::new(None)),
        }
    }

    /// Keep sent events (status `sent`, for audit; purge them with
    /// [`purge_sent`](OutboxStore::purge_sent)) instead of deleting them
    /// when they are confirmed. Default off.
    #[must_use]
    pub fn keep_sent(mut self, keep: bool) -> Self {
        self.keep_sent = keep;
        self
    }

    /// How long a claim may stay open (default 60 s): the server closes a
    /// claim's connection idle for longer (`idle_transaction_timeout`,
    /// whole seconds), and the relay stops publishing a batch past 0.8 of
    /// it. Must exceed the publisher's confirm timeout.
    #[must_use]
    pub fn claim_timeout(mut self, timeout: Duration) -> Self {
        self.claim_timeout = timeout;
        self
    }

    /// How many batches of due events an ordered claim reads to find a
    /// batch of events it may take (default 4).
    #[must_use]
    pub fn claim_window(mut self, batches: usize) -> Self {
        self.claim_window = batches.max(1);
        self
    }

    /// The delivery order every relay on this outbox obeys.
    ///
    /// # Errors
    /// [`Error::Database`], [`Error::Pool`], [`Error::UnknownDeliveryOrder`].
    pub async fn delivery_order(&self) -> Result<DeliveryOrder> {
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        let row: OrderRow = diesel::sql_query(&self.sql.get_order)
            .get_result(&mut *conn)
            .await?;
        self.order_from_db(&row.delivery_order)
    }

    /// Sets the delivery order; switching to unordered releases every held
    /// event.
    ///
    /// # Errors
    /// [`Error::Database`], [`Error::Pool`].
    pub async fn set_delivery_order(&self, order: DeliveryOrder) -> Result<()> {
        let mut tx = MysqlTransaction::begin(&self.pool).await?;
        diesel::sql_query(&self.sql.set_order)
            .bind::<Text, _>(order.as_str())
            .execute(&mut *tx)
            .await?;
        if order == DeliveryOrder::Unordered {
            diesel::sql_query(&self.sql.release_unordered)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        *self
            .order_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        Ok(())
    }

    /// A pooled connection.
    async fn conn(
        &self,
    ) -> Result<diesel_async::pooled_connection::deadpool::Object<AsyncMysqlConnection>> {
        self.pool.get().await.map_err(Error::Pool)
    }

    fn order_from_db(&self, value: &str) -> Result<DeliveryOrder> {
        value
            .parse::<DeliveryOrder>()
            .map_err(|_| Error::UnknownDeliveryOrder {
                schema: self.shared.database.clone().unwrap_or_default(),
                value: value.to_owned(),
            })
    }

    async fn cached_order(&self, conn: &mut AsyncMysqlConnection) -> Result<DeliveryOrder> {
        let cached = *self
            .order_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some((order, read_at)) = cached
            && read_at.elapsed() < ORDER_CACHE_TTL
        {
            return Ok(order);
        }
        let row: OrderRow = diesel::sql_query(&self.sql.get_order)
            .prepared(self.prepare)
            .get_result(conn)
            .await?;
        let order = self.order_from_db(&row.delivery_order)?;
        *self
            .order_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((order, Instant::now()));
        Ok(order)
    }

    async fn check_version(&self, conn: &mut AsyncMysqlConnection) -> Result<()> {
        if AtomicBool::load(&self.version_ok, Ordering::Relaxed) {
            return Ok(());
        }
        let found = diesel::sql_query(&self.sql.schema_version)
            .get_result::<VersionRow>(conn)
            .await?
            .version;
        let known = super::MYSQL_MIGRATIONS.last().map_or(0, |m| m.version);
        if found != known {
            return Err(Error::SchemaVersion {
                schema: self.shared.database.clone().unwrap_or_default(),
                found,
                min: known,
                max: known,
            });
        }
        self.version_ok.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn relay_name(&self) -> Option<String> {
        self.relay
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|r| r.name.clone())
    }

    /// Releases the held events nothing holds back (all of them on an
    /// unordered outbox).
    async fn release_orphans(&self, conn: &mut AsyncMysqlConnection) -> Result<usize> {
        if self.cached_order(conn).await? == DeliveryOrder::Unordered {
            return Ok(diesel::sql_query(&self.sql.release_unordered)
                .execute(conn)
                .await?);
        }
        let picked: Vec<SeqRow> = diesel::sql_query(&self.sql.release_orphans_pick)
            .load(&mut *conn)
            .await?;
        claim::release_seqs(&self.sql, self.prepare, conn, picked).await
    }

    /// The aggregate of event `id`, if it exists.
    async fn aggregate_of(
        &self,
        conn: &mut AsyncMysqlConnection,
        id: Uuid,
    ) -> Result<Option<(String, String)>> {
        let rows: Vec<AggregateRow> = diesel::sql_query(&self.sql.aggregate_of_id)
            .bind::<Text, _>(id.to_string())
            .load(conn)
            .await?;
        Ok(rows
            .into_iter()
            .next()
            .map(|r| (r.aggregate_type, r.aggregate_id)))
    }
}

impl OutboxStore for MysqlOutboxStore {
    type Error = Error;
    type Claim = MysqlClaim;

    async fn claim(&self, limit: usize) -> Result<Option<MysqlClaim>> {
        Ok(match self.claim_as(None, limit).await? {
            Claimed::Batch(claim) => Some(claim),
            _ => None,
        })
    }

    async fn claim_for(&self, relay: &str, limit: usize) -> Result<Claimed<MysqlClaim>> {
        self.claim_as(Some(relay), limit).await
    }

    async fn stats(&self) -> Result<OutboxStats> {
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        let row: StatsRow = diesel::sql_query(&self.sql.stats)
            .get_result(&mut *conn)
            .await?;
        let ordered = self.order_from_db(&row.delivery_order)? == DeliveryOrder::PerAggregate;
        Ok(OutboxStats {
            backlog: u64::try_from(row.backlog).unwrap_or(0),
            oldest_unsent_age: row
                .oldest_age
                .map(|secs| Duration::from_secs_f64(secs.max(0.0))),
            dead: u64::try_from(row.dead).unwrap_or(0),
            unroutable: u64::try_from(row.unroutable).unwrap_or(0),
            relays_live: u64::try_from(row.relays_live).unwrap_or(0),
            blocked_aggregates: if ordered {
                u64::try_from(row.blocked).unwrap_or(0)
            } else {
                0
            },
        })
    }

    async fn purge_sent(&self, before: DateTime<Utc>, limit: usize) -> Result<u64> {
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        let mut deleted = 0;
        for status in ["sent", "skipped"] {
            let left = limit.saturating_sub(deleted);
            if left == 0 {
                break;
            }
            deleted += diesel::sql_query(&self.sql.purge)
                .bind::<Text, _>(status)
                .bind::<Datetime, _>(before.naive_utc())
                .bind::<BigInt, _>(i64::try_from(left).unwrap_or(i64::MAX))
                .execute(&mut *conn)
                .await?;
        }
        Ok(deleted as u64)
    }

    async fn replay_dead(&self, selector: DeadSelector) -> Result<u64> {
        // What PostgreSQL's trigger does, in the same transaction: the
        // events held behind the replayed ones flow again.
        let mut tx = MysqlTransaction::begin(&self.pool).await?;
        let replayed = match selector {
            DeadSelector::Id(id) => {
                let aggregate = self.aggregate_of(&mut tx, id).await?;
                let replayed = diesel::sql_query(&self.sql.replay_id)
                    .bind::<Text, _>(id.to_string())
                    .execute(&mut *tx)
                    .await?;
                if replayed > 0 {
                    let aggregates: Vec<_> = aggregate.into_iter().collect();
                    claim::release(&self.sql, self.prepare, &mut tx, &aggregates).await?;
                }
                replayed
            }
            DeadSelector::Aggregate {
                aggregate_type,
                aggregate_id,
            } => {
                let replayed = diesel::sql_query(&self.sql.replay_aggregate)
                    .bind::<Text, _>(&aggregate_type)
                    .bind::<Text, _>(&aggregate_id)
                    .bind::<Text, _>(&aggregate_type)
                    .bind::<Text, _>(&aggregate_id)
                    .execute(&mut *tx)
                    .await?;
                if replayed > 0 {
                    let aggregates = [(aggregate_type, aggregate_id)];
                    claim::release(&self.sql, self.prepare, &mut tx, &aggregates).await?;
                }
                replayed
            }
            _ => {
                let replayed = diesel::sql_query(&self.sql.replay_all)
                    .execute(&mut *tx)
                    .await?;
                if replayed > 0 {
                    self.release_orphans(&mut tx).await?;
                }
                replayed
            }
        };
        tx.commit().await?;
        Ok(replayed as u64)
    }

    async fn skip_dead(&self, id: Uuid) -> Result<bool> {
        let mut tx = MysqlTransaction::begin(&self.pool).await?;
        let aggregate = self.aggregate_of(&mut tx, id).await?;
        let skipped = diesel::sql_query(&self.sql.skip)
            .bind::<Text, _>(id.to_string())
            .execute(&mut *tx)
            .await?;
        if skipped > 0 {
            let aggregates: Vec<_> = aggregate.into_iter().collect();
            claim::release(&self.sql, self.prepare, &mut tx, &aggregates).await?;
        }
        tx.commit().await?;
        Ok(skipped == 1)
    }

    async fn maintain(&self) -> Result<()> {
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        let released = self.release_orphans(&mut conn).await?;
        if released > 0 {
            tracing::warn!(
                released,
                "outbox: released held events that nothing held back any more"
            );
        }
        Ok(())
    }

    async fn register_relay(&self, relay: &RelayRegistration) -> Result<()> {
        // A relay that registers again under its name keeps its pause.
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        diesel::sql_query(&self.sql.register)
            .bind::<Text, _>(&relay.name)
            .bind::<Text, _>(&relay.host)
            .bind::<Integer, _>(i32::try_from(relay.pid).unwrap_or(i32::MAX))
            .bind::<Text, _>(&relay.version)
            .bind::<Datetime, _>(relay.started_at.naive_utc())
            .bind::<BigInt, _>(
                i64::try_from(relay.heartbeat_interval.as_millis()).unwrap_or(i64::MAX),
            )
            .execute(&mut *conn)
            .await?;
        *self.relay.lock().unwrap_or_else(PoisonError::into_inner) = Some(relay.clone());
        Ok(())
    }

    async fn heartbeat(&self, name: &str, in_flight: u32) -> Result<RelayControl> {
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        // Found rows (the driver's CLIENT_FOUND_ROWS): 1 when registered.
        let found = diesel::sql_query(&self.sql.heartbeat)
            .bind::<Integer, _>(i32::try_from(in_flight).unwrap_or(i32::MAX))
            .bind::<Text, _>(name)
            .execute(&mut *conn)
            .await?;
        if found == 0 {
            // Removed meanwhile (as stale, or by hand): register again.
            drop(conn);
            let registration = self
                .relay
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            if let Some(registration) = registration.filter(|r| r.name == name) {
                self.register_relay(&registration).await?;
            }
            return Ok(RelayControl::default());
        }
        let paused: Vec<PausedRow> = diesel::sql_query(&self.sql.paused)
            .bind::<Text, _>(name)
            .load(&mut *conn)
            .await?;
        Ok(RelayControl::new(paused.iter().any(|p| p.paused)))
    }

    async fn deregister_relay(&self, name: &str) -> Result<()> {
        let mut conn = self.pool.get().await.map_err(Error::Pool)?;
        diesel::sql_query(&self.sql.deregister)
            .bind::<Text, _>(name)
            .execute(&mut *conn)
            .await?;
        Ok(())
    }
}
