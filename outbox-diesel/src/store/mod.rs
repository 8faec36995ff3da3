//! [`PgOutboxStore`]: the relay's [`OutboxStore`] on PostgreSQL.
//!
//! # Claim design
//! A claim is **one short transaction that holds row locks** while the relay
//! publishes: `BEGIN` → pick and lock up to the claim's limit (`batch_size`, growing to `max_batch_size` while a backlog lasts) rows with
//! `FOR UPDATE SKIP LOCKED` → (publish, await confirms) → mark sent / failed
//! in one statement each → `COMMIT`. One write per event; other relays skip
//! the locked rows without waiting; a relay that dies loses its connection
//! and PostgreSQL releases its rows at once. A relay that hangs (or a network
//! partition) is bounded by `idle_in_transaction_session_timeout`, set per
//! claim to [`claim_timeout`](PgOutboxStoreBuilder::claim_timeout) (default
//! 60 s): after it, PostgreSQL ends the session and the rows are claimable
//! again. The relay stops publishing a batch at 80 % of that time, and no
//! confirm wait outlasts it.
//!
//! The alternative, a committed lease (`locked_by`, `locked_until`) marked
//! later, costs a second write and a second commit per batch, and needs
//! fencing; its one advantage, surviving publishes longer than a
//! transaction may stay open, does not apply to confirms that take
//! milliseconds. See the crate docs for the measured comparison.
//!
//! # Ordered claims
//! In [`DeliveryOrder::PerAggregate`] mode a claim is **one statement**. It
//! reads a window of the oldest claimable rows (`claim_window` × batch
//! size): pending rows in `seq` order and retries that are due; flags each
//! row blocked when an earlier event of its aggregate is dead, a retry, or
//! held; locks the first (the claim's limit)
//! unblocked rows no other relay holds (`FOR UPDATE SKIP LOCKED`); marks
//! the blocked ones `held`; and returns the window with the locked rows.
//! The store keeps, per aggregate, the locked rows before its first row that
//! is blocked or was not locked, so the holder of an aggregate's head also
//! takes its following events and an aggregate's events are never taken
//! with a gap.
//!
//! # Blocked aggregates cost nothing to anyone else
//! An event waiting behind a failed event of its aggregate is **held**
//! ([`EventStatus::Held`]): it leaves the partial index the window is read
//! from, so however many events wait behind blocked aggregates, the window
//! holds only rows a claim can take, and its cost stays flat (bench W4:
//! 579 vs 591 shared buffers per claim of 100 with and without 1,000 dead
//! heads of 100 events each, 4 relays × 2 loops and a producer running).
//! - **Held** by [`mark_failed`](outbox_core::Claim::mark_failed) for the window's
//!   followers of an event that becomes `retry` or `dead`, and by the claim
//!   for the rows it finds blocked (events recorded later for a blocked
//!   aggregate, or left pending by an earlier version). The claim holds a
//!   row only after locking (`FOR SHARE SKIP LOCKED`) a `retry` or `dead`
//!   event before it, so that event cannot be sent, replayed or skipped
//!   until the hold is committed. (Without that lock, a hold committed
//!   after the release ran would leave an orphan that the gate below does
//!   not see, and the aggregate's next event would overtake it.)
//! - **Released** by a trigger of the table (migration 2), in the
//!   transaction that removes the `retry` or `dead` event they waited
//!   behind, whoever removes it: a send, a replay or a skip by this
//!   library, a relay of an earlier version, an operator's `UPDATE` or
//!   `DELETE`. Its `WHEN` clauses keep it off ordinary sends. As a repair,
//!   [`maintain`](OutboxStore::maintain), which the relay runs with its
//!   stats, releases held events of aggregates where no `retry` or `dead`
//!   event precedes them, at one index probe per such aggregate; in
//!   unordered mode every held event.
//! - **Probed only where it can matter.** A held event always has a `retry`
//!   or `dead` event before it, so the claim first hashes the aggregates that
//!   have one (from the small `outbox_events_blocking` index: about one page
//!   per 120 aggregates) and probes only the window rows of those. Above
//!   4,000 such events (where hashing them costs as much as probing) it
//!   probes every window row instead (2–3 index pages each).
//!
//! Upgrading a starving outbox (rows left pending behind dead events by an
//! earlier version) holds them at up to a window per claim: 99,000 of them
//! took 25–33 s with 4 relays on the reference machine, during which other
//! aggregates' events wait behind them as before.
//!
//! Reading the window and locking in one statement saves a round trip per
//! claim over two statements (window, then lock the planned rows): about
//! 0.2 ms of commit-to-publish latency on the reference machine. The same
//! statement reads whether an operator paused the claiming relay (a
//! primary-key probe of `outbox_relays`) and then claims nothing, so a pause
//! takes effect at the relay's next claim (what it costs is measured in the
//! docs of `PgOutboxStore`'s `claim_for`). Every
//! statement of the store runs prepared (see the [`crate`] docs, "Prepared
//! statements").
//!
//! # Where the parts live
//! This file holds [`PgOutboxStore`] and its [`OutboxStore`] impl; the rest:
//! - `builder.rs`: [`PgOutboxStoreBuilder`], the settings and their defaults;
//! - `order.rs`: the delivery order, its cache and its admin
//!   (`delivery_order`, `set_delivery_order`);
//! - `explain.rs`: `explain_claim`, the plan of the claim statement;
//! - `claim.rs`: a claim's transaction and [`PgClaim`], the claimed batch
//!   marked and finished in it (holding the followers of failed events);
//! - `pick.rs`: the claim statement chosen, run and read (version check,
//!   malformed rows, per-aggregate runs);
//! - `plan.rs`, `row.rs`: the runs kept per aggregate, and the rows read;
//! - `listen.rs`: `LISTEN`/`NOTIFY` wakeups, a stream owning its connection;
//! - `admin/`: the admin store (`outbox_core::admin`).
//!
//! The statements are in the crate's `sql` module: the store's own
//! ([`StoreSql`], claims and marks) rendered when the store is built, the
//! rest (admin, relay registry, audit, `LISTEN`) shared with the other parts
//! of its [`PgSettings`](crate::PgSettings).
//!
//! [`EventStatus::Held`]: outbox_core::EventStatus::Held

