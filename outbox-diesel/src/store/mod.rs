//! [`PgOutboxStore`]: the relay's [`OutboxStore`] on PostgreSQL.
//!
//! # Claim design
//! A claim is **one short transaction that holds row locks** while the relay
//! publishes: `BEGIN` → pick and lock up to `batch_size` rows with
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
//! held; locks the first `batch_size`
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
//! - **Held** by [`mark_failed`](Claim::mark_failed) for the window's
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

mod admin;
mod listen;
mod plan;
mod row;
mod sql;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text, Timestamptz};
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::{
    AnsiTransactionManager, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection,
    TransactionManager,
};

use crate::PgTransaction;
use outbox_core::admin::normalize_error;
use outbox_core::{
    Claim, Claimed, DeadSelector, DeliveryOrder, EventStatus, FailedAttempt, NextStep,
    OutboxRecord, OutboxStats, OutboxStore, RelayControl, RelayHandle, RelayRegistration,
};
use uuid::Uuid;

use crate::prepared::PreparedExt;
use crate::schema::{KNOWN_VERSION, REQUIRED_VERSION, Schema};
use crate::{Error, Result};
use row::{EventRow, ManyRow, OrderRow, StatsRow, UnorderedRow, VersionRow, WindowRow};
use sql::Sql;

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
    sql: Arc<Sql>,
    listen_url: Option<String>,
    claim_timeout: Duration,
    claim_window: usize,
    /// The table's delivery order, re-read at most once a second.
    order_cache: Arc<std::sync::Mutex<Option<(DeliveryOrder, Instant)>>>,
    /// Whether many events are `retry` or `dead` (which ordered claim to
    /// run), re-read at most every [`BLOCKING_CACHE_TTL`].
    blocking_cache: Arc<std::sync::Mutex<Option<(bool, Instant)>>>,
    /// The outbox's schema version was found to be one this store reads.
    version_ok: Arc<std::sync::atomic::AtomicBool>,
    /// The relay registered through this store (its name goes into the
    /// attempt history of what its claims mark failed).
    relay: Arc<std::sync::Mutex<Option<RelayRegistration>>>,
}

/// How long a claim trusts its count of blocking events.
const BLOCKING_CACHE_TTL: Duration = Duration::from_secs(5);

/// Above this many `retry` and `dead` events, an ordered claim probes every
/// row of its window instead of first hashing the aggregates that have
/// such events: a probe costs 2–3 index pages per row (about 1,000 for a
/// window of 400), a hashed set about one page per 120 aggregates plus its
/// hashing, which costs as much as the probes at about 2,000–5,000 rows
/// (measured: 261 buffers at 5,000 dead rows, 443 at 20,000, 721 at 45,000,
/// against 1,400–2,200 for the probing claim).
const MANY_BLOCKING: i64 = 4_000;

/// How long a claim trusts the delivery order it read last.
const ORDER_CACHE_TTL: Duration = Duration::from_secs(1);

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

/// Settings of a [`PgOutboxStore`].
///
/// | setting | default |
/// |---|---|
/// | [`schema`](Self::schema) | `public` |
/// | [`listen`](Self::listen) | off (polling and in-process wakeups only) |
/// | [`claim_timeout`](Self::claim_timeout) | 60 s |
/// | [`claim_window`](Self::claim_window) | 4 (× batch size) |
/// | [`keep_sent`](Self::keep_sent) | yes |
#[must_use]
pub struct PgOutboxStoreBuilder {
    pool: Pool<AsyncPgConnection>,
    schema: String,
    listen_url: Option<String>,
    claim_timeout: Duration,
    claim_window: usize,
    keep_sent: bool,
    prepare: bool,
}

impl std::fmt::Debug for PgOutboxStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOutboxStoreBuilder")
            .field("schema", &self.schema)
            .field(
                "listen_url",
                &self.listen_url.as_deref().map(crate::error::redact_url),
            )
            .field("claim_timeout", &self.claim_timeout)
            .field("claim_window", &self.claim_window)
            .finish_non_exhaustive()
    }
}

