//! W1–W3 on MariaDB (`outbox::mysql`) and SQLite (`outbox::sqlite`), each
//! figure next to the same back end's ceiling measured in the same run, as
//! PostgreSQL's are (the PostgreSQL workloads live in `record`, `drain`,
//! `latency` and `claim`).
//!
//! - MariaDB: a database of the run's own (`bench_run_<pid>_<n>`) on the
//!   server of `MYSQL_URL`, dropped at the end (also when the run fails).
//! - SQLite: a file of the run's own under the workspace's `target/`,
//!   deleted at the end with its `-wal` and `-shm`.
//!
//! The ceilings are written the way a careful hand-written version would
//! be, with statements kept prepared: plain `BEGIN` (SQLite: `BEGIN
//! IMMEDIATE`, its only safe way to write) and `COMMIT`. The library's
//! variants begin and commit as the library's docs ask
//! (`begin_top_level`/`commit_top_level`: MariaDB adds a savepoint that
//! detects a deadlock's rollback; SQLite's is the same `BEGIN IMMEDIATE`),
//! so the ratios include what that costs. Neither back end has `NOTIFY`:
//! the relay learns of new events from in-process wakeups or polling, so
//! the NOTIFY rows say "polling". W4 (EXPLAIN's shared buffers) is
//! PostgreSQL's only.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Datetime, Integer, Nullable, Text};
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use outbox::mysql::{MysqlOutbox, MysqlSettings};
use outbox::rabbitmq::{LapinPublisher, wire};
use outbox::sqlite::{AsyncSqliteConnection, SqliteOutbox, SqliteSettings};
use outbox::{DeliveryOrder, DomainEvent, EventEnvelope, Relay, RelayHandle};
use outbox_testkit::mysql::TestMysqlDatabase;
use outbox_testkit::names;
use serde_json::json;
use uuid::Uuid;

use crate::cpu;
use crate::drain::{self, Drain};
use crate::latency::{self, Latency, Mode};
use crate::setup::{self, BoxError, Bus, OrderPlaced, Prepared, now_ns};
use crate::{Params, W1_SLICES};

/// A back end the bench runs on (`--backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    /// `outbox::postgres` (the default).
    Postgres,
    /// `outbox::mysql` on MariaDB.
    Mysql,
    /// `outbox::sqlite` on a file.
    Sqlite,
}

