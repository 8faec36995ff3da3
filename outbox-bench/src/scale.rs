//! W6: a large backlog (1,000,000 events; 100,000 with `--quick`) drained
//! by the ordered relay as W2's headline runs it (1 relay, batch size 100
//! with the builder's default `max_batch_size`, so claims grow to 400 while
//! the backlog lasts; sent rows kept), against a 20,000-event drain
//! measured in the same run. The sampled `EXPLAIN` is of a claim of 100.
//!
//! What it watches as the drain goes, at every tenth of the backlog: the
//! rate over that tenth (counted by the consumer, as W2 counts), the outbox
//! table's dead tuples and autovacuum runs (`pg_stat_user_tables`), the size
//! of the claim's `outbox_events_pending` index, one
//! `EXPLAIN (ANALYZE, BUFFERS)` of the claim (buffers touched: the claim's
//! work, which machine noise does not move), and the bench process's
//! resident memory.
//!
//! Choices, and why:
//! - **Filled in SQL.** A million library calls would take minutes; one
//!   `INSERT … SELECT generate_series` writes the rows the recorder writes:
//!   the first event is recorded by the library and every other row copies
//!   its aggregate type, version, event type, schema version and headers,
//!   with the payload built as serde writes it (checked against the
//!   recorded one) and time-ordered UUID v7 ids (as the recorder's, so the
//!   `id` index grows at its right edge, not at random pages).
//! - **No `VACUUM`.** The table is analyzed after the fill (what
//!   autovacuum's analyze, at 2 % of the table, would do before long) and a
//!   `CHECKPOINT` writes the fill's pages out, so neither lands in the
//!   drain; from there only autovacuum, with the migrations' settings (at
//!   1 % of the table plus 1,000 dead tuples), cleans the table.
//! - **A PostgreSQL cluster of its own** ([`run_private`]): a shared
//!   server may run with autovacuum off (this project's CI machine does),
//!   and then the shipped settings do nothing and the figures are those of
//!   a table never vacuumed. So W6 starts a throwaway `initdb` cluster with
//!   `autovacuum = on` and `fsync = on` (otherwise `initdb`'s defaults);
//!   the broker is the shared one. `--w6-shared` runs it on the shared
//!   server instead. Either way the server's `autovacuum` setting is read
//!   (`SHOW autovacuum`) and printed, with a warning when it is off, and
//!   each tenth shows the table's autovacuum runs and when the last one
//!   was (`last_autovacuum`, seconds into the drain).
//! - **The consumer's memory is allocated before the drain.** The expected
//!   ids (a million `Uuid`s in a `HashSet`, about 40 MB) are loaded first,
//!   and each received id is removed from that set (a second set of seen ids
//!   would grow during the drain and be counted as the relay's). The peak
//!   resident size is reset (`/proc/self/clear_refs`, `5`) when the drain
//!   starts and at every tenth, so each tenth reports its own peak: flat if
//!   the relay's memory does not grow with the backlog.
//! - **The baseline** is the median of three 20,000-event drains filled and
//!   drained the same way, two before the large one and one after it, so
//!   drift over the few minutes of the run shows up in it.
//! - **Samples off the consumer's path.** The statistics query and the
//!   `EXPLAIN` of each tenth run in a task of their own: the consumer only
//!   stamps the time and reads `/proc`. The `EXPLAIN` runs the claim in a
//!   transaction that is rolled back; while it holds its rows the relay
//!   skips them (as it skips another relay's), for a few milliseconds.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, RunQueryDsl};
use outbox::postgres::PgOutboxStore;
use outbox::rabbitmq::LapinPublisher;
use outbox::{DeliveryOrder, Relay};
use serde_json::json;
use uuid::Uuid;

use crate::setup::{BoxError, Env, OrderPlaced};

/// Events of the baseline drain (W2's backlog).
pub(crate) const BASELINE_EVENTS: usize = 20_000;

/// Aggregates the events are spread over, interleaved as W2's (a0 b0 … a1
/// b1 …): W2's 2,000, so the baseline is W2's backlog and the large one
/// differs only in length.
const AGGREGATES: usize = 2_000;