impl PgOutboxStoreBuilder {
    /// The schema holding `outbox_events` (default `public`).
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Wakes the relay on `NOTIFY` through a `LISTEN` on a **direct**
    /// connection to `url` (not through PgBouncer in transaction pooling,
    /// where `LISTEN` does not work). After that connection drops and
    /// returns, the relay rescans the whole backlog, since notifications sent
    /// meanwhile are lost.
    pub fn listen(mut self, url: impl Into<String>) -> Self {
        self.listen_url = Some(url.into());
        self
    }

    /// How long a claimed batch may stay in flight before PostgreSQL ends
    /// the claiming session and releases its rows (its
    /// `idle_in_transaction_session_timeout`). A claim is valid for 80 % of
    /// it ([`Claim::valid_until`]): the relay publishes nothing of a batch
    /// after that, and passes it to the publisher, whose confirm wait is the
    /// shorter of its confirm timeout and the time left. Default 60 s.
    pub fn claim_timeout(mut self, timeout: Duration) -> Self {
        self.claim_timeout = timeout;
        self
    }

    /// How many rows, as a multiple of the batch size, an ordered claim looks
    /// at to find claimable aggregates. The window must hold the rows other
    /// claims have in flight plus a batch: raise it when more than two relay
    /// loops share one outbox (a relay runs two by default). Default 4: a
    /// larger window costs every claim a candidate probe per extra row
    /// (measured: 10 was slower than 2–4 in the W2 drain).
    pub fn claim_window(mut self, factor: usize) -> Self {
        self.claim_window = factor;
        self
    }

    /// Whether published events stay in `outbox_events` as `sent` (default,
    /// for audit and replay; remove them with `purge_sent`) or are deleted
    /// as they are confirmed. Deleting writes no new row version and no
    /// index entries per event, which measurably raises relay throughput
    /// (see the crate docs); it also means `purge_sent` has nothing to do.
    pub fn keep_sent(mut self, keep: bool) -> Self {
        self.keep_sent = keep;
        self
    }

    /// Whether the store's statements (claim, mark, stats) stay prepared on
    /// each connection (default on: one round trip per statement instead of
    /// two, which is about a third of a claim's latency; see the crate docs).
    /// Turn it off behind PgBouncer in transaction pooling mode older than
    /// 1.21 (or without `max_prepared_statements`).
    pub fn prepared_statements(mut self, on: bool) -> Self {
        self.prepare = on;
        self
    }

    /// Validates the settings.
    ///
    /// # Errors
    /// [`Error::Config`] for an invalid schema name, a claim timeout under
    /// one second, or a claim window of 0.
    pub fn build(self) -> Result<PgOutboxStore> {
        let schema = Schema::new(&self.schema)?;
        if self.claim_timeout < Duration::from_secs(1) {
            return Err(Error::Config("claim_timeout must be at least 1 s".into()));
        }
        if self.claim_window == 0 {
            return Err(Error::Config("claim_window must be at least 1".into()));
        }
        Ok(PgOutboxStore {
            pool: self.pool,
            sql: Arc::new(Sql::new(&schema, self.keep_sent, self.prepare)),
            schema,
            listen_url: self.listen_url,
            claim_timeout: self.claim_timeout,
            claim_window: self.claim_window,
            order_cache: Arc::default(),
            blocking_cache: Arc::default(),
            version_ok: Arc::default(),
            relay: Arc::default(),
        })
    }
}

fn order_from_db(value: &str) -> DeliveryOrder {
    match value {
        "unordered" => DeliveryOrder::Unordered,
        _ => DeliveryOrder::PerAggregate,
    }
}