impl Backend {
    /// The back ends `--backend` names (`postgres`, `mysql`, `sqlite`,
    /// `all`: the three one after another; default `postgres`).
    pub(crate) fn from_args() -> Result<Vec<Backend>, BoxError> {
        let arg = std::env::args()
            .skip_while(|a| a != "--backend")
            .nth(1)
            .map(|s| s.to_lowercase());
        Ok(match arg.as_deref() {
            None | Some("postgres" | "postgresql" | "pg") => vec![Backend::Postgres],
            Some("mysql" | "mariadb") => vec![Backend::Mysql],
            Some("sqlite") => vec![Backend::Sqlite],
            Some("all") => vec![Backend::Postgres, Backend::Mysql, Backend::Sqlite],
            Some(other) => {
                return Err(
                    format!("--backend {other}: expected postgres, mysql, sqlite or all").into(),
                );
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "PostgreSQL",
            Backend::Mysql => "MariaDB",
            Backend::Sqlite => "SQLite",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::Mysql => "mysql",
            Backend::Sqlite => "sqlite",
        }
    }
}

/// The run's database: where it lives and the relays' pool.
enum Db {
    Mysql {
        /// Dropped (with the database) at the end of the run.
        database: TestMysqlDatabase,
        pool: Pool<AsyncMysqlConnection>,
    },
    Sqlite {
        path: PathBuf,
        pool: Pool<AsyncSqliteConnection>,
    },
}

/// The run's database, exchange and queue on one back end.
struct Rig {
    backend: Backend,
    db: Db,
    bus: Bus,
}

/// A direct connection with its back end's recorder.
enum Conn {
    Mysql(AsyncMysqlConnection, MysqlOutbox),
    Sqlite(AsyncSqliteConnection, SqliteOutbox),
}

const ORDERS_SQL_MYSQL: &str =
    "INSERT INTO bench_orders (id, customer_id, total_cents) VALUES (?, ?, ?)";
const ORDERS_SQL_SQLITE: &str =
    "INSERT INTO bench_orders (id, customer_id, total_cents) VALUES (?1, ?2, ?3)";
const HAND_SQL_MYSQL: &str = "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, \
     aggregate_version, event_type, schema_version, payload, headers, occurred_at) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)";
const HAND_SQL_SQLITE: &str = "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, \
     aggregate_version, event_type, schema_version, payload, headers, occurred_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";

#[derive(diesel::QueryableByName)]
struct Id {
    #[diesel(sql_type = Text)]
    id: String,
}

impl Conn {
    async fn exec(&mut self, sql: &str) -> Result<(), BoxError> {
        match self {
            Conn::Mysql(c, _) => c.batch_execute(sql).await?,
            Conn::Sqlite(c, _) => c.batch_execute(sql).await?,
        }
        Ok(())
    }

    /// Begins a transaction: the library's way (`begin_top_level`) or a
    /// plain one (`BEGIN`; SQLite `BEGIN IMMEDIATE`).
    async fn begin(&mut self, library: bool) -> Result<(), BoxError> {
        match (self, library) {
            (Conn::Mysql(c, _), true) => outbox::mysql::begin_top_level(c).await?,
            (Conn::Sqlite(c, _), true) => outbox::sqlite::begin_top_level(c).await?,
            (Conn::Mysql(c, _), false) => c.batch_execute("BEGIN").await?,
            (Conn::Sqlite(c, _), false) => c.batch_execute("BEGIN IMMEDIATE").await?,
        }
        Ok(())
    }

    /// Commits what [`begin`](Self::begin) began, the same way.
    async fn commit(&mut self, library: bool) -> Result<(), BoxError> {
        match (self, library) {
            (Conn::Mysql(c, _), true) => outbox::mysql::commit_top_level(c).await?,
            (Conn::Sqlite(c, _), true) => outbox::sqlite::commit_top_level(c).await?,
            (Conn::Mysql(c, _), false) => c.batch_execute("COMMIT").await?,
            (Conn::Sqlite(c, _), false) => c.batch_execute("COMMIT").await?,
        }
        Ok(())
    }

    /// The business insert: one `bench_orders` row.
    async fn insert_order(&mut self, order: &OrderPlaced) -> Result<(), BoxError> {
        let customer = order.customer_id.to_string();
        match self {
            Conn::Mysql(c, _) => {
                Prepared(
                    diesel::sql_query(ORDERS_SQL_MYSQL)
                        .bind::<Text, _>(order.order_id.as_str())
                        .bind::<Text, _>(customer.as_str())
                        .bind::<BigInt, _>(order.total_cents),
                )
                .execute(c)
                .await?
            }
            Conn::Sqlite(c, _) => {
                Prepared(
                    diesel::sql_query(ORDERS_SQL_SQLITE)
                        .bind::<Text, _>(order.order_id.as_str())
                        .bind::<Text, _>(customer.as_str())
                        .bind::<BigInt, _>(order.total_cents),
                )
                .execute(c)
                .await?
            }
        };
        Ok(())
    }

    /// The outbox row of `order`, hand-written: one `INSERT … VALUES`.
    async fn insert_hand(&mut self, order: &OrderPlaced) -> Result<(), BoxError> {
        let id = Uuid::now_v7().to_string();
        let payload = serde_json::to_string(order)?;
        let now = chrono::Utc::now();
        match self {
            Conn::Mysql(c, _) => {
                Prepared(
                    diesel::sql_query(HAND_SQL_MYSQL)
                        .bind::<Text, _>(id.as_str())
                        .bind::<Text, _>(order.aggregate_type())
                        .bind::<Text, _>(order.aggregate_id())
                        .bind::<Nullable<BigInt>, _>(None::<i64>)
                        .bind::<Text, _>(order.event_type())
                        .bind::<Integer, _>(1)
                        .bind::<Text, _>(payload.as_str())
                        .bind::<Text, _>("{}")
                        .bind::<Datetime, _>(now.naive_utc()),
                )
                .execute(c)
                .await?
            }
            Conn::Sqlite(c, _) => {
                Prepared(
                    diesel::sql_query(HAND_SQL_SQLITE)
                        .bind::<Text, _>(id.as_str())
                        .bind::<Text, _>(order.aggregate_type())
                        .bind::<Text, _>(order.aggregate_id())
                        .bind::<Nullable<BigInt>, _>(None::<i64>)
                        .bind::<Text, _>(order.event_type())
                        .bind::<Integer, _>(1)
                        .bind::<Text, _>(payload.as_str())
                        .bind::<Text, _>("{}")
                        .bind::<BigInt, _>(now.timestamp_micros()),
                )
                .execute(c)
                .await?
            }
        };
        Ok(())
    }

    /// `record` (one event) or `record_all` (several) in the open
    /// transaction.
    async fn record(&mut self, events: &[OrderPlaced]) -> Result<(), BoxError> {
        match (self, events) {
            (Conn::Mysql(c, o), [one]) => {
                o.record(c, one).await?;
            }
            (Conn::Sqlite(c, o), [one]) => {
                o.record(c, one).await?;
            }
            (Conn::Mysql(c, o), _) => {
                o.record_all(c, events).await?;
            }
            (Conn::Sqlite(c, o), _) => {
                o.record_all(c, events).await?;
            }
        }
        Ok(())
    }

    async fn record_envelope(&mut self, envelope: &EventEnvelope) -> Result<(), BoxError> {
        let envelopes = std::slice::from_ref(envelope);
        match self {
            Conn::Mysql(c, o) => o.record_envelopes(c, envelopes).await?,
            Conn::Sqlite(c, o) => o.record_envelopes(c, envelopes).await?,
        }
        Ok(())
    }

    /// The ids in the outbox.
    async fn ids(&mut self) -> Result<HashSet<Uuid>, BoxError> {
        let sql = "SELECT id FROM outbox_events";
        let rows: Vec<Id> = match self {
            Conn::Mysql(c, _) => diesel::sql_query(sql).load(c).await?,
            Conn::Sqlite(c, _) => diesel::sql_query(sql).load(c).await?,
        };
        Ok(rows
            .iter()
            .filter_map(|r| Uuid::parse_str(&r.id).ok())
            .collect())
    }

    /// One W1 transaction of `variant`.
    async fn one_transaction(&mut self, variant: Variant) -> Result<(), BoxError> {
        let order = OrderPlaced {
            order_id: Uuid::now_v7().to_string(),
            customer_id: Uuid::now_v7(),
            total_cents: 1250,
        };
        let library = variant == Variant::Library;
        self.begin(library).await?;
        self.insert_order(&order).await?;
        match variant {
            Variant::OrderOnly => {}
            Variant::HandSql => self.insert_hand(&order).await?,
            Variant::Library => self.record(std::slice::from_ref(&order)).await?,
        }
        self.commit(library).await
    }
}

impl Rig {
    async fn new(backend: Backend) -> Result<Rig, BoxError> {
        let name = names::unique("bench", "run");
        let db = match backend {
            Backend::Mysql => {
                let database =
                    TestMysqlDatabase::create(&outbox_testkit::urls::mysql_url(), &name).await;
                outbox::mysql::migrate_url(database.url()).await?;
                let pool = outbox::mysql::pool(database.url(), 12)?;
                Db::Mysql { database, pool }
            }
            Backend::Postgres => {
                return Err("PostgreSQL runs on setup::Env, not on a Rig".into());
            }
            Backend::Sqlite => {
                let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("..")
                    .join("target")
                    .join(format!("{name}.db"));
                let url = path.to_string_lossy().into_owned();
                outbox::sqlite::migrate_url(&url).await?;
                let pool = outbox::sqlite::pool(&url, 12)?;
                Db::Sqlite { path, pool }
            }
        };
        let rig = Rig {
            backend,
            db,
            bus: Bus::new(&name).await,
        };
        let orders = match backend {
            Backend::Mysql => {
                "CREATE TABLE bench_orders (
                     id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
                     customer_id CHAR(36) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
                     total_cents BIGINT NOT NULL,
                     created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB"
            }
            _ => {
                "CREATE TABLE bench_orders (
                     id TEXT NOT NULL PRIMARY KEY, customer_id TEXT NOT NULL,
                     total_cents INTEGER NOT NULL,
                     created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)"
            }
        };
        rig.conn().await?.exec(orders).await?;
        Ok(rig)
    }

    async fn conn(&self) -> Result<Conn, BoxError> {
        Ok(match &self.db {
            Db::Mysql { database, .. } => Conn::Mysql(
                outbox::mysql::connect(database.url()).await?,
                MysqlSettings::default().outbox(),
            ),
            Db::Sqlite { path, .. } => Conn::Sqlite(
                outbox::sqlite::connect(&path.to_string_lossy()).await?,
                SqliteSettings::default().outbox(),
            ),
        })
    }

    /// Empties the outbox, the orders and the queue between runs.
    async fn reset(&self) -> Result<(), BoxError> {
        let mut conn = self.conn().await?;
        conn.exec("DELETE FROM outbox_events").await?;
        conn.exec("DELETE FROM bench_orders").await?;
        self.bus.purge().await
    }

    /// Records `events` in committed transactions of 1,000.
    async fn backlog(&self, events: &[OrderPlaced]) -> Result<(), BoxError> {
        let mut conn = self.conn().await?;
        for chunk in events.chunks(1000) {
            conn.begin(true).await?;
            conn.record(chunk).await?;
            conn.commit(true).await?;
        }
        conn.exec(match self.backend {
            Backend::Mysql => "ANALYZE TABLE outbox_events",
            _ => "ANALYZE",
        })
        .await?;
        Ok(())
    }

    /// Starts a relay on the run's outbox: `order` set first if given,
    /// `batch` and `poll` the builder's defaults if `None`.
    async fn start_relay(
        &self,
        publisher: LapinPublisher,
        keep_sent: bool,
        batch: Option<usize>,
        poll: Option<Duration>,
    ) -> Result<(RelayHandle, tokio::task::JoinHandle<()>), BoxError> {
        Ok(match &self.db {
            Db::Mysql { pool, .. } => {
                let store = MysqlSettings::default()
                    .store(pool.clone())
                    .keep_sent(keep_sent);
                let mut builder = Relay::builder(store, publisher);
                if let Some(batch) = batch {
                    builder = builder.batch_size(batch);
                }
                if let Some(poll) = poll {
                    builder = builder.poll_interval(poll);
                }
                let relay = builder.build()?;
                (relay.handle(), tokio::spawn(relay.run()))
            }
            Db::Sqlite { pool, .. } => {
                let store = SqliteSettings::default()
                    .store(pool.clone())
                    .keep_sent(keep_sent);
                let mut builder = Relay::builder(store, publisher);
                if let Some(batch) = batch {
                    builder = builder.batch_size(batch);
                }
                if let Some(poll) = poll {
                    builder = builder.poll_interval(poll);
                }
                let relay = builder.build()?;
                (relay.handle(), tokio::spawn(relay.run()))
            }
        })
    }

    async fn set_delivery_order(&self, order: DeliveryOrder) -> Result<(), BoxError> {
        match &self.db {
            Db::Mysql { pool, .. } => {
                MysqlSettings::default()
                    .store(pool.clone())
                    .set_delivery_order(order)
                    .await?
            }
            Db::Sqlite { pool, .. } => {
                SqliteSettings::default()
                    .store(pool.clone())
                    .set_delivery_order(order)
                    .await?
            }
        }
        Ok(())
    }

    /// A connected publisher to the run's exchange.
    async fn publisher(&self, name: &str) -> Result<LapinPublisher, BoxError> {
        self.publisher_to(&self.bus, name).await
    }

    /// A connected publisher to `bus`'s exchange.
    async fn publisher_to(&self, bus: &Bus, name: &str) -> Result<LapinPublisher, BoxError> {
        let publisher = LapinPublisher::builder(setup::amqp_url())
            .exchange(&bus.exchange)
            .declare_exchange(false)
            .connection_name(format!("{}.{name}", self.bus.queue))
            .build()?;
        publisher.connect().await?;
        Ok(publisher)
    }

    /// Removes the database (MariaDB: drops it; SQLite: deletes the file).
    async fn cleanup(self) {
        let Rig { db, bus, .. } = self;
        match db {
            Db::Mysql { database, pool } => {
                drop(pool);
                // Dropping the guard kills the sessions still using the
                // database and drops it.
                let _ = tokio::task::spawn_blocking(move || drop(database)).await;
            }
            Db::Sqlite { path, pool } => {
                drop(pool);
                for suffix in ["", "-wal", "-shm"] {
                    let mut file = path.clone().into_os_string();
                    file.push(suffix);
                    let _ = std::fs::remove_file(file);
                }
            }
        }
        drop(bus);
    }
}

/// What each W1 transaction does besides inserting the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    /// Nothing: the business transaction alone (the ceiling).
    OrderOnly,
    /// The same outbox row, hand-written SQL (one INSERT … VALUES).
    HandSql,
    /// The back end's `record`.
    Library,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::OrderOnly => "order only (ceiling)",
            Variant::HandSql => "order + hand-written outbox INSERT",
            Variant::Library => "order + outbox::record",
        }
    }
}