/// The consumer gives up when no message came for this long (a stalled
/// relay), and reports the rest missing.
const STALL: Duration = Duration::from_secs(60);

/// The large drain stops here, and reports how far it got: a drain that
/// degrades (a claim that became 10 times dearer, say) would otherwise keep
/// the run going for an hour.
const BUDGET: Duration = Duration::from_secs(360);

/// The state at one point of a drain: `drained` events received.
#[derive(Debug, Clone, Default)]
pub(crate) struct Sample {
    pub(crate) drained: usize,
    /// From the relay's start to the consumer receiving the `drained`th event.
    pub(crate) at: Duration,
    /// `VmRSS` now, kB.
    pub(crate) rss_kb: u64,
    /// `VmHWM` since the previous sample (or the drain's start), kB.
    pub(crate) peak_kb: u64,
    pub(crate) db: Option<DbSample>,
}

/// What the database says at a sample.
#[derive(Debug, Clone, Default)]
pub(crate) struct DbSample {
    pub(crate) dead_tuples: i64,
    pub(crate) live_tuples: i64,
    pub(crate) autovacuums: i64,
    /// `last_autovacuum` of the outbox table, Unix seconds; `None` before
    /// the first.
    pub(crate) last_autovacuum: Option<f64>,
    pub(crate) heap_bytes: i64,
    pub(crate) pending_index_bytes: i64,
    /// Shared buffers the claim touched (hit + read), from its `EXPLAIN`.
    pub(crate) claim_buffers: f64,
    /// Of those, the ones of the scan of `outbox_events_pending`.
    pub(crate) pending_scan_buffers: f64,
    /// The claim's server-side execution time, ms.
    pub(crate) claim_ms: f64,
    /// Of which compiling it (JIT), ms; 0 when it was not compiled.
    pub(crate) jit_ms: f64,
    /// The claim's whole plan, as `EXPLAIN (FORMAT JSON)` gives it.
    pub(crate) plan: serde_json::Value,
}

/// One drain of `events` with its samples.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub(crate) events: usize,
    pub(crate) fill: Duration,
    /// `VmRSS` when the drain started (the expected ids loaded), kB.
    pub(crate) rss_start_kb: u64,
    /// When the relay started, Unix seconds (for `last_autovacuum`).
    pub(crate) started_unix: f64,
    /// The first sample is the drain's start (0 drained).
    pub(crate) samples: Vec<Sample>,
    pub(crate) missing: usize,
    /// Ids received twice, or not in the backlog.
    pub(crate) duplicates: usize,
    /// Whether the drain was stopped at [`BUDGET`] (the rest is then not
    /// counted as missing).
    pub(crate) over_budget: bool,
}

impl Run {
    /// Events per second over the whole drain.
    pub(crate) fn rate(&self) -> f64 {
        self.samples
            .last()
            .map_or(f64::NAN, |s| s.drained as f64 / s.at.as_secs_f64())
    }

    /// Events per second between the samples at `from` and `to` drained.
    pub(crate) fn rate_between(&self, from: usize, to: usize) -> f64 {
        let at = |n: usize| self.samples.iter().find(|s| s.drained == n).map(|s| s.at);
        match (at(from), at(to)) {
            (Some(a), Some(b)) if b > a => (to - from) as f64 / (b - a).as_secs_f64(),
            _ => f64::NAN,
        }
    }
}

/// W6's figures.
#[derive(Debug)]
pub(crate) struct Scale {
    /// Which PostgreSQL server the run used (see [`run_private`]).
    pub(crate) server: String,
    /// That server's commit (flush) latency, ms (see
    /// [`crate::claim::commit_ms`]).
    pub(crate) commit_ms: f64,
    /// The server's `autovacuum` setting.
    pub(crate) autovacuum: String,
    /// `jit` and `jit_above_cost` as the run's sessions see them.
    pub(crate) jit: (String, String),
    /// The three baseline drains' rates (two before, one after).
    pub(crate) baselines: Vec<f64>,
    /// Their median.
    pub(crate) baseline: f64,
    /// Peak resident size during the median baseline drain, kB.
    pub(crate) baseline_peak_kb: u64,
    pub(crate) large: Run,
}