/// How a claim's transaction starts. A claim runs the same prepared
/// statement every time, on a table whose statistics may describe a very
/// different backlog (a drained one after a burst, or the reverse); with
/// them PostgreSQL may keep planning it afresh for every execution (measured:
/// 0.3–0.8 ms of planning per claim after a 20,000-event backlog was
/// analyzed, against 0.01 ms) though its generic plan, index scans bounded by
/// the window, is as good or better (execution 0.67 vs 1.1–1.3 ms for a
/// 100-row claim). `SET LOCAL` ends with the transaction.
/// `work_mem` is raised for the same reason: a generic plan built on
/// statistics that count many more `retry`/`dead` rows than exist would
/// otherwise not hash the ordered claim's set of blocked aggregates and
/// rescan it for every window row (measured: 2.7 s per claim); the hash
/// only ever holds the few thousand rows the store lets that claim run
/// with.
const CLAIM_BEGIN: &str =
    "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL work_mem = '64MB'";

impl PgOutboxStore {
    /// Starts configuring a store on `pool`.
    pub fn builder(pool: Pool<AsyncPgConnection>) -> PgOutboxStoreBuilder {
        PgOutboxStoreBuilder {
            pool,
            schema: "public".into(),
            listen_url: None,
            claim_timeout: Duration::from_secs(60),
            claim_window: 4,
            keep_sent: true,
            prepare: true,
        }
    }

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

    async fn conn(&self) -> Result<Object<AsyncPgConnection>> {
        self.pool
            .get()
            .await
            .map_err(|e| Error::Pool(e.to_string()))
    }

    /// The delivery order every relay on this outbox obeys.
    ///
    /// # Errors
    /// [`Error::Database`] or [`Error::Pool`].
    pub async fn delivery_order(&self) -> Result<DeliveryOrder> {
        let mut conn = self.conn().await?;
        let row: OrderRow = diesel::sql_query(&self.sql.get_order)
            .prepared(self.sql.prepare)
            .get_result(&mut *conn)
            .await?;
        Ok(order_from_db(&row.delivery_order))
    }

    /// Changes the delivery order of this outbox (for every relay on it).
    ///
    /// # Errors
    /// [`Error::Database`] or [`Error::Pool`].
    pub async fn set_delivery_order(&self, order: DeliveryOrder) -> Result<()> {
        let value = match order {
            DeliveryOrder::Unordered => "unordered",
            _ => "per_aggregate",
        };
        let mut conn = self.conn().await?;
        diesel::sql_query(&self.sql.set_order)
            .bind::<Text, _>(value)
            .execute(&mut *conn)
            .await?;
        if order == DeliveryOrder::Unordered {
            // Nothing waits behind another event any more.
            diesel::sql_query(&self.sql.release_unordered)
                .execute(&mut *conn)
                .await?;
        }
        *self
            .order_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        Ok(())
    }

    /// `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)` of the one statement a claim
    /// of `limit` events runs now (in the outbox's current delivery order),
    /// with the generic plan the relay's claims use, for diagnosing claim
    /// cost (as a claim of no relay: no relay's pause stops it). Runs in a transaction that is rolled back, so nothing stays
    /// claimed.
    ///
    /// # Errors
    /// [`Error::Database`] or [`Error::Pool`].
    pub async fn explain_claim(&self, limit: usize) -> Result<serde_json::Value> {
        #[derive(diesel::QueryableByName)]
        struct Plan {
            #[diesel(sql_type = diesel::sql_types::Json)]
            #[diesel(column_name = "QUERY PLAN")]
            plan: serde_json::Value,
        }
        let limit_i64 = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut pooled = self.conn().await?;
        let conn = &mut *pooled;
        // As a claim runs it: a generic plan of the prepared statement.
        AnsiTransactionManager::begin_transaction_sql(conn, CLAIM_BEGIN).await?;
        let result: Result<serde_json::Value> = async {
            let order = order_from_db(
                &diesel::sql_query(&self.sql.get_order)
                    .prepared(self.sql.prepare)
                    .get_result::<OrderRow>(conn)
                    .await?
                    .delivery_order,
            );
            let (sql, types, args) = if order == DeliveryOrder::Unordered {
                (
                    self.sql.claim_unordered.as_str(),
                    "int8, text, text",
                    format!("{limit_i64}, '60000', NULL"),
                )
            } else {
                let window = limit_i64.saturating_mul(self.claim_window as i64);
                (
                    self.ordered_claim(conn).await?,
                    "int8, int8, text, text",
                    format!("{window}, {limit_i64}, '60000', NULL"),
                )
            };
            // A session-level name: deallocated below whatever happens.
            conn.batch_execute(&format!("PREPARE outbox_explain_claim ({types}) AS {sql}"))
                .await?;
            let plan = diesel::sql_query(format!(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE outbox_explain_claim ({args})"
            ))
            .get_result::<Plan>(conn)
            .await;
            let deallocated = conn.batch_execute("DEALLOCATE outbox_explain_claim").await;
            let plan = plan?;
            deallocated?;
            Ok(plan.plan)
        }
        .await;
        let rolled_back = AnsiTransactionManager::rollback_transaction(conn).await;
        if result.is_err() || rolled_back.is_err() {
            // The session may still hold the named statement (or be inside
            // the transaction): close it rather than pool it.
            drop(Object::take(pooled));
        }
        rolled_back?;
        result
    }

