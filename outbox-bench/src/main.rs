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
//! - **postgres**: everything below, W1–W4.
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
//! W4 is PostgreSQL's only (it counts EXPLAIN's shared buffers). The JSON
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
//! - **W6 scale** (not in the default run: `-- --w6`, or `-- --only w6`;
//!   PostgreSQL only): a backlog of 1,000,000 events (100,000 with
//!   `--quick`), filled in SQL, drained by the ordered relay (1 relay, batch
//!   100, sent rows kept) with no `VACUUM` but autovacuum's: the rate of
//!   every tenth against a 20,000-event drain of the same run, the outbox
//!   table's dead tuples, the claim's buffers and the bench's peak resident
//!   memory as it goes. It takes 3–5 minutes at full size (see `scale`).
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod backend;
mod claim;
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

struct Params {
    w1_secs: u64,
    drain_events: (usize, usize),
    hot: (usize, usize),
    w3_rate: u32,
    w3_secs: u64,
    w4_rows: u64,
    w4_heads: u32,
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

    // W6 runs only when asked for: at full size it takes minutes and leaves
    // the server a million rows' worth of WAL to checkpoint.
    let mut w6 = json!(null);
    let w6_asked = std::env::args().any(|a| a == "--w6")
        || only.is_some_and(|o| o.split(',').any(|x| x == "w6"));
    if w6_asked {
        let scale = scale::run(env, p.w6_events).await?;
        w6 = scale::report(&scale);
    }

    Ok(json!({
        "cores": cores,
        "commit_ms": commit,
        "w1": w1,
        "w2": w2,
        "w3": w3,
        "w4": w4,
        "w6": w6,
    }))
}