/// Settings of W6's private cluster, given after `PrivatePostgres`'s own
/// (which turn `fsync` off): autovacuum on whatever the installation's
/// `postgresql.conf` says, and commits flushed as on the shared server and
/// in production. Everything else is `initdb`'s defaults (128 MB of shared
/// buffers, `max_wal_size` 1 GB, autovacuum's naptime of 1 min), as on the
/// shared server of this machine apart from its `autovacuum = off`.
const PRIVATE_SETTINGS: [(&str, &str); 2] = [("autovacuum", "on"), ("fsync", "on")];

/// Runs W6 on a PostgreSQL cluster of its own ([`PrivatePostgres`]:
/// `initdb`, its own port, removed at the end) with autovacuum on, so that
/// the migrations' per-table autovacuum settings act as they would in
/// production, whatever the shared server is set to. The broker is the
/// shared one.
///
/// [`PrivatePostgres`]: outbox_testkit::servers::PrivatePostgres
pub(crate) async fn run_private(events: usize) -> Result<Scale, BoxError> {
    let pg = tokio::task::spawn_blocking(|| {
        outbox_testkit::servers::PrivatePostgres::start_with_settings(&PRIVATE_SETTINGS)
    })
    .await
    .map_err(|e| format!("W6: cannot start a private PostgreSQL cluster: {e}"))?;
    let env = Env::at(pg.url()).await?;
    let server = format!(
        "a private cluster (initdb, port {}; {})",
        pg.port(),
        PRIVATE_SETTINGS
            .iter()
            .map(|(name, value)| format!("{name} = {value}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let result = run(&env, events, server).await;
    env.cleanup().await;
    // Stops the cluster and removes its directory.
    tokio::task::spawn_blocking(move || drop(pg)).await?;
    result
}

/// Runs W6 on `env`'s server, described as `server`: the baselines and the
/// drain of `events`.
pub(crate) async fn run(env: &Env, events: usize, server: String) -> Result<Scale, BoxError> {
    let commit_ms = crate::claim::commit_ms(env).await?;
    let autovacuum = show(env, "autovacuum").await?;
    let jit = (show(env, "jit").await?, show(env, "jit_above_cost").await?);
    let mut small = Vec::new();
    for _ in 0..2 {
        small.push(drain(env, BASELINE_EVENTS, BASELINE_EVENTS, false).await?);
    }
    let large = drain(env, events, (events / 10).max(1), true).await?;
    small.push(drain(env, BASELINE_EVENTS, BASELINE_EVENTS, false).await?);
    env.reset().await?;
    small.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
    let median = small.get(small.len() / 2);
    let mut baselines: Vec<f64> = small.iter().map(Run::rate).collect();
    baselines.sort_by(f64::total_cmp);
    if let Some(bad) = small.iter().find(|r| r.missing > 0 || r.duplicates > 0) {
        return Err(format!(
            "W6 baseline drain: {} missing, {} duplicated",
            bad.missing, bad.duplicates
        )
        .into());
    }
    Ok(Scale {
        server,
        commit_ms,
        autovacuum,
        jit,
        baseline: median.map_or(f64::NAN, Run::rate),
        baseline_peak_kb: median.map_or(0, |r| {
            r.samples
                .iter()
                .skip(1)
                .map(|s| s.peak_kb)
                .max()
                .unwrap_or(0)
        }),
        baselines,
        large,
    })
}

/// Fills the outbox with `events` events and drains them with the ordered
/// relay, sampling every `step` events received (the database too when
/// `sample_db`).
async fn drain(env: &Env, events: usize, step: usize, sample_db: bool) -> Result<Run, BoxError> {
    env.reset().await?;
    let filled = Instant::now();
    fill(env, events).await?;
    let fill = filled.elapsed();
    #[derive(diesel::QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::Uuid)]
        id: Uuid,
    }
    let mut expected: HashSet<Uuid> =
        diesel::sql_query(format!("SELECT id FROM {}", env.table("outbox_events")))
            .load::<Id>(&mut env.conn().await?)
            .await?
            .into_iter()
            .map(|r| r.id)
            .collect();
    let total = expected.len();
    let mut rx = env.consume().await?;
    let store = PgOutboxStore::builder(env.pool.clone())
        .schema(&env.schema)
        .keep_sent(true)
        .build()?;
    store
        .set_delivery_order(DeliveryOrder::PerAggregate)
        .await?;
    let publisher = LapinPublisher::builder(crate::setup::amqp_url())
        .exchange(&env.exchange)
        .declare_exchange(false)
        .connection_name(format!("{}.w6relay", env.schema))
        .build()?;
    publisher.connect().await?;
    let relay = Relay::builder(store.clone(), publisher)
        .batch_size(100)
        .poll_interval(Duration::from_millis(100))
        .build()?;
    let handle = relay.handle();

    let mut samplers: Vec<tokio::task::JoinHandle<Result<DbSample, BoxError>>> = Vec::new();
    let mut samples = Vec::new();
    let sample_at =
        |drained: usize,
         at: Duration,
         samplers: &mut Vec<tokio::task::JoinHandle<Result<DbSample, BoxError>>>| {
            let (rss_kb, peak_kb) = memory();
            if sample_db {
                let (env_pool, schema, store) =
                    (env.pool.clone(), env.schema.clone(), store.clone());
                samplers.push(tokio::spawn(async move {
                    db_sample(&env_pool, &schema, &store).await
                }));
            }
            Sample {
                drained,
                at,
                rss_kb,
                peak_kb,
                db: None,
            }
        };
    let rss_start_kb = memory().0;
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    samples.push(sample_at(0, Duration::ZERO, &mut samplers));
    reset_peak();
    let started = Instant::now();
    let task = tokio::spawn(relay.run());
    // The baselines have no budget: they are short, and their rate is the
    // yardstick.
    let deadline = if sample_db {
        tokio::time::Instant::now() + BUDGET
    } else {
        tokio::time::Instant::now() + Duration::from_secs(24 * 3600)
    };
    let (ended, mut duplicates) =
        crate::drain::receive(&mut rx, &mut expected, deadline, STALL, |received| {
            if received % step == 0 || received == total {
                let at = started.elapsed();
                samples.push(sample_at(received, at, &mut samplers));
                reset_peak();
            }
        })
        .await;
    let over_budget = ended == crate::drain::Received::Deadline;
    if over_budget {
        let received = total - expected.len();
        samples.push(sample_at(received, started.elapsed(), &mut samplers));
    } else {
        duplicates += crate::drain::late_duplicates(&mut rx).await;
    }
    handle.shutdown();
    task.await?;
    for (sample, sampler) in samples.iter_mut().zip(samplers) {
        sample.db = Some(sampler.await??);
    }
    Ok(Run {
        events: total,
        fill,
        rss_start_kb,
        started_unix,
        samples,
        missing: if over_budget { 0 } else { expected.len() },
        duplicates,
        over_budget,
    })
}

/// Writes `events` outbox rows as the recorder writes them: the first one
/// recorded by the library, the others copied from it in one
/// `INSERT … SELECT`, interleaved over [`AGGREGATES`] aggregates as
/// [`crate::setup::interleaved`] orders them. Then `ANALYZE` and a
/// `CHECKPOINT` (see the module docs).
async fn fill(env: &Env, events: usize) -> Result<(), BoxError> {
    let t = env.table("outbox_events");
    let customer = Uuid::now_v7();
    let first = OrderPlaced {
        order_id: "order-0".into(),
        customer_id: customer,
        total_cents: 0,
    };
    let outbox = outbox::postgres::Outbox::new(&env.schema)?.notify(false);
    let mut conn = env.conn().await?;
    conn.transaction::<_, outbox::postgres::Error, _>(async |conn| {
        outbox.record_all(conn, std::slice::from_ref(&first)).await
    })
    .await?;
    // serde's text of event `g`: `OrderPlaced`'s fields in declaration
    // order, no spaces.
    let payload = format!(
        "'{{\"order_id\":\"order-' || (g % {AGGREGATES}) || '\",\"customer_id\":\"{customer}\",\
         \"total_cents\":' || (g / {AGGREGATES}) || '}}'"
    );
    #[derive(diesel::QueryableByName)]
    struct Same {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        same: bool,
    }
    let same = diesel::sql_query(format!(
        "SELECT ({payload}) = (SELECT payload::text FROM {t}) AS same FROM (SELECT 0 AS g) s"
    ))
    .get_result::<Same>(&mut conn)
    .await?
    .same;
    if !same {
        return Err("W6 fill: the payload built in SQL differs from the recorder's".into());
    }
    // UUID v7: 48 bits of Unix milliseconds (from 1 ms after the recorded
    // event's, advancing every 4,096 rows), the version, 12 bits of counter,
    // the variant and 60 bits of a hash: unique and increasing with `g`.
    diesel::sql_query(format!(
        "INSERT INTO {t} (id, aggregate_type, aggregate_id, aggregate_version, event_type, \
           schema_version, payload, headers, occurred_at) \
         SELECT (lpad(to_hex(b.ms + g / 4096), 12, '0') || '7' || lpad(to_hex(g % 4096), 3, '0') \
                 || '8' || substr(md5(g::text), 1, 15))::uuid, \
           f.aggregate_type, 'order-' || (g % {AGGREGATES}), f.aggregate_version, f.event_type, \
           f.schema_version, ({payload})::json, f.headers, clock_timestamp() \
         FROM generate_series(1, {last}) g, (SELECT * FROM {t} LIMIT 1) f, \
           (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint + 1 AS ms) b",
        last = events.saturating_sub(1),
    ))
    .execute(&mut conn)
    .await?;
    diesel::sql_query(format!("ANALYZE {t}"))
        .execute(&mut conn)
        .await?;
    diesel::sql_query("CHECKPOINT").execute(&mut conn).await?;
    Ok(())
}

/// The outbox table's statistics and a claim's `EXPLAIN`, now.
async fn db_sample(
    pool: &diesel_async::pooled_connection::deadpool::Pool<diesel_async::AsyncPgConnection>,
    schema: &str,
    store: &PgOutboxStore,
) -> Result<DbSample, BoxError> {
    #[derive(diesel::QueryableByName)]
    struct Stats {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        dead: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        live: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        autovacuums: i64,
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Double>)]
        last_autovacuum: Option<f64>,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        heap: i64,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        pending: i64,
    }
    let stats = {
        let mut conn = pool.get().await?;
        diesel::sql_query(
            "SELECT n_dead_tup AS dead, n_live_tup AS live, autovacuum_count AS autovacuums, \
               extract(epoch FROM last_autovacuum)::float8 AS last_autovacuum, \
               pg_relation_size(relid) AS heap, \
               pg_relation_size(format('%I.%I', schemaname, 'outbox_events_pending')::regclass) \
                 AS pending \
             FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'outbox_events'",
        )
        .bind::<diesel::sql_types::Text, _>(schema)
        .get_result::<Stats>(&mut conn)
        .await?
    };
    let plan = store.explain_claim(100).await?;
    let top = &plan[0]["Plan"];
    Ok(DbSample {
        dead_tuples: stats.dead,
        live_tuples: stats.live,
        autovacuums: stats.autovacuums,
        last_autovacuum: stats.last_autovacuum,
        heap_bytes: stats.heap,
        pending_index_bytes: stats.pending,
        claim_buffers: buffers(top),
        pending_scan_buffers: index_buffers(top, "outbox_events_pending"),
        claim_ms: plan[0]["Execution Time"].as_f64().unwrap_or(f64::NAN),
        jit_ms: plan[0]["JIT"]["Timing"]["Total"].as_f64().unwrap_or(0.0),
        plan,
    })
}