    /// The delivery order, from a cache refreshed at most once a second (a
    /// change by [`set_delivery_order`](Self::set_delivery_order) reaches
    /// every relay within that second).
    async fn cached_order(&self, conn: &mut AsyncPgConnection) -> Result<DeliveryOrder> {
        let cached = *self
            .order_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((order, read_at)) = cached
            && read_at.elapsed() < ORDER_CACHE_TTL
        {
            return Ok(order);
        }
        let row: OrderRow = diesel::sql_query(&self.sql.get_order)
            .prepared(self.sql.prepare)
            .get_result(conn)
            .await?;
        let order = order_from_db(&row.delivery_order);
        *self
            .order_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((order, Instant::now()));
        Ok(order)
    }

    /// The ordered claim statement for the number of blocking events now.
    async fn ordered_claim(&self, conn: &mut AsyncPgConnection) -> Result<&str> {
        let cached = *self
            .blocking_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let many = match cached {
            Some((many, read_at)) if read_at.elapsed() < BLOCKING_CACHE_TTL => many,
            _ => {
                let row: ManyRow = diesel::sql_query(&self.sql.many_blocking)
                    .bind::<BigInt, _>(MANY_BLOCKING)
                    .prepared(self.sql.prepare)
                    .get_result(conn)
                    .await?;
                *self
                    .blocking_cache
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some((row.many, Instant::now()));
                row.many
            }
        };
        Ok(if many {
            &self.sql.claim_ordered_probing
        } else {
            &self.sql.claim_ordered
        })
    }

