//! The outbox benchmark: every figure next to this machine's own ceiling,
//! measured in the same run, and the ratio.
//!
//! Run with:
//! ```text
//! scripts/dev-services && cargo run --release -p outbox-bench
//! ```
//! (`-- --quick` for a shorter smoke run; `-- --only w1,w3` for some
//! workloads.) Needs PostgreSQL and RabbitMQ (`DATABASE_URL`, `AMQP_URL`);
//! uses a private schema, exchange and queue, removed at the end. Prints a
//! table, then one JSON line.
//!
//! # Back ends
//! `-- --backend postgres|mysql|sqlite|all` (default `postgres`; `all` runs
//! the three one after another, each with its own table and JSON line):
//! - **postgres**: everything below, W1–W5.
//! - **mysql** (MariaDB, `MYSQL_URL`, default
//!   `mysql://outbox:outbox@127.0.0.1:3306/outbox_test`): a database of the
//!   run's own on that server, dropped at the end.
//! - **sqlite**: a file of the run's own under the workspace's `target/`,
//!   deleted at the end.
//!
//! On MariaDB and SQLite, W1–W3 are measured as on PostgreSQL, each against
//! the same back end's ceiling in the same run (W1: that back end's commit
//! rate of the same order insert without the event; W2: the raw broker
//! ceiling, which touches no database; W3: the floor, an order row committed
//! on that back end and then published inline). Neither has `NOTIFY`: those
//! rows say "polling" (the relay polls, or is woken in-process). The
//! library's transactions begin and commit as its docs ask
//! (`begin_top_level`/`commit_top_level`: on MariaDB a savepoint more than the
//! ceilings' plain `BEGIN`/`COMMIT`; on SQLite `BEGIN IMMEDIATE` for both).
//! W4 is PostgreSQL's only (it counts EXPLAIN's shared buffers), and so is
//! W5 (its consumer, handler and ceilings are written for
//! `PgInboxDatabase`). The JSON
//! line of those back ends has a `"backend"` key; PostgreSQL's is unchanged.
//!
//! Workloads:
//! - **W1 record**: transactions/s of "insert an order + record its event",
//!   1 and 8 writers, against the order alone and the same outbox row
//!   hand-written in SQL; and `record_all` of 100 events (rows/s).
//! - **W2 drain**: a committed backlog (2,000 aggregates × 10 events,
//!   interleaved) drained by the relay to a durable queue, against raw lapin
//!   publish-with-confirms of the same messages with several strategies
//!   (stop-and-wait batches, 2 and 4 channels of overlapping batches, a
//!   sliding window of 256 and 1,024 unconfirmed; module `raw`): the best
//!   of the run is the ceiling, the stop-and-wait one a second column. The
//!   ceiling and the headline relay variants alternate, 5 drains each, and
//!   the medians are compared (module `drain`). A hot backlog (20 × 1,000,
//!   ordered) against 20 sequential raw streams; ordered 1 relay against a
//!   quorum queue with the best raw strategy on the same queue. Every drain
//!   shows its CPU per event, the bench process's and the database's
//!   (module `cpu`).
//! - **W3 latency**: 100 events/s; receive time − a stamp taken just
//!   before COMMIT; per wakeup mode, against the naive floor (commit, then
//!   publish inline with a confirm), which runs interleaved with the
//!   in-process relay, second by second.
//! - **W4 claim scale**: a claim of 100 with 0 and with 1,000,000 sent rows
//!   kept: shared buffers touched (the work, independent of machine noise)
//!   and server time (fastest and median of 30; at about 1 ms the median
//!   moves with whatever else the machine does); and a claim of 100 while
//!   4 relays × 2 loops and a producer run, without and with 1,000 dead
//!   heads of 100 events each (the producer also writing into them).
//! - **W5 consume**: the inbox consumer (`InboxConsumer` on
//!   `PgInboxDatabase`) applying a backlog of 20,000 events (2,000
//!   aggregates × 10) already waiting in a durable queue, in the relay's
//!   wire format; the handler inserts one row in the consumer's
//!   transaction (so each delivery is the inbox insert + the handler's
//!   insert + commit, then the ack). Concurrency 1, 4 and 8, prefetch 64
//!   for all (see `consume::PREFETCH`); the clock runs from the consumer's
//!   start to its last commit. Against two ceilings, run alternately with
//!   it (`W5_ROUNDS` each, medians): the broker's (raw lapin consume + ack
//!   of the same messages, same prefetch, one channel, acks from as many
//!   tasks; no database) and the database's (the same two inserts per
//!   transaction, prepared, committed by as many concurrent writers; no
//!   broker). The ratio is against the lower of the two. A fourth run,
//!   "by hand", does the consumer's work without the library (raw lapin,
//!   the database ceiling's transaction per delivery, then the ack; tasks
//!   get whole aggregates by the consumer's own hash): on a machine where
//!   the broker and the database share the cores, neither ceiling alone
//!   is reachable, and consumer / by hand is the library's own cost. Also:
//!   CPU per event of the bench, PostgreSQL and RabbitMQ (`/proc`), how
//!   busy the whole machine was, every event applied once (the rows'
//!   event ids checked against the backlog's), where a delivery's time
//!   goes for the consumer and by hand (begin, inbox insert, handler,
//!   commit, the rest: waiting for a delivery, decoding, acking), and how
//!   unevenly the aggregates hash over the workers.
//! - **W6 scale** (not in the default run: `-- --w6`, or `-- --only w6`;
//!   PostgreSQL only): a backlog of 1,000,000 events (100,000 with
//!   `--quick`), filled in SQL, drained by the ordered relay (1 relay, batch
//!   100, sent rows kept) with no `VACUUM` but autovacuum's: the rate of
//!   every tenth against a 20,000-event drain of the same run, the outbox
//!   table's dead tuples and autovacuum runs, the claim's buffers and the
//!   bench's peak resident memory as it goes. It runs on a private
//!   PostgreSQL cluster with autovacuum on (`initdb` on a port of its own,
//!   removed at the end), so the migrations' autovacuum settings act
//!   whatever the shared server says; `-- --w6-shared` runs it on the
//!   shared server. It takes 5–8 minutes at full size (see `scale`).
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod backend;
mod claim;
mod consume;
mod cpu;
mod drain;
mod latency;
mod raw;
mod record;
mod scale;
mod setup;