/// Transactions per second of each variant, interleaved as PostgreSQL's
/// (`record::run_interleaved`).
async fn w1_interleaved(
    rig: &Rig,
    variants: &[Variant],
    writers: usize,
    duration: Duration,
    slices: u32,
) -> Result<Vec<f64>, BoxError> {
    let (active_tx, active_rx) = tokio::sync::watch::channel(usize::MAX);
    let stop = Arc::new(AtomicBool::new(false));
    let done: Arc<Vec<AtomicU64>> = Arc::new(variants.iter().map(|_| AtomicU64::new(0)).collect());
    let mut tasks = Vec::new();
    for (index, &variant) in variants.iter().enumerate() {
        for _ in 0..writers {
            let mut conn = rig.conn().await?;
            let (stop, done, mut active) =
                (Arc::clone(&stop), Arc::clone(&done), active_rx.clone());
            tasks.push(tokio::spawn(async move {
                while !AtomicBool::load(&stop, Ordering::Relaxed) {
                    if *active.borrow_and_update() != index {
                        if active.changed().await.is_err() {
                            break;
                        }
                        continue;
                    }
                    conn.one_transaction(variant).await?;
                    done[index].fetch_add(1, Ordering::Relaxed);
                }
                Ok::<(), BoxError>(())
            }));
        }
    }
    let slice = duration / slices.max(1);
    let mut counted = vec![0u64; variants.len()];
    let mut elapsed = vec![Duration::ZERO; variants.len()];
    for round in 0..=slices {
        for index in 0..variants.len() {
            let _ = active_tx.send(index);
            tokio::time::sleep(Duration::from_millis(30)).await;
            let before = AtomicU64::load(&done[index], Ordering::Relaxed);
            let started = Instant::now();
            tokio::time::sleep(if round == 0 { slice / 3 } else { slice }).await;
            if round > 0 {
                counted[index] += AtomicU64::load(&done[index], Ordering::Relaxed) - before;
                elapsed[index] += started.elapsed();
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = active_tx.send(usize::MAX);
    drop(active_tx);
    for task in tasks {
        task.await??;
    }
    rig.reset().await?;
    Ok(counted
        .iter()
        .zip(&elapsed)
        .map(|(&n, t)| n as f64 / t.as_secs_f64())
        .collect())
}

/// Rows per second recording 100 events per transaction with `record_all`.
async fn w1_record_all(rig: &Rig, writers: usize, duration: Duration) -> Result<f64, BoxError> {
    let stop = Arc::new(AtomicBool::new(false));
    let rows = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..writers {
        let mut conn = rig.conn().await?;
        let (stop, rows) = (Arc::clone(&stop), Arc::clone(&rows));
        tasks.push(tokio::spawn(async move {
            let events = setup::interleaved(10, 10);
            while !AtomicBool::load(&stop, Ordering::Relaxed) {
                conn.begin(true).await?;
                conn.record(&events).await?;
                conn.commit(true).await?;
                rows.fetch_add(100, Ordering::Relaxed);
            }
            Ok::<(), BoxError>(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let start_rows = AtomicU64::load(&rows, Ordering::Relaxed);
    let started = Instant::now();
    tokio::time::sleep(duration).await;
    let count = AtomicU64::load(&rows, Ordering::Relaxed) - start_rows;
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await??;
    }
    rig.reset().await?;
    Ok(count as f64 / elapsed.as_secs_f64())
}

/// The median of 200 one-row autocommit `INSERT`s, in milliseconds.
async fn commit_ms(rig: &Rig) -> Result<f64, BoxError> {
    let sql = match rig.backend {
        Backend::Mysql => {
            "INSERT INTO bench_orders (id, customer_id, total_cents) VALUES (UUID(), UUID(), 1)"
        }
        _ => {
            "INSERT INTO bench_orders (id, customer_id, total_cents) \
             VALUES (lower(hex(randomblob(16))), lower(hex(randomblob(16))), 1)"
        }
    };
    let conn = Arc::new(tokio::sync::Mutex::new(rig.conn().await?));
    let ms = setup::median_ms(200, || {
        let conn = Arc::clone(&conn);
        async move { conn.lock().await.exec(sql).await }
    })
    .await?;
    rig.reset().await?;
    Ok(ms)
}

impl drain::Relays for Rig {
    fn bus(&self) -> &Bus {
        &self.bus
    }

    fn cpu_db(&self) -> cpu::Db {
        match self.backend {
            Backend::Mysql => cpu::Db::Mariadb,
            _ => cpu::Db::InProcess,
        }
    }

    async fn drain(
        &self,
        bus: &Bus,
        events: &[OrderPlaced],
        order: DeliveryOrder,
        relays: usize,
        batch_size: usize,
        keep_sent: bool,
    ) -> Result<Drain, BoxError> {
        w2_relay(self, bus, events, order, relays, batch_size, keep_sent).await
    }
}

/// The relay draining `events` into `bus` (as PostgreSQL's `drain::relay`).
async fn w2_relay(
    rig: &Rig,
    bus: &Bus,
    events: &[OrderPlaced],
    order: DeliveryOrder,
    relays: usize,
    batch_size: usize,
    keep_sent: bool,
) -> Result<Drain, BoxError> {
    rig.reset().await?;
    bus.purge().await?;
    rig.backlog(events).await?;
    let expected = rig.conn().await?.ids().await?;
    let mut rx = bus.consume().await?;
    rig.set_delivery_order(order).await?;
    let mut publishers = Vec::new();
    for n in 0..relays {
        publishers.push(rig.publisher_to(bus, &format!("relay{n}")).await?);
    }
    let meter = cpu::Meter::start(&drain::Relays::cpu_db(rig)).await?;
    let started = Instant::now();
    let mut running = Vec::new();
    for publisher in publishers {
        running.push(
            rig.start_relay(
                publisher,
                keep_sent,
                Some(batch_size),
                Some(Duration::from_millis(100)),
            )
            .await?,
        );
    }
    let mut drain = drain::receive_all(&mut rx, expected, started).await;
    drain.cpu = meter.stop().await?;
    for (handle, _) in &running {
        handle.shutdown();
    }
    for (_, task) in running {
        task.await?;
    }
    Ok(drain)
}

/// W3's producer: one transaction per tick, of the mode `mode_at` gives;
/// the stamp is taken just before `COMMIT`.
async fn w3_produce(
    rig: &Rig,
    relay: Option<&RelayHandle>,
    rate: u32,
    duration: Duration,
    mode_at: impl Fn(Duration) -> Mode,
) -> Result<HashMap<Uuid, (i64, Mode)>, BoxError> {
    let mut conn = rig.conn().await?;
    let inline = rig.bus.amqp().create_channel().await?;
    inline
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let mut ticker = tokio::time::interval(Duration::from_secs(1) / rate);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = tokio::time::Instant::now();
    let mut stamps = HashMap::new();
    while started.elapsed() < duration {
        ticker.tick().await;
        let mode = mode_at(started.elapsed());
        let e = OrderPlaced {
            order_id: Uuid::now_v7().to_string(),
            customer_id: Uuid::now_v7(),
            total_cents: 990,
        };
        let envelope = EventEnvelope::from_event(&e)?;
        let library = mode == Mode::Outbox;
        conn.begin(library).await?;
        match mode {
            Mode::Outbox => conn.record_envelope(&envelope).await?,
            Mode::Floor => conn.insert_order(&e).await?,
        }
        let stamp = now_ns();
        conn.commit(library).await?;
        match mode {
            Mode::Outbox => {
                if let Some(relay) = relay {
                    relay.notify();
                }
            }
            Mode::Floor => {
                inline
                    .basic_publish(
                        rig.bus.exchange.as_str().into(),
                        envelope.event_type.as_str().into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..Default::default()
                        },
                        envelope.payload.as_bytes(),
                        wire::properties(&envelope, "/bench"),
                    )
                    .await?
                    .await?;
            }
        }
        stamps.insert(envelope.id, (stamp, mode));
    }
    let _ = inline.close(200, "done".into()).await;
    Ok(stamps)
}

/// W3 on `rig`: with `in_process`, the floor and the in-process relay
/// interleaved second by second (`2 × duration` in all); without, the
/// polling relay alone. The latencies by mode.
async fn w3_run(
    rig: &Rig,
    in_process: bool,
    rate: u32,
    duration: Duration,
) -> Result<HashMap<Mode, Latency>, BoxError> {
    rig.reset().await?;
    let publisher = rig.publisher("latency").await?;
    let (handle, task) = rig.start_relay(publisher, true, None, None).await?;
    let mut rx = rig.bus.consume().await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stamps = if in_process {
        w3_produce(rig, Some(&handle), rate, duration * 2, |elapsed| {
            if elapsed.as_secs() % 2 == 0 {
                Mode::Floor
            } else {
                Mode::Outbox
            }
        })
        .await?
    } else {
        // Nobody wakes the relay: it polls.
        w3_produce(rig, None, rate, duration, |_| Mode::Outbox).await?
    };
    let latency = latency::measure(&mut rx, &stamps).await;
    let received: usize = latency.values().map(|l| l.n).sum();
    if received < stamps.len() {
        println!(
            "  ({} of {} messages not received within 10 s)",
            stamps.len() - received,
            stamps.len()
        );
    }
    handle.shutdown();
    task.await?;
    Ok(latency)
}

fn of(latency: &HashMap<Mode, Latency>, mode: Mode) -> Result<Latency, BoxError> {
    latency
        .get(&mode)
        .copied()
        .ok_or_else(|| format!("W3: no message of mode {mode:?} was received").into())
}

/// W1–W3 on `backend` (MariaDB or SQLite), printed as PostgreSQL's are;
/// the JSON report. The run's database is removed at the end, also when a
/// workload fails.
pub(crate) async fn run(
    backend: Backend,
    p: &Params,
    only: Option<&str>,
) -> Result<serde_json::Value, BoxError> {
    let rig = Rig::new(backend).await?;
    let result = workloads(&rig, p, only).await;
    rig.cleanup().await;
    result
}

async fn workloads(
    rig: &Rig,
    p: &Params,
    only: Option<&str>,
) -> Result<serde_json::Value, BoxError> {
    let run = |w: &str| only.is_none_or(|o| o.split(',').any(|x| x == w));
    let name = rig.backend.name();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let commit = commit_ms(rig).await?;
    let limits = match rig.backend {
        Backend::Mysql => "no NOTIFY: relays poll or are woken in-process",
        _ => "one writer at a time (BEGIN IMMEDIATE), synchronous = FULL; no NOTIFY",
    };
    println!(
        "outbox-bench: {cores} cores; {name} commit latency {commit:.2} ms (median of 200 one-row autocommit INSERTs); {limits}\n"
    );
    let polling = format!("polling (no NOTIFY on {name})");

    let mut w1 = serde_json::Map::new();
    if run("w1") {
        println!(
            "W1 record on {name}: transactions/s ({} s per cell, interleaved in {W1_SLICES} slices)",
            p.w1_secs
        );
        println!("  {:<42} {:>10} {:>10}", "", "1 writer", "8 writers");
        let duration = Duration::from_secs(p.w1_secs);
        let variants = [Variant::OrderOnly, Variant::HandSql, Variant::Library];
        let one = w1_interleaved(rig, &variants, 1, duration, W1_SLICES).await?;
        let eight = w1_interleaved(rig, &variants, 8, duration, W1_SLICES).await?;
        for (i, variant) in variants.into_iter().enumerate() {
            println!(
                "  {:<42} {:>10.0} {:>10.0}",
                variant.name(),
                one[i],
                eight[i]
            );
            w1.insert(
                format!("{variant:?}"),
                json!({"writers_1": one[i], "writers_8": eight[i]}),
            );
        }
        println!(
            "  {:<42} {:>21}",
            "order + outbox::record (NOTIFY on)", polling
        );
        let (base1, base8) = (one[0], eight[0]);
        let (hand1, hand8) = (one[1], eight[1]);
        let (lib1, lib8) = (one[2], eight[2]);
        println!(
            "  {:<42} {:>10.2} {:>10.2}   target >= 0.95",
            "library / hand-written SQL",
            lib1 / hand1,
            lib8 / hand8
        );
        println!(
            "  {:<42} {:>10.2} {:>10.2}",
            "with outbox row / order only",
            lib1 / base1,
            lib8 / base8
        );
        let all1 = w1_record_all(rig, 1, duration).await?;
        let all8 = w1_record_all(rig, 8, duration).await?;
        println!(
            "  {:<42} {:>10.0} {:>10.0}   rows/s",
            "record_all, 100 events per transaction", all1, all8
        );
        w1.insert(
            "ratio_library_vs_hand".into(),
            json!([lib1 / hand1, lib8 / hand8]),
        );
        w1.insert(
            "ratio_with_outbox_vs_order_only".into(),
            json!([lib1 / base1, lib8 / base8]),
        );
        w1.insert("record_all_rows_per_s".into(), json!([all1, all8]));
    }

    let mut w2 = serde_json::Map::new();
    if run("w2") {
        drain::w2(rig, Some(name), p.drain_events, p.hot, &mut w2).await?;
    }

    let mut w3 = serde_json::Map::new();
    if run("w3") {
        println!(
            "\nW3 latency on {name}: {} events/s for {} s each, milliseconds from just before COMMIT to receipt \
             (floor and in-process interleaved second by second)",
            p.w3_rate, p.w3_secs
        );
        println!(
            "  {:<42} {:>6} {:>8} {:>8} {:>8} {:>10}",
            "", "n", "p50", "p99", "max", "p99/floor"
        );
        let duration = Duration::from_secs(p.w3_secs);
        if rig.backend == Backend::Sqlite {
            // Write the WAL of W1 and W2 back first, as PostgreSQL's
            // CHECKPOINT does.
            if let Err(err) = rig
                .conn()
                .await?
                .exec("PRAGMA wal_checkpoint(TRUNCATE)")
                .await
            {
                println!("  (checkpoint before W3 failed: {err}; figures may include one)");
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let both = w3_run(rig, true, p.w3_rate, duration).await?;
        let floor = of(&both, Mode::Floor)?;
        let in_process = of(&both, Mode::Outbox)?;
        let lat_line = |label: &str, l: &Latency| {
            println!(
                "  {:<42} {:>6} {:>8.2} {:>8.2} {:>8.2} {:>10.2}",
                label,
                l.n,
                l.p50,
                l.p99,
                l.max,
                l.p99 / floor.p99
            );
        };
        lat_line("floor: commit, then publish inline", &floor);
        w3.insert(
            "floor".into(),
            json!({"p50": floor.p50, "p99": floor.p99, "max": floor.max}),
        );
        lat_line(latency::Wakeup::InProcess.name(), &in_process);
        w3.insert(
            "InProcess".into(),
            json!({"n": in_process.n, "p50": in_process.p50, "p99": in_process.p99, "max": in_process.max}),
        );
        println!("  {:<42} {:>44}", latency::Wakeup::Notify.name(), polling);
        w3.insert("Notify".into(), json!(null));
        let polled = of(
            &w3_run(rig, false, p.w3_rate, duration).await?,
            Mode::Outbox,
        )?;
        lat_line(latency::Wakeup::Polling.name(), &polled);
        w3.insert(
            "Polling".into(),
            json!({"n": polled.n, "p50": polled.p50, "p99": polled.p99, "max": polled.max}),
        );
        println!("  targets: in-process p99 <= 2x floor p99 (<= 5 ms); polling p99 <= 1000 ms");
    }

    if run("w4") {
        println!(
            "\nW4 claim scale: PostgreSQL only (it counts EXPLAIN's shared buffers); skipped on {name}"
        );
    }
    if run("w5") {
        println!("\nW5 consume: PostgreSQL only; skipped on {name}");
    }

    Ok(json!({
        "backend": rig.backend.key(),
        "cores": cores,
        "commit_ms": commit,
        "w1": w1,
        "w2": w2,
        "w3": w3,
        "w4": null,
    }))
}