    /// Refuses an outbox whose schema this version cannot work on: one not
    /// migrated far enough, or one a newer version migrated past what it
    /// knows. Checked once per store.
    async fn check_version(&self, conn: &mut AsyncPgConnection) -> Result<()> {
        use std::sync::atomic::Ordering;
        if std::sync::atomic::AtomicBool::load(&self.version_ok, Ordering::Relaxed) {
            return Ok(());
        }
        let found = diesel::sql_query(&self.sql.schema_version)
            .get_result::<VersionRow>(conn)
            .await?
            .version;
        if !(REQUIRED_VERSION..=KNOWN_VERSION).contains(&found) {
            return Err(Error::SchemaVersion {
                schema: self.schema.name().to_owned(),
                found,
                min: REQUIRED_VERSION,
                max: KNOWN_VERSION,
            });
        }
        self.version_ok.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// A claim for the relay named `relay` (or for no relay: a pause
    /// counts for nothing).
    async fn claim_as(&self, relay: Option<&str>, limit: usize) -> Result<Claimed<PgClaim>> {
        // Dropping the transaction (an error below, or the relay dropping
        // the claim) closes its connection, which makes PostgreSQL roll back.
        let mut tx = PgTransaction::begin_with(&self.pool, CLAIM_BEGIN).await?;
        let ClaimedRows {
            order,
            paused,
            records,
            window,
        } = self.claim_rows(&mut tx, limit, relay).await?;
        if records.is_empty() {
            // Committed, not rolled back: the claim may have held rows
            // behind blocked events or marked malformed ones dead.
            tx.commit().await?;
            return Ok(if paused {
                Claimed::Paused
            } else {
                Claimed::Empty
            });
        }
        Ok(Claimed::Batch(PgClaim {
            tx: Some(tx),
            seq_of: records.iter().map(|r| (r.id(), r.seq)).collect(),
            records,
            window,
            order,
            sql: Arc::clone(&self.sql),
            valid_until: Instant::now() + self.claim_timeout.mul_f64(0.8),
            relay: relay.map(str::to_owned).or_else(|| self.relay_name()),
        }))
    }

    /// Picks and locks rows inside the transaction open on `conn`, for the
    /// relay named `relay` (nothing when an operator paused it), or for no
    /// relay.
    async fn claim_rows(
        &self,
        conn: &mut AsyncPgConnection,
        limit: usize,
        relay: Option<&str>,
    ) -> Result<ClaimedRows> {
        self.check_version(conn).await?;
        // The claim's first statement also sets the session's
        // idle_in_transaction_session_timeout for this transaction only.
        let timeout_ms = self.claim_timeout.as_millis().to_string();
        let order = self.cached_order(conn).await?;
        let limit_i64 = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut claimed = ClaimedRows {
            order,
            paused: false,
            records: Vec::new(),
            window: Vec::new(),
        };
        let rows: Vec<EventRow> = match order {
            DeliveryOrder::Unordered => {
                let rows: Vec<UnorderedRow> = diesel::sql_query(&self.sql.claim_unordered)
                    .bind::<BigInt, _>(limit_i64)
                    .bind::<Text, _>(&timeout_ms)
                    .bind::<Nullable<Text>, _>(relay)
                    .prepared(self.sql.prepare)
                    .load(conn)
                    .await?;
                claimed.paused = rows.iter().any(|row| row.paused);
                rows.into_iter().filter_map(|row| row.locked).collect()
            }
            _ => {
                let window_size = limit_i64.saturating_mul(self.claim_window as i64);
                let sql = self.ordered_claim(conn).await?;
                let window: Vec<WindowRow> = diesel::sql_query(sql)
                    .bind::<BigInt, _>(window_size)
                    .bind::<BigInt, _>(limit_i64)
                    .bind::<Text, _>(&timeout_ms)
                    .bind::<Nullable<Text>, _>(relay)
                    .prepared(self.sql.prepare)
                    .load(conn)
                    .await?;
                claimed.paused = window.iter().any(|row| row.paused);
                let mut locked = Vec::new();
                for row in window.into_iter().filter_map(|row| row.slot) {
                    claimed.window.push(WindowSlot {
                        seq: row.window_seq,
                        aggregate: (row.window_aggregate_type, row.window_aggregate_id),
                        blocked: row.blocked,
                    });
                    locked.push(row.locked);
                }
                plan::keep_runs(
                    claimed
                        .window
                        .iter()
                        .zip(locked)
                        .map(|(slot, locked)| plan::WindowEntry {
                            aggregate: (&slot.aggregate.0, &slot.aggregate.1),
                            blocked: slot.blocked,
                            locked,
                        }),
                    limit,
                )
            }
        };
        // A row another writer stored unreadable ends dead with the reason;
        // in ordered mode it also ends its aggregate's run (it is the
        // aggregate's head now), and the rest flow.
        // Aggregates cut by a malformed row: almost always none, so the
        // common path allocates nothing for it.
        let mut cut: Vec<(String, String)> = Vec::new();
        for row in rows {
            if cut
                .iter()
                .any(|(t, i)| row.aggregate_type() == t && row.aggregate_id() == i)
            {
                continue;
            }
            match row.into_record() {
                Ok(record) => claimed.records.push(record),
                Err(Error::MalformedRow { seq, reason }) => {
                    tracing::error!(seq, %reason, "outbox: malformed row; marking it dead");
                    diesel::sql_query(&self.sql.kill_malformed)
                        .bind::<BigInt, _>(seq)
                        .bind::<Text, _>(
                            format!("malformed row: {reason}").replace('\0', "\u{FFFD}"),
                        )
                        .bind::<Nullable<Text>, _>(self.relay_name())
                        .bind::<Text, _>(normalize_error(&format!("malformed row: {reason}")))
                        .prepared(self.sql.prepare)
                        .execute(&mut *conn)
                        .await?;
                    // Ordered: its aggregate, from the window, is cut.
                    if let Some(slot) = claimed.window.iter().find(|slot| slot.seq == seq) {
                        let followers = followers(&claimed.window, seq, &slot.aggregate);
                        hold(&self.sql, conn, followers).await?;
                        cut.push(slot.aggregate.clone());
                    }
                }
                Err(other) => return Err(other),
            }
        }
        Ok(claimed)
    }
}

/// What a claim read: the rows it keeps, and its window (for holding the
/// followers of events that fail).
struct ClaimedRows {
    order: DeliveryOrder,
    /// An operator paused the claiming relay: nothing was read or locked.
    paused: bool,
    records: Vec<OutboxRecord>,
    window: Vec<WindowSlot>,
}

/// One row of an ordered claim's window.
#[derive(Debug)]
struct WindowSlot {
    seq: i64,
    aggregate: (String, String),
    blocked: bool,
}

/// The rows of `window` that follow `seq` in its aggregate.
fn followers(window: &[WindowSlot], seq: i64, aggregate: &(String, String)) -> Vec<i64> {
    window
        .iter()
        .filter(|slot| slot.seq > seq && slot.aggregate == *aggregate)
        .map(|slot| slot.seq)
        .collect()
}

/// Marks `seqs` held, those still pending and not locked by another claim
/// (a claim holds those when it next sees them), in `conn`'s transaction
/// and after the event that holds them back became `retry` or `dead` in it.
async fn hold(sql: &Sql, conn: &mut AsyncPgConnection, seqs: Vec<i64>) -> Result<()> {
    if !seqs.is_empty() {
        diesel::sql_query(&sql.hold)
            .bind::<Array<BigInt>, _>(seqs)
            .prepared(sql.prepare)
            .execute(conn)
            .await?;
    }
    Ok(())
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
        let row: StatsRow = diesel::sql_query(&self.sql.stats)
            .prepared(self.sql.prepare)
            .get_result(&mut *conn)
            .await?;
        let ordered = order_from_db(&row.delivery_order) == DeliveryOrder::PerAggregate;
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
        let deleted = diesel::sql_query(&self.sql.purge)
            .bind::<Timestamptz, _>(before)
            .bind::<BigInt, _>(i64::try_from(limit).unwrap_or(i64::MAX))
            .execute(&mut *conn)
            .await?;
        Ok(deleted as u64)
    }