mod admin;
mod builder;
mod claim;
mod explain;
mod listen;
mod order;
mod pick;
mod row;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Integer, Text, Timestamptz};
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use futures_util::{Stream, StreamExt as _};

use outbox_core::{
    Claimed, DeadSelector, DeliveryOrder, OutboxStats, OutboxStore, RelayControl, RelayRegistration,
};
use uuid::Uuid;

pub use builder::PgOutboxStoreBuilder;
pub use claim::PgClaim;

use crate::prepared::PreparedExt;
use crate::schema::Schema;
use crate::sql::{Sql, StoreSql};
use crate::{Error, Result};
use order::order_from_db;
use row::StatsRow;

/// The relay's store on a diesel-async (deadpool) pool.
///
/// ```no_run
/// use outbox_core::testing::RecordingPublisher;
/// use outbox_core::Relay;
/// use outbox_diesel::PgOutboxStore;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let url = "postgres://postgres@127.0.0.1:5432/app";
/// outbox_diesel::migrate_url(url, "public").await?;
/// let store = PgOutboxStore::builder(outbox_diesel::pool(url, 8)?)
///     .listen(url) // LISTEN/NOTIFY wakeups on a direct connection
///     .build()?;
/// # let publisher = RecordingPublisher::new();
/// let relay = Relay::builder(store, publisher).build()?;
/// relay.run().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PgOutboxStore {
    pool: Pool<AsyncPgConnection>,
    schema: Schema,
    /// The store's own statements (claims, marks), rendered when it was built.
    sql: Arc<StoreSql>,
    /// The schema's SQL (admin, relay registry, audit, `LISTEN`), shared
    /// with the other parts of its settings.
    shared: Arc<Sql>,
    /// Keep the statements prepared on each connection.
    prepare: bool,
    listen_url: Option<String>,
    /// How the `LISTEN` connection is checked.
    liveness: listen::Liveness,
    claim_timeout: Duration,
    claim_window: usize,
    /// The table's delivery order, re-read at most once a second.
    order_cache: Arc<std::sync::Mutex<Option<(DeliveryOrder, Instant)>>>,
    /// Whether many events are `retry` or `dead` (which ordered claim to
    /// run), re-read at most every `pick::BLOCKING_CACHE_TTL`.
    blocking_cache: Arc<std::sync::Mutex<Option<(bool, Instant)>>>,
    /// The outbox's schema version was found to be one this store reads.
    version_ok: Arc<std::sync::atomic::AtomicBool>,
    /// The relay registered through this store (its name goes into the
    /// attempt history of what its claims mark failed).
    relay: Arc<std::sync::Mutex<Option<RelayRegistration>>>,
}

