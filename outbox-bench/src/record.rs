//! W1: the cost of recording an event in the business transaction.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Integer, Nullable, Text, Timestamptz};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox::DomainEvent;
use outbox::postgres::Outbox;
use uuid::Uuid;

use crate::setup::{BoxError, Env, OrderPlaced, Prepared};

/// What each transaction does besides inserting the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Variant {
    /// Nothing: the business transaction alone.
    OrderOnly,
    /// The same outbox row, hand-written SQL (one INSERT … VALUES).
    HandSql,
    /// `Outbox::record`, NOTIFY off.
    Library,
    /// `Outbox::record`, NOTIFY on (the default).
    LibraryNotify,
}

impl Variant {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Variant::OrderOnly => "order only (ceiling)",
            Variant::HandSql => "order + hand-written outbox INSERT",
            Variant::Library => "order + outbox::record (NOTIFY off)",
            Variant::LibraryNotify => "order + outbox::record (NOTIFY on)",
        }
    }
}

async fn one_transaction(
    conn: &mut AsyncPgConnection,
    env_orders: &str,
    hand_sql: &str,
    outbox: &Outbox,
    variant: Variant,
) -> Result<(), BoxError> {
    let order = OrderPlaced {
        order_id: Uuid::now_v7().to_string(),
        customer_id: Uuid::now_v7(),
        total_cents: 1250,
    };
    conn.transaction::<_, BoxError, _>(async |conn| {
        Prepared(
            diesel::sql_query(env_orders)
                .bind::<diesel::sql_types::Uuid, _>(Uuid::parse_str(&order.order_id)?)
                .bind::<diesel::sql_types::Uuid, _>(order.customer_id)
                .bind::<BigInt, _>(order.total_cents),
        )
        .execute(conn)
        .await?;
        match variant {
            Variant::OrderOnly => {}
            Variant::HandSql => {
                Prepared(
                    diesel::sql_query(hand_sql)
                        .bind::<diesel::sql_types::Uuid, _>(Uuid::now_v7())
                        .bind::<Text, _>(order.aggregate_type())
                        .bind::<Text, _>(order.aggregate_id())
                        .bind::<Nullable<BigInt>, _>(None::<i64>)
                        .bind::<Text, _>(order.event_type())
                        .bind::<Integer, _>(1)
                        .bind::<Text, _>(serde_json::to_string(&order)?)
                        .bind::<Text, _>("{}")
                        .bind::<Timestamptz, _>(chrono::Utc::now()),
                )
                .execute(conn)
                .await?;
            }
            Variant::Library | Variant::LibraryNotify => {
                outbox.record(conn, &order).await?;
            }
        }
        Ok(())
    })
    .await
}

/// Transactions per second of each of `variants`, each with `writers`
/// concurrent connections of its own, measured interleaved: `slices` rounds
/// in which every variant runs alone for `duration / slices`. Drift in what
/// else the machine does (frequent on these shared machines) then hits every
/// variant alike instead of whichever ran during it, so the ratios compare
/// like with like.
pub(crate) async fn run_interleaved(
    env: &Env,
    variants: &[Variant],
    writers: usize,
    duration: Duration,
    slices: u32,
) -> Result<Vec<f64>, BoxError> {
    let orders_sql = format!(
        "INSERT INTO {} (id, customer_id, total_cents) VALUES ($1, $2, $3)",
        env.table("bench_orders")
    );
    let hand_sql = format!(
        "INSERT INTO {} (id, aggregate_type, aggregate_id, aggregate_version, event_type, \
         schema_version, payload, headers, occurred_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7::json, $8::jsonb, $9)",
        env.table("outbox_events")
    );
    // Which variant's writers may start a transaction (`usize::MAX`: none).
    let (active_tx, active_rx) = tokio::sync::watch::channel(usize::MAX);
    let stop = Arc::new(AtomicBool::new(false));
    let done: Arc<Vec<AtomicU64>> = Arc::new(variants.iter().map(|_| AtomicU64::new(0)).collect());
    let mut tasks = Vec::new();
    for (index, &variant) in variants.iter().enumerate() {
        let outbox = Outbox::new(&env.schema)?.notify(variant == Variant::LibraryNotify);
        for _ in 0..writers {
            let mut conn = env.conn().await?;
            let (orders_sql, hand_sql, outbox) =
                (orders_sql.clone(), hand_sql.clone(), outbox.clone());
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
                    one_transaction(&mut conn, &orders_sql, &hand_sql, &outbox, variant).await?;
                    done[index].fetch_add(1, Ordering::Relaxed);
                }
                Ok::<(), BoxError>(())
            }));
        }
    }
    let slice = duration / slices.max(1);
    let mut counted = vec![0u64; variants.len()];
    let mut elapsed = vec![Duration::ZERO; variants.len()];
    // A first round unmeasured: connections prepare their statements.
    for round in 0..=slices {
        for index in 0..variants.len() {
            let _ = active_tx.send(index);
            // Let the previous variant's last transactions finish.
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
    env.reset().await?;
    Ok(counted
        .iter()
        .zip(&elapsed)
        .map(|(&n, t)| n as f64 / t.as_secs_f64())
        .collect())
}

/// Rows per second recording 100 events per transaction with `record_all`.
pub(crate) async fn run_record_all(
    env: &Env,
    writers: usize,
    duration: Duration,
) -> Result<f64, BoxError> {
    let outbox = Outbox::new(&env.schema)?.notify(false);
    let stop = Arc::new(AtomicBool::new(false));
    let rows = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..writers {
        let mut conn = env.conn().await?;
        let outbox = outbox.clone();
        let (stop, rows) = (Arc::clone(&stop), Arc::clone(&rows));
        tasks.push(tokio::spawn(async move {
            let events = crate::setup::interleaved(10, 10);
            while !AtomicBool::load(&stop, Ordering::Relaxed) {
                conn.transaction::<_, outbox::postgres::Error, _>(async |conn| {
                    outbox.record_all(conn, &events).await
                })
                .await?;
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
    env.reset().await?;
    Ok(count as f64 / elapsed.as_secs_f64())
}