    async fn replay_dead(&self, selector: DeadSelector) -> Result<u64> {
        // The table's trigger releases, in the same statement, the events
        // the replayed ones held back.
        let mut conn = self.conn().await?;
        let replayed = match selector {
            DeadSelector::Id(id) => {
                diesel::sql_query(&self.sql.replay_id)
                    .bind::<diesel::sql_types::Uuid, _>(id)
                    .execute(&mut *conn)
                    .await?
            }
            DeadSelector::Aggregate {
                aggregate_type,
                aggregate_id,
            } => {
                diesel::sql_query(&self.sql.replay_aggregate)
                    .bind::<Text, _>(aggregate_type)
                    .bind::<Text, _>(aggregate_id)
                    .execute(&mut *conn)
                    .await?
            }
            _ => {
                diesel::sql_query(&self.sql.replay_all)
                    .execute(&mut *conn)
                    .await?
            }
        };
        Ok(replayed as u64)
    }

    async fn skip_dead(&self, id: Uuid) -> Result<bool> {
        let mut conn = self.conn().await?;
        let skipped = diesel::sql_query(&self.sql.skip)
            .bind::<diesel::sql_types::Uuid, _>(id)
            .execute(&mut *conn)
            .await?;
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
        let released = diesel::sql_query(sql).execute(&mut *conn).await?;
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
        let r = self.schema.table("outbox_relays");
        // A relay that registers again under its name keeps its pause.
        diesel::sql_query(format!(
            "INSERT INTO {r} (name, host, pid, version, started_at, heartbeat_at, \
               heartbeat_interval_ms) VALUES ($1, $2, $3, $4, $5, now(), $6) \
             ON CONFLICT (name) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid, \
               version = EXCLUDED.version, started_at = EXCLUDED.started_at, \
               heartbeat_at = now(), heartbeat_interval_ms = EXCLUDED.heartbeat_interval_ms, \
               in_flight = 0"
        ))
        .bind::<Text, _>(&relay.name)
        .bind::<Text, _>(&relay.host)
        .bind::<Integer, _>(i32::try_from(relay.pid).unwrap_or(i32::MAX))
        .bind::<Text, _>(&relay.version)
        .bind::<Timestamptz, _>(relay.started_at)
        .bind::<BigInt, _>(i64::try_from(relay.heartbeat_interval.as_millis()).unwrap_or(i64::MAX))
        .execute(&mut *self.conn().await?)
        .await?;
        *self.relay.lock().unwrap_or_else(|p| p.into_inner()) = Some(relay.clone());
        Ok(())
    }