impl std::fmt::Debug for PgOutboxStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOutboxStore")
            .field("schema", &self.schema.name())
            .field(
                "listen_url",
                &self.listen_url.as_deref().map(crate::error::redact_url),
            )
            .field("claim_timeout", &self.claim_timeout)
            .field("claim_window", &self.claim_window)
            .finish_non_exhaustive()
    }
}

impl PgOutboxStore {
    fn relay_name(&self) -> Option<String> {
        self.relay
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|r| r.name.clone())
    }

    /// The schema of this outbox.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The schema's shared SQL (tests check that it is shared).
    #[cfg(test)]
    pub(crate) fn shared_sql(&self) -> &Arc<Sql> {
        &self.shared
    }

    async fn conn(&self) -> Result<Object<AsyncPgConnection>> {
        self.pool.get().await.map_err(Error::Pool)
    }

    /// `result`, of a query run on `conn` outside a transaction. A
    /// read-only answer (a standby, a demoted primary) closes `conn` rather
    /// than returning it to the pool, so the pool's next connection goes to
    /// a server that takes writes. (A claim's connection is closed on any
    /// error: its transaction is dropped.)
    fn checked<T>(
        &self,
        conn: Object<AsyncPgConnection>,
        result: diesel::QueryResult<T>,
    ) -> Result<T> {
        self.checked_outcome(conn, result.map_err(Error::from))
    }

    /// [`checked`](Self::checked) of a result that is already this crate's.
    fn checked_outcome<T>(&self, conn: Object<AsyncPgConnection>, result: Result<T>) -> Result<T> {
        if let Err(err) = &result
            && err.is_read_only()
        {
            tracing::error!(
                schema = self.schema.name(),
                "the database is read-only (a standby?): closing the connection; new ones go \
                 to a server that takes writes (target_session_attrs=read-write)"
            );
            drop(Object::take(conn));
        }
        result
    }
}

impl OutboxStore for PgOutboxStore {
    type Error = Error;
    type Claim = PgClaim;

    async fn claim(&self, limit: usize) -> Result<Option<PgClaim>> {
        Ok(match self.claim_as(None, limit).await? {
            Claimed::Batch(claim) => Some(claim),
            _ => None,
        })
    }

    /// The relay's pause is read in the claim's one statement (a
    /// primary-key probe of `outbox_relays` whose answer sets the `LIMIT`
    /// of the scans that pick rows: 0 when paused), so a claim that starts
    /// after an operator's pause committed claims nothing, at no round trip
    /// more. Its cost, measured as a claim runs (the generic plan of the
    /// prepared statement, `EXPLAIN (ANALYZE, BUFFERS)`, a claim of 100 with
    /// a window of 400, medians of 3 × 30 runs interleaved with the
    /// statement without the probe, PostgreSQL 15) on 100,000 rows (95,000
    /// sent, 5,000 pending over 1,000 aggregates): 2 shared buffers more
    /// (the probe) and 0.02–0.05 ms of server time more: ordered 218 → 220
    /// buffers, 0.81 → 0.86 ms; with 100 dead heads 213 → 215, 0.85 → 0.89
    /// ms (the probing variant 1,411 → 1,413, 1.31 → 1.35 ms); unordered
    /// 205 → 207, 0.20 → 0.22 ms. A paused relay's claim touches 2 buffers
    /// (0.06–0.12 ms).
    async fn claim_for(&self, relay: &str, limit: usize) -> Result<Claimed<PgClaim>> {
        self.claim_as(Some(relay), limit).await
    }

    async fn stats(&self) -> Result<OutboxStats> {
        let mut conn = self.conn().await?;
        let result = diesel::sql_query(&self.sql.stats)
            .prepared(self.prepare)
            .get_result(&mut *conn)
            .await;
        let row: StatsRow = self.checked(conn, result)?;
        let ordered =
            order_from_db(&self.schema, &row.delivery_order)? == DeliveryOrder::PerAggregate;
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
        let mut conn = self.conn().await?;
        let result = diesel::sql_query(&self.sql.purge)
            .bind::<Timestamptz, _>(before)
            .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
            .execute(&mut *conn)
            .await;
        let deleted = self.checked(conn, result)?;
        Ok(deleted as u64)
    }