/// Shared buffers (hit + read) of a plan node, its children included.
fn buffers(node: &serde_json::Value) -> f64 {
    node["Shared Hit Blocks"].as_f64().unwrap_or(0.0)
        + node["Shared Read Blocks"].as_f64().unwrap_or(0.0)
}

/// [`buffers`] of the scans of `index` in the plan under `node` (outermost
/// ones: a scan's buffers include its children's).
fn index_buffers(node: &serde_json::Value, index: &str) -> f64 {
    if node["Index Name"].as_str() == Some(index) {
        return buffers(node);
    }
    node["Plans"].as_array().map_or(0.0, |plans| {
        plans.iter().map(|p| index_buffers(p, index)).sum()
    })
}

/// A server setting.
async fn show(env: &Env, name: &str) -> Result<String, BoxError> {
    #[derive(diesel::QueryableByName)]
    struct Setting {
        #[diesel(sql_type = diesel::sql_types::Text)]
        setting: String,
    }
    Ok(diesel::sql_query("SELECT current_setting($1) AS setting")
        .bind::<diesel::sql_types::Text, _>(name)
        .get_result::<Setting>(&mut env.conn().await?)
        .await?
        .setting)
}

/// (`VmRSS`, `VmHWM`) of this process in kB; 0 where `/proc` has none.
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Resets `VmHWM` to the current resident size (Linux 4.0+). Best effort:
/// without it each sample's peak is the peak since the process started.
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// `n` events as `100k`, `1M`.
fn short(n: usize) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}M", n / 1_000_000)
    } else if n >= 1_000 && n.is_multiple_of(1_000) {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// Prints W6's table and returns its JSON.
pub(crate) fn report(s: &Scale) -> serde_json::Value {
    let r = &s.large;
    println!(
        "\nW6 scale: {} events ({AGGREGATES} aggregates, interleaved) drained by the ordered relay \
         (1 relay, batch 100 growing to 400, sent rows kept), no VACUUM; on {} (commit {:.2} ms): \
         autovacuum = {}, jit = {} (above cost {})",
        r.events, s.server, s.commit_ms, s.autovacuum, s.jit.0, s.jit.1
    );
    if s.autovacuum != "on" {
        println!(
            "  WARNING: autovacuum is off on this server: the migrations' autovacuum settings \
             cannot act, so these are the figures of a table never vacuumed"
        );
    }
    println!(
        "  baseline: {BASELINE_EVENTS} events at {:.0} events/s (median of {}: {}; two before, one after); \
         fill of {} events: {}",
        s.baseline,
        s.baselines.len(),
        s.baselines
            .iter()
            .map(|b| format!("{b:.0}"))
            .collect::<Vec<_>>()
            .join(", "),
        r.events,
        crate::setup::secs(r.fill)
    );
    println!(
        "  {:<12} {:>9} {:>6} {:>10} {:>6} {:>8} {:>8} {:>8} {:>9} {:>8} {:>7} {:>8} {:>8}",
        "drained",
        "events/s",
        "vs 20k",
        "dead tup",
        "autovac",
        "last av",
        "heap MB",
        "pend MB",
        "claim buf",
        "claim ms",
        "jit ms",
        "RSS MB",
        "peak MB"
    );
    let mut samples = Vec::new();
    let mut prev: Option<&Sample> = None;
    for sample in &r.samples {
        let rate = prev.map_or(f64::NAN, |p| r.rate_between(p.drained, sample.drained));
        let label = prev.map_or_else(
            || "start".to_string(),
            |p| format!("{}-{}", short(p.drained), short(sample.drained)),
        );
        let db = sample.db.clone().unwrap_or_default();
        // The last autovacuum of the table, seconds into the drain
        // (negative: before it started).
        let last_autovacuum = db.last_autovacuum.map(|t| t - r.started_unix);
        println!(
            "  {:<12} {:>9.0} {:>6.2} {:>10} {:>6} {:>8} {:>8.1} {:>8.1} {:>9.0} {:>8.2} {:>7.1} {:>8.1} {:>8.1}",
            label,
            rate,
            rate / s.baseline,
            db.dead_tuples,
            db.autovacuums,
            last_autovacuum.map_or_else(|| "-".to_string(), |t| format!("{t:.0} s")),
            db.heap_bytes as f64 / 1_048_576.0,
            db.pending_index_bytes as f64 / 1_048_576.0,
            db.claim_buffers,
            db.claim_ms,
            db.jit_ms,
            mb(sample.rss_kb),
            mb(sample.peak_kb),
        );
        samples.push(json!({
            "drained": sample.drained,
            "at_s": sample.at.as_secs_f64(),
            "per_s": rate,
            "ratio": rate / s.baseline,
            "dead_tuples": db.dead_tuples,
            "live_tuples": db.live_tuples,
            "autovacuums": db.autovacuums,
            "last_autovacuum_s": last_autovacuum,
            "heap_bytes": db.heap_bytes,
            "pending_index_bytes": db.pending_index_bytes,
            "claim_buffers": db.claim_buffers,
            "pending_scan_buffers": db.pending_scan_buffers,
            "claim_ms": db.claim_ms,
            "jit_ms": db.jit_ms,
            "rss_kb": sample.rss_kb,
            "peak_kb": sample.peak_kb,
        }));
        prev = Some(sample);
    }
    // The brief's windows: up to a tenth, a tenth to a half, a half to all.
    let bounds = [0, r.events / 10, r.events / 2, r.events];
    let mut windows = Vec::new();
    let mut line = Vec::new();
    for pair in bounds.windows(2) {
        let (from, to) = (pair[0], pair[1]);
        let rate = r.rate_between(from, to);
        line.push(format!(
            "{}-{} {:.0}/s ({:.2})",
            short(from),
            short(to),
            rate,
            rate / s.baseline
        ));
        windows.push(json!({"from": from, "to": to, "per_s": rate, "ratio": rate / s.baseline}));
    }
    println!(
        "  windows: {}; whole drain {:.0}/s ({:.2}); target >= 0.80 of the 20k rate throughout",
        line.join(", "),
        r.rate(),
        r.rate() / s.baseline
    );
    // The start sample's peak is the process's before the drain (loading
    // the expected ids): the drain's own peaks are those of the others.
    let peak = r
        .samples
        .iter()
        .skip(1)
        .map(|x| x.peak_kb)
        .max()
        .unwrap_or(0);
    if r.over_budget {
        let drained = r.samples.last().map_or(0, |x| x.drained);
        println!(
            "  STOPPED after {}: {drained} of {} events drained in the time budget",
            crate::setup::secs(BUDGET),
            r.events
        );
    }
    // The sampled claims' plans, for reading where the buffers go: too
    // long for the JSON line.
    let plans: Vec<_> = r
        .samples
        .iter()
        .map(|x| {
            json!({
                "drained": x.drained,
                "plan": x.db.as_ref().map(|d| &d.plan),
            })
        })
        .collect();
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("target")
        .join("outbox-bench-w6-plans.json");
    match serde_json::to_string_pretty(&plans).map(|text| std::fs::write(&path, text)) {
        Ok(Ok(())) => println!("  the sampled claims' plans: {}", path.display()),
        Ok(Err(err)) => println!(
            "  (could not write the claims' plans to {}: {err})",
            path.display()
        ),
        Err(err) => println!("  (could not write the claims' plans: {err})"),
    }
    println!(
        "  memory: {:.1} MB resident at the start (the {} expected ids loaded), peak {:.1} MB \
         during the drain (+{:.1} MB); the 20k drain peaked at {:.1} MB; missing {}, duplicates {}",
        mb(r.rss_start_kb),
        r.events,
        mb(peak),
        mb(peak.saturating_sub(r.rss_start_kb)),
        mb(s.baseline_peak_kb),
        r.missing,
        r.duplicates
    );
    json!({
        "events": r.events,
        "aggregates": AGGREGATES,
        "server": s.server,
        "commit_ms": s.commit_ms,
        "server_autovacuum": s.autovacuum,
        "jit": s.jit.0,
        "jit_above_cost": s.jit.1,
        "over_budget": r.over_budget,
        "baseline_events": BASELINE_EVENTS,
        "baseline_per_s": s.baseline,
        "baseline_drains_per_s": s.baselines,
        "baseline_peak_kb": s.baseline_peak_kb,
        "fill_s": r.fill.as_secs_f64(),
        "per_s": r.rate(),
        "ratio": r.rate() / s.baseline,
        "windows": windows,
        "samples": samples,
        "rss_start_kb": r.rss_start_kb,
        "peak_kb": peak,
        "missing": r.missing,
        "duplicates": r.duplicates,
    })
}