    async fn heartbeat(&self, name: &str, in_flight: u32) -> Result<RelayControl> {
        let r = self.schema.table("outbox_relays");
        let paused: Vec<row::PausedRow> = diesel::sql_query(format!(
            "UPDATE {r} SET heartbeat_at = now(), in_flight = $2 WHERE name = $1 RETURNING paused"
        ))
        .bind::<Text, _>(name)
        .bind::<Integer, _>(i32::try_from(in_flight).unwrap_or(i32::MAX))
        .load(&mut *self.conn().await?)
        .await?;
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
        let r = self.schema.table("outbox_relays");
        diesel::sql_query(format!("DELETE FROM {r} WHERE name = $1 AND NOT paused"))
            .bind::<Text, _>(name)
            .execute(&mut *self.conn().await?)
            .await?;
        Ok(())
    }

    async fn wakeups(&self, relay: RelayHandle) {
        match &self.listen_url {
            Some(url) => listen::run(url, &self.schema, &relay).await,
            None => std::future::pending().await,
        }
    }
}

/// A batch held by one relay: an open transaction with the rows locked.
///
/// Dropped without [`finish`](Claim::finish), its [`PgTransaction`] closes
/// its connection rather than returning it to the pool, so PostgreSQL rolls
/// back and the rows are claimable again at once.
pub struct PgClaim {
    tx: Option<PgTransaction>,
    records: Vec<OutboxRecord>,
    /// The ordered claim's window (empty when unordered).
    window: Vec<WindowSlot>,
    seq_of: HashMap<Uuid, i64>,
    order: DeliveryOrder,
    sql: Arc<Sql>,
    valid_until: Instant,
    /// The relay whose attempts this claim records.
    relay: Option<String>,
}

impl std::fmt::Debug for PgClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgClaim")
            .field("records", &self.records.len())
            .field("order", &self.order)
            .field("open", &self.tx.is_some())
            .finish_non_exhaustive()
    }
}

impl PgClaim {
    fn connection(&mut self) -> Result<&mut AsyncPgConnection> {
        self.tx
            .as_deref_mut()
            .ok_or_else(|| Error::Config("claim already finished".into()))
    }

    fn seqs(&self, ids: impl Iterator<Item = Uuid>) -> Result<Vec<i64>> {
        ids.map(|id| {
            self.seq_of
                .get(&id)
                .copied()
                .ok_or_else(|| Error::Config(format!("event {id} is not part of this claim")))
        })
        .collect()
    }
}

impl Claim for PgClaim {
    type Error = Error;

    fn records(&self) -> &[OutboxRecord] {
        &self.records
    }