    async fn replay_dead(&self, selector: DeadSelector) -> Result<u64> {
        // The table's trigger releases, in the same statement, the events
        // the replayed ones held back.
        let mut conn = self.conn().await?;
        let result = match selector {
            DeadSelector::Id(id) => {
                diesel::sql_query(&self.sql.replay_id)
                    .bind::<diesel::sql_types::Uuid, _>(id)
                    .execute(&mut *conn)
                    .await
            }
            DeadSelector::Aggregate {
                aggregate_type,
                aggregate_id,
            } => {
                diesel::sql_query(&self.sql.replay_aggregate)
                    .bind::<Text, _>(aggregate_type)
                    .bind::<Text, _>(aggregate_id)
                    .execute(&mut *conn)
                    .await
            }
            _ => {
                diesel::sql_query(&self.sql.replay_all)
                    .execute(&mut *conn)
                    .await
            }
        };
        let replayed = self.checked(conn, result)?;
        Ok(replayed as u64)
    }

    async fn skip_dead(&self, id: Uuid) -> Result<bool> {
        let mut conn = self.conn().await?;
        let result = diesel::sql_query(&self.sql.skip)
            .bind::<diesel::sql_types::Uuid, _>(id)
            .execute(&mut *conn)
            .await;
        let skipped = self.checked(conn, result)?;
        Ok(skipped == 1)
    }

    /// Releases held events that nothing holds back any more (those of
    /// aggregates where no `retry` or `dead` event precedes the first held
    /// one, at one index probe per aggregate with held events): a repair
    /// for what a relay of an earlier version or a manual edit may leave
    /// behind; every held event in unordered mode.
    async fn maintain(&self) -> Result<()> {
        let mut conn = self.conn().await?;
        let order = self.cached_order(&mut conn).await?;
        let sql = if order == DeliveryOrder::Unordered {
            &self.sql.release_unordered
        } else {
            &self.sql.release_orphans
        };
        let result = diesel::sql_query(sql).execute(&mut *conn).await;
        let released = self.checked(conn, result)?;
        if released > 0 {
            tracing::warn!(
                released,
                schema = self.schema.name(),
                "outbox: released held events that nothing held back any more"
            );
        }
        Ok(())
    }

    async fn register_relay(&self, relay: &RelayRegistration) -> Result<()> {
        // A relay that registers again under its name keeps its pause.
        let mut conn = self.conn().await?;
        let result = diesel::sql_query(&self.shared.relays.register)
            .bind::<Text, _>(&relay.name)
            .bind::<Text, _>(&relay.host)
            .bind::<Integer, _>(i32::try_from(relay.pid).unwrap_or(i32::MAX))
            .bind::<Text, _>(&relay.version)
            .bind::<Timestamptz, _>(relay.started_at)
            .bind::<BigInt, _>(
                i64::try_from(relay.heartbeat_interval.as_millis()).unwrap_or(i64::MAX),
            )
            .execute(&mut *conn)
            .await;
        self.checked(conn, result)?;
        *self.relay.lock().unwrap_or_else(|p| p.into_inner()) = Some(relay.clone());
        Ok(())
    }

    async fn heartbeat(&self, name: &str, in_flight: u32) -> Result<RelayControl> {
        let mut conn = self.conn().await?;
        let result = diesel::sql_query(&self.shared.relays.heartbeat)
            .bind::<Text, _>(name)
            .bind::<Integer, _>(i32::try_from(in_flight).unwrap_or(i32::MAX))
            .load(&mut *conn)
            .await;
        let paused: Vec<row::PausedRow> = self.checked(conn, result)?;
        match <[row::PausedRow]>::first(&paused) {
            Some(row) => Ok(RelayControl::new(row.paused)),
            // Removed meanwhile (by the janitor as stale, or by hand):
            // register again.
            None => {
                let registration = self.relay.lock().unwrap_or_else(|p| p.into_inner()).clone();
                if let Some(registration) = registration.filter(|r| r.name == name) {
                    self.register_relay(&registration).await?;
                }
                Ok(RelayControl::default())
            }
        }
    }

    async fn deregister_relay(&self, name: &str) -> Result<()> {
        let mut conn = self.conn().await?;
        let result = diesel::sql_query(&self.shared.relays.deregister)
            .bind::<Text, _>(name)
            .execute(&mut *conn)
            .await;
        self.checked(conn, result)?;
        Ok(())
    }

    fn wakeups(&self) -> impl Stream<Item = ()> + Send + 'static {
        match &self.listen_url {
            Some(url) => {
                listen::wakeups(url.clone(), Arc::clone(&self.shared), self.liveness).left_stream()
            }
            None => futures_util::stream::pending().right_stream(),
        }
    }
}