use std::time::Duration;

use serde_json::json;

use backend::Backend;
use setup::{BoxError, Env};

/// W1 runs its variants in turns of this many slices each (see
/// `record::run_interleaved`).
const W1_SLICES: u32 = 10;

/// W5 runs the broker ceiling, the database ceiling, the hand-written
/// consumer and the consumer this many times each per concurrency,
/// alternating, and reports the medians.
const W5_ROUNDS: usize = 3;

/// W5's batch mode: deliveries per transaction at most.
const W5_BATCH: usize = 50;

struct Params {
    w1_secs: u64,
    drain_events: (usize, usize),
    hot: (usize, usize),
    w3_rate: u32,
    w3_secs: u64,
    w4_rows: u64,
    w4_heads: u32,
    /// W5's backlog: aggregates × events each.
    w5_events: (usize, usize),
    /// W5's rounds per concurrency (see [`W5_ROUNDS`]).
    w5_rounds: usize,
    /// W6's backlog.
    w6_events: usize,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if let Err(err) = run().await {
        eprintln!("outbox-bench failed: {err}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), BoxError> {
    let quick = std::env::args().any(|a| a == "--quick");
    let only: Option<String> = std::env::args()
        .skip_while(|a| a != "--only")
        .nth(1)
        .map(|s| s.to_lowercase());
    let p = if quick {
        Params {
            w1_secs: 1,
            drain_events: (500, 4),
            hot: (20, 100),
            w3_rate: 100,
            w3_secs: 3,
            w4_rows: 100_000,
            w4_heads: 200,
            w5_events: (2000, 1),
            w5_rounds: 1,
            w6_events: 100_000,
        }
    } else {
        Params {
            w1_secs: 3,
            drain_events: (2000, 10),
            hot: (20, 1000),
            w3_rate: 100,
            w3_secs: 20,
            w4_rows: 1_000_000,
            w4_heads: 1_000,
            w5_events: (2000, 10),
            w5_rounds: W5_ROUNDS,
            w6_events: 1_000_000,
        }
    };
    let backends = Backend::from_args()?;
    for (n, &which) in backends.iter().enumerate() {
        if n > 0 {
            println!();
        }
        let report = match which {
            Backend::Postgres => {
                let env = Env::new().await?;
                let result = workloads(&env, &p, only.as_deref()).await;
                env.cleanup().await;
                result?
            }
            Backend::Mysql | Backend::Sqlite => backend::run(which, &p, only.as_deref()).await?,
        };
        println!("{report}");
    }
    Ok(())
}

async fn workloads(
    env: &Env,
    p: &Params,
    only: Option<&str>,
) -> Result<serde_json::Value, BoxError> {
    let run = |w: &str| only.is_none_or(|o| o.split(',').any(|x| x == w));
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let commit = claim::commit_ms(env).await?;
    println!(
        "outbox-bench: {cores} cores; PostgreSQL commit (flush) latency {commit:.2} ms (median of 200 one-row autocommit INSERTs)\n"
    );

    let mut w1 = serde_json::Map::new();
    if run("w1") {
        println!(
            "W1 record: transactions/s ({} s per cell, interleaved in {W1_SLICES} slices)",
            p.w1_secs
        );
        println!("  {:<42} {:>10} {:>10}", "", "1 writer", "8 writers");
        let duration = Duration::from_secs(p.w1_secs);
        let variants = [
            record::Variant::OrderOnly,
            record::Variant::HandSql,
            record::Variant::Library,
            record::Variant::LibraryNotify,
        ];
        let one = record::run_interleaved(env, &variants, 1, duration, W1_SLICES).await?;
        let eight = record::run_interleaved(env, &variants, 8, duration, W1_SLICES).await?;
        let mut rows = Vec::new();
        for (i, variant) in variants.into_iter().enumerate() {
            println!(
                "  {:<42} {:>10.0} {:>10.0}",
                variant.name(),
                one[i],
                eight[i]
            );
            rows.push((variant, one[i], eight[i]));
        }
        let get = |v: record::Variant| {
            rows.iter()
                .find(|(x, _, _)| *x == v)
                .map_or((f64::NAN, f64::NAN), |(_, a, b)| (*a, *b))
        };
        let (hand1, hand8) = get(record::Variant::HandSql);
        let (lib1, lib8) = get(record::Variant::Library);
        let (not1, not8) = get(record::Variant::LibraryNotify);
        let (base1, base8) = get(record::Variant::OrderOnly);
        println!(
            "  {:<42} {:>10.2} {:>10.2}   target >= 0.95",
            "library / hand-written SQL",
            lib1 / hand1,
            lib8 / hand8
        );
        println!(
            "  {:<42} {:>10.2} {:>10.2}",
            "library+NOTIFY / hand-written SQL",
            not1 / hand1,
            not8 / hand8
        );
        println!(
            "  {:<42} {:>10.2} {:>10.2}",
            "with outbox row / order only",
            lib1 / base1,
            lib8 / base8
        );
        let all1 = record::run_record_all(env, 1, duration).await?;
        let all8 = record::run_record_all(env, 8, duration).await?;
        println!(
            "  {:<42} {:>10.0} {:>10.0}   rows/s",
            "record_all, 100 events per transaction", all1, all8
        );
        for (variant, one, eight) in &rows {
            w1.insert(
                format!("{variant:?}"),
                json!({"writers_1": one, "writers_8": eight}),
            );
        }
        w1.insert(
            "ratio_library_vs_hand".into(),
            json!([lib1 / hand1, lib8 / hand8]),
        );
        w1.insert(
            "ratio_notify_vs_hand".into(),
            json!([not1 / hand1, not8 / hand8]),
        );
        w1.insert("record_all_rows_per_s".into(), json!([all1, all8]));
    }

    let mut w2 = serde_json::Map::new();
    if run("w2") {
        drain::w2(env, None, p.drain_events, p.hot, &mut w2).await?;
    }

    let mut w3 = serde_json::Map::new();
    if run("w3") {
        println!(
            "\nW3 latency: {} events/s for {} s each, milliseconds from just before COMMIT to receipt \
             (floor and in-process interleaved second by second)",
            p.w3_rate, p.w3_secs
        );
        println!(
            "  {:<42} {:>6} {:>8} {:>8} {:>8} {:>10}",
            "", "n", "p50", "p99", "max", "p99/floor"
        );
        let duration = Duration::from_secs(p.w3_secs);
        // The WAL of W1 and W2 would otherwise be written out by a timed
        // checkpoint in the middle of W3, stalling commits there.
        if let Err(err) = env.exec("CHECKPOINT").await {
            println!("  (CHECKPOINT before W3 failed: {err}; figures may include one)");
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (floor, in_process) = latency::floor_and_in_process(env, p.w3_rate, duration).await?;
        let lat_line = |name: &str, l: &latency::Latency| {
            println!(
                "  {:<42} {:>6} {:>8.2} {:>8.2} {:>8.2} {:>10.2}",
                name,
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
        for (wakeup, measured) in [
            (latency::Wakeup::InProcess, Some(in_process)),
            (latency::Wakeup::Notify, None),
            (latency::Wakeup::Polling, None),
        ] {
            let l = match measured {
                Some(l) => l,
                None => latency::relay(env, wakeup, p.w3_rate, duration).await?,
            };
            lat_line(wakeup.name(), &l);
            w3.insert(
                format!("{wakeup:?}"),
                json!({"n": l.n, "p50": l.p50, "p99": l.p99, "max": l.max}),
            );
        }
        println!(
            "  targets: in-process p99 <= 2x floor p99 (<= 5 ms); NOTIFY p99 <= 10 ms; polling p99 <= 1000 ms"
        );
    }

    let mut w4 = json!(null);
    if run("w4") {
        let (empty, full) = claim::scale(env, p.w4_rows).await?;
        println!(
            "\nW4 claim of 100, {} sent rows kept vs none (30 claims each; target: ratio <= 1.5)",
            p.w4_rows
        );
        println!(
            "  buffers touched (median)   {:>9.0} vs {:>9.0}   ratio {:.2}",
            full.buffers,
            empty.buffers,
            full.buffers / empty.buffers
        );
        println!(
            "  server time, fastest       {:>7.3} ms vs {:>6.3} ms   ratio {:.2}",
            full.min_ms,
            empty.min_ms,
            full.min_ms / empty.min_ms
        );
        println!(
            "  server time, median        {:>7.3} ms vs {:>6.3} ms   ratio {:.2} (noisy at ~1 ms)",
            full.median_ms,
            empty.median_ms,
            full.median_ms / empty.median_ms
        );
        let b = claim::blocked(env, p.w4_heads, 99, 30).await?;
        println!(
            "\nW4 claim of 100 with 4 relays x 2 loops and a producer running: {} dead heads \
             x 100 events vs none (30 claims each; target: ratio <= 1.5)",
            p.w4_heads
        );
        println!(
            "  buffers touched (median)   {:>9.0} vs {:>9.0}   ratio {:.2}",
            b.blocked.buffers,
            b.healthy.buffers,
            b.blocked.buffers / b.healthy.buffers
        );
        println!(
            "  server time, median        {:>7.3} ms vs {:>6.3} ms   ratio {:.2} (noisy at ~1 ms)",
            b.blocked.median_ms,
            b.healthy.median_ms,
            b.blocked.median_ms / b.healthy.median_ms
        );
        println!(
            "  every event behind a dead head held after {}; {} healthy events published while measuring",
            setup::secs(b.settle),
            b.published
        );
        w4 = json!({
            "blocked": {
                "heads": p.w4_heads,
                "buffers": {"healthy": b.healthy.buffers, "blocked": b.blocked.buffers, "ratio": b.blocked.buffers / b.healthy.buffers},
                "median_ms": {"healthy": b.healthy.median_ms, "blocked": b.blocked.median_ms, "ratio": b.blocked.median_ms / b.healthy.median_ms},
                "settle_s": b.settle.as_secs_f64(),
                "published": b.published,
            },
            "sent_rows": p.w4_rows,
            "buffers": {"empty": empty.buffers, "full": full.buffers, "ratio": full.buffers / empty.buffers},
            "min_ms": {"empty": empty.min_ms, "full": full.min_ms, "ratio": full.min_ms / empty.min_ms},
            "median_ms": {"empty": empty.median_ms, "full": full.median_ms, "ratio": full.median_ms / empty.median_ms},
        });
    }

    let mut w5 = json!(null);
    if run("w5") {
        w5 = w5_consume(env, p).await?;
    }

    // W6 runs only when asked for: at full size it takes minutes and leaves
    // the server a million rows' worth of WAL to checkpoint.
    let mut w6 = json!(null);
    let w6_asked = std::env::args().any(|a| a == "--w6")
        || only.is_some_and(|o| o.split(',').any(|x| x == "w6"));
    if w6_asked {
        // On a private cluster with autovacuum on unless `--w6-shared` asks
        // for the shared server as it is set up (see `scale`).
        let scale = if std::env::args().any(|a| a == "--w6-shared") {
            scale::run(env, p.w6_events, "the shared server (DATABASE_URL)".into()).await?
        } else {
            scale::run_private(p.w6_events).await?
        };
        w6 = scale::report(&scale);
    }

    Ok(json!({
        "cores": cores,
        "commit_ms": commit,
        "w1": w1,
        "w2": w2,
        "w3": w3,
        "w4": w4,
        "w5": w5,
        "w6": w6,
    }))
}

/// W5: the inbox consumer against the broker and database ceilings, per
/// concurrency (see the workload list above).
async fn w5_consume(env: &Env, p: &Params) -> Result<serde_json::Value, BoxError> {
    let (aggs, per) = p.w5_events;
    let events = setup::interleaved(aggs, per);
    println!(
        "\nW5 consume: {} events ({aggs} aggregates x {per}) waiting in a durable queue, \
         prefetch {}; the handler inserts 1 row",
        events.len(),
        consume::PREFETCH
    );
    println!(
        "  {:<18} {:>9} {:>9} {:>9} {:>9} {:>6} {:>8} {:>6} {:>8} {:>5}",
        "events/s",
        "consumer",
        "broker",
        "database",
        "by hand",
        "ratio",
        "vs hand",
        "busy",
        "missing",
        "dup"
    );
    let rig = consume::Rig::new(env, &events).await?;
    let result = w5_rows(env, p, &rig).await;
    drop(rig);
    consume::cleanup(env).await;
    result
}

async fn w5_rows(env: &Env, p: &Params, rig: &consume::Rig) -> Result<serde_json::Value, BoxError> {
    let mut out = serde_json::Map::new();
    let mut profile = Vec::new();
    for concurrency in consume::CONCURRENCY {
        let mut runs: [Vec<consume::Apply>; 4] = Default::default();
        // Alternating, so drift on the machine hits the four alike.
        for _ in 0..p.w5_rounds.max(1) {
            runs[0].push(consume::broker(env, rig, concurrency).await?);
            runs[1].push(consume::database(env, rig, concurrency).await?);
            runs[2].push(consume::hand_written(env, rig, concurrency).await?);
            runs[3].push(consume::consumer(env, rig, concurrency).await?);
        }
        let [broker, database, by_hand, consumer] = runs.map(|r| consume::median(&r));
        let ceiling = broker.rate().min(database.rate());
        let all = [&broker, &database, &by_hand, &consumer];
        println!(
            "  {:<18} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>6.2} {:>8.2} {:>5.0}% {:>8} {:>5}",
            format!("concurrency {concurrency}"),
            consumer.rate(),
            broker.rate(),
            database.rate(),
            by_hand.rate(),
            consumer.rate() / ceiling,
            consumer.rate() / by_hand.rate(),
            consumer.cpu.busy * 100.0,
            all.iter().map(|a| a.missing).sum::<usize>(),
            all.iter().map(|a| a.duplicates).sum::<usize>(),
        );
        let left: usize = all.iter().map(|a| a.left).sum();
        if left > 0 {
            println!("    ({left} messages left unacked in the queue after the runs)");
        }
        profile.push((
            concurrency,
            consumer.clone(),
            broker.clone(),
            database.clone(),
            by_hand.clone(),
        ));
        let run = |a: &consume::Apply| {
            let [bench, postgres, rabbit] = a.cpu_us();
            json!({
                "per_s": a.rate(),
                "cpu_us_per_event": {"bench": bench, "postgres": postgres, "rabbitmq": rabbit},
                "machine_busy": a.cpu.busy,
                "missing": a.missing,
                "duplicates": a.duplicates,
                "left_in_queue": a.left,
            })
        };
        let phases = consumer.phases.unwrap_or_default();
        out.insert(
            format!("concurrency_{concurrency}"),
            json!({
                "consumer": run(&consumer),
                "broker": run(&broker),
                "database": run(&database),
                "by_hand": run(&by_hand),
                "ratio": consumer.rate() / ceiling,
                "ratio_vs_by_hand": consumer.rate() / by_hand.rate(),
                "busiest_worker_share_over_mean": rig.spread(concurrency),
                "by_hand_phases_ms_per_event": by_hand.raw_phases.map(|[w, b, i, h, c, a]| json!({
                    "wait": w, "begin": b, "inbox_insert": i, "handler": h, "commit": c, "ack": a,
                    "other": consume::other_ms(&by_hand, concurrency, &[b, i, h, c]),
                })),
                "startup_ms": {
                    "consumer": consumer.startup.as_secs_f64() * 1e3,
                    "by_hand": by_hand.startup.as_secs_f64() * 1e3,
                },
                "phases_ms_per_event": {
                    "begin": phases.begin,
                    "inbox_insert": phases.receive,
                    "handler": phases.handler,
                    "commit": phases.commit,
                    "other": phases.other,
                },
            }),
        );
    }
    println!(
        "  ratio: consumer / the lower ceiling, target >= 0.8; by hand: raw lapin + the database \
         ceiling's transaction per delivery, then the ack (the same work without the library); \
         {} round(s) of the four, alternating, medians; busy: the whole machine during the \
         consumer's run",
        p.w5_rounds.max(1)
    );
    println!(
        "  CPU us per event, bench / PostgreSQL (the run's backends, by application_name) / \
         RabbitMQ (all its clients count):"
    );
    println!(
        "  {:<18} {:>18} {:>18} {:>18} {:>18}",
        "", "consumer", "broker", "database", "by hand"
    );
    let cpu = |a: &consume::Apply| {
        let [bench, postgres, rabbit] = a.cpu_us();
        format!("{bench:.0} / {postgres:.0} / {rabbit:.0}")
    };
    for (concurrency, consumer, broker, database, by_hand) in &profile {
        println!(
            "  {:<18} {:>18} {:>18} {:>18} {:>18}",
            format!("concurrency {concurrency}"),
            cpu(consumer),
            cpu(broker),
            cpu(database),
            cpu(by_hand)
        );
    }
    println!(
        "  a consumer worker's time, ms per event (begin: pool + BEGIN; other: waiting for its \
         next delivery, decoding, acking):"
    );
    for (concurrency, consumer, ..) in &profile {
        let ph = consumer.phases.unwrap_or_default();
        println!(
            "  {:<18} begin {:.3}  inbox {:.3}  handler {:.3}  commit {:.3}  other {:.3}",
            format!("concurrency {concurrency}"),
            ph.begin,
            ph.receive,
            ph.handler,
            ph.commit,
            ph.other
        );
    }
    println!(
        "  by hand, the same: begin, inbox, handler, commit, other (of which waiting for a \
         delivery, and acking); startup: until the first delivery, both; busiest: the busiest \
         worker's share of the backlog over the mean (workers get whole aggregates: a run lasts \
         as long as the busiest takes, the others idle in \"other\"):"
    );
    for (concurrency, consumer, _, _, by_hand) in &profile {
        let [wait, begin, inbox, handler, commit, ack] = by_hand.raw_phases.unwrap_or_default();
        let other = consume::other_ms(by_hand, *concurrency, &[begin, inbox, handler, commit]);
        println!(
            "  {:<18} begin {begin:.3}  inbox {inbox:.3}  handler {handler:.3}  commit {commit:.3}  \
             other {other:.3} (wait {wait:.3}, ack {ack:.3})   startup {:.0} / {:.0} ms   \
             busiest {:.2}x",
            format!("concurrency {concurrency}"),
            consumer.startup.as_secs_f64() * 1e3,
            by_hand.startup.as_secs_f64() * 1e3,
            rig.spread(*concurrency)
        );
    }
    // Past the per-transaction ceiling: the opt-in batch mode.
    println!(
        "  batch mode (InboxConsumerBuilder::batch({W5_BATCH}, 5 ms), prefetch 2 x batch x \
         concurrency), against the database ceiling above (one transaction per event):"
    );
    let mut batched = serde_json::Map::new();
    for (concurrency, _, _, database, _) in &profile {
        let mut runs = Vec::new();
        for _ in 0..p.w5_rounds.max(1) {
            runs.push(consume::batched(env, rig, *concurrency, W5_BATCH).await?);
        }
        let b = consume::median(&runs);
        println!(
            "  {:<18} {:>9.0} events/s  {:>5.2} x the database ceiling  missing {}  dup {}",
            format!("concurrency {concurrency}"),
            b.rate(),
            b.rate() / database.rate(),
            b.missing,
            b.duplicates
        );
        batched.insert(
            format!("concurrency_{concurrency}"),
            json!({"per_s": b.rate(), "ratio_vs_database": b.rate() / database.rate(),
                   "missing": b.missing, "duplicates": b.duplicates, "left_in_queue": b.left}),
        );
    }
    out.insert(
        "batch".into(),
        json!({"max_deliveries": W5_BATCH, "runs": batched}),
    );
    out.insert("events".into(), json!(rig.events()));
    out.insert("prefetch".into(), json!(consume::PREFETCH));
    out.insert("rounds".into(), json!(p.w5_rounds.max(1)));
    Ok(serde_json::Value::Object(out))
}