    fn delivery_order(&self) -> DeliveryOrder {
        self.order
    }

    fn valid_until(&self) -> Option<Instant> {
        Some(self.valid_until)
    }

    async fn mark_sent(&mut self, ids: &[Uuid]) -> Result<()> {
        // Events held behind a sent retry are released by the table's
        // trigger, in this transaction (see the module docs).
        let seqs = self.seqs(ids.iter().copied())?;
        let sql = Arc::clone(&self.sql);
        diesel::sql_query(&sql.mark_sent)
            .bind::<Array<BigInt>, _>(seqs)
            .prepared(sql.prepare)
            .execute(self.connection()?)
            .await?;
        Ok(())
    }

    async fn mark_suspect(&mut self, ids: &[Uuid], reason: &str) -> Result<()> {
        let seqs = self.seqs(ids.iter().copied())?;
        let sql = Arc::clone(&self.sql);
        diesel::sql_query(&sql.mark_suspect)
            .bind::<Array<BigInt>, _>(seqs)
            // PostgreSQL text cannot hold NUL.
            .bind::<Text, _>(reason.replace('\0', "\u{FFFD}"))
            .bind::<Nullable<Text>, _>(self.relay.clone())
            .bind::<Text, _>(normalize_error(reason).replace('\0', "\u{FFFD}"))
            .prepared(sql.prepare)
            .execute(self.connection()?)
            .await?;
        Ok(())
    }

    async fn mark_failed(&mut self, failures: &[FailedAttempt]) -> Result<()> {
        let seqs = self.seqs(failures.iter().map(|f| f.id))?;
        let mut statuses = Vec::with_capacity(failures.len());
        let mut attempts = Vec::with_capacity(failures.len());
        let mut next_at: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(failures.len());
        let mut errors = Vec::with_capacity(failures.len());
        let mut groups = Vec::with_capacity(failures.len());
        let unroutable: Vec<Option<DateTime<Utc>>> =
            failures.iter().map(|f| f.unroutable_since).collect();
        for failure in failures {
            let (status, at) = match failure.next {
                NextStep::RetryAt(at) => (EventStatus::Retry, Some(at)),
                NextStep::Dead => (EventStatus::Dead, None),
            };
            statuses.push(status.as_str());
            attempts.push(i32::try_from(failure.attempts).unwrap_or(i32::MAX));
            next_at.push(at);
            // PostgreSQL text cannot hold NUL.
            let error = failure.error.replace('\0', "\u{FFFD}");
            groups.push(normalize_error(&error));
            errors.push(error);
        }
        // In ordered mode the events of the window that follow a failed one
        // in its aggregate are held behind it (later ones are held by the
        // claims that see them).
        let mut held = Vec::new();
        if self.order != DeliveryOrder::Unordered {
            for &seq in &seqs {
                if let Some(slot) = self.window.iter().find(|slot| slot.seq == seq) {
                    held.extend(followers(&self.window, seq, &slot.aggregate));
                }
            }
            held.sort_unstable();
            held.dedup();
        }
        let sql = Arc::clone(&self.sql);
        let relay = self.relay.clone();
        let conn = self.connection()?;
        diesel::sql_query(&sql.mark_failed)
            .bind::<Array<BigInt>, _>(seqs)
            .bind::<Array<Text>, _>(statuses)
            .bind::<Array<Integer>, _>(attempts)
            .bind::<Array<Nullable<Timestamptz>>, _>(next_at)
            .bind::<Array<Text>, _>(errors)
            .bind::<Array<Nullable<Timestamptz>>, _>(unroutable)
            .bind::<Nullable<Text>, _>(relay)
            .bind::<Array<Text>, _>(groups)
            .prepared(sql.prepare)
            .execute(&mut *conn)
            .await?;
        hold(&sql, conn, held).await?;
        Ok(())
    }

    async fn finish(mut self) -> Result<()> {
        match self.tx.take() {
            Some(tx) => tx.commit().await,
            None => Ok(()),
        }
    }
}
