//! W4: the claim's cost with and without a million sent rows kept, and the
//! database's commit (flush) latency.

use outbox::postgres::PgOutboxStore;

use crate::setup::{BoxError, Env, interleaved, median_ms};

/// The cost of one claim of 100, from `EXPLAIN (ANALYZE, BUFFERS)` of its
/// statement over `runs` runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClaimCost {
    /// Fastest server-side execution time (ms): the least disturbed run.
    pub(crate) min_ms: f64,
    /// Median server-side execution time (ms).
    pub(crate) median_ms: f64,
    /// Shared buffers touched (hit + read), median: the work done, which
    /// does not depend on what else the machine is doing.
    pub(crate) buffers: f64,
}

/// Measures [`ClaimCost`] over `runs` claims.
pub(crate) async fn claim_cost(env: &Env, runs: usize) -> Result<ClaimCost, BoxError> {
    let store = PgOutboxStore::builder(env.pool.clone())
        .schema(&env.schema)
        .build()?;
    let mut times = Vec::with_capacity(runs);
    let mut buffers = Vec::with_capacity(runs);
    for _ in 0..runs {
        let plans = [store.explain_claim(100).await?];
        let total: f64 = plans
            .iter()
            .filter_map(|plan| plan[0]["Execution Time"].as_f64())
            .sum();
        let touched: f64 = plans
            .iter()
            .map(|plan| {
                let top = &plan[0]["Plan"];
                top["Shared Hit Blocks"].as_f64().unwrap_or(0.0)
                    + top["Shared Read Blocks"].as_f64().unwrap_or(0.0)
            })
            .sum();
        times.push(total);
        buffers.push(touched);
    }
    times.sort_by(f64::total_cmp);
    buffers.sort_by(f64::total_cmp);
    Ok(ClaimCost {
        min_ms: times.first().copied().unwrap_or(f64::NAN),
        median_ms: crate::setup::percentile(&times, 50.0),
        buffers: crate::setup::percentile(&buffers, 50.0),
    })
}

/// (claim cost with an empty history, with `sent_rows` sent rows kept).
pub(crate) async fn scale(env: &Env, sent_rows: u64) -> Result<(ClaimCost, ClaimCost), BoxError> {
    env.reset().await?;
    env.backlog(&interleaved(100, 5)).await?;
    let empty = claim_cost(env, 30).await?;
    env.exec(&format!(
        "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, schema_version, payload, \
         occurred_at, status, published_at) \
         SELECT gen_random_uuid(), 'order', (g % 5000)::text, 'order.placed', 1, '{{}}', now(), \
         'sent', now() FROM generate_series(1, {sent_rows}) g",
        env.table("outbox_events"),
    ))
    .await?;
    env.exec(&format!("VACUUM ANALYZE {}", env.table("outbox_events")))
        .await?;
    let full = claim_cost(env, 30).await?;
    env.reset().await?;
    Ok((empty, full))
}

/// Median latency of a one-row autocommit INSERT: what a flush costs here.
pub(crate) async fn commit_ms(env: &Env) -> Result<f64, BoxError> {
    use diesel_async::SimpleAsyncConnection;
    let mut conn = env.conn().await?;
    conn.batch_execute("CREATE TEMP TABLE IF NOT EXISTS flush_probe (x int)")
        .await?;
    let table = env.table("bench_orders");
    let sql = format!(
        "INSERT INTO {table} (id, customer_id, total_cents) VALUES (gen_random_uuid(), gen_random_uuid(), 1)"
    );
    let conn = std::sync::Arc::new(tokio::sync::Mutex::new(conn));
    let ms = median_ms(200, || {
        let conn = std::sync::Arc::clone(&conn);
        let sql = sql.clone();
        async move {
            conn.lock().await.batch_execute(&sql).await?;
            Ok(())
        }
    })
    .await?;
    env.reset().await?;
    Ok(ms)
}

/// W4, blocked aggregates: the claim's cost while 4 relays × 2 loops drain
/// a backlog of 30,000 healthy events and a producer keeps recording,
/// without and with `heads` dead heads of `behind` + 1 events each
/// (inserted pending, as an earlier version left them; the producer also
/// writes into those aggregates).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Blocked {
    pub(crate) healthy: ClaimCost,
    pub(crate) blocked: ClaimCost,
    /// From inserting the blocked backlog until the relays had held every
    /// event behind the dead heads.
    pub(crate) settle: std::time::Duration,
    /// Events the relays published in the blocked phase (healthy ones flow).
    pub(crate) published: u64,
}

/// Measures [`Blocked`]; `samples` claims in each phase, 100 ms apart.
pub(crate) async fn blocked(
    env: &Env,
    heads: u32,
    behind: u32,
    samples: usize,
) -> Result<Blocked, BoxError> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use outbox::Relay;
    use outbox::rabbitmq::LapinPublisher;

    env.reset().await?;
    let store = PgOutboxStore::builder(env.pool.clone())
        .schema(&env.schema)
        .build()?;
    let mut handles = Vec::new();
    let mut tasks = Vec::new();
    for n in 0..4 {
        let publisher = LapinPublisher::builder(crate::setup::amqp_url())
            .exchange(&env.exchange)
            .declare_exchange(false)
            .connection_name(format!("{}.w4relay{n}", env.schema))
            .build()?;
        publisher.connect().await?;
        let relay = Relay::builder(store.clone(), publisher)
            .concurrency(2)
            .poll_interval(std::time::Duration::from_millis(100))
            .build()?;
        handles.push(relay.handle());
        tasks.push(tokio::spawn(relay.run()));
    }
    // The producer: a healthy event every 2 ms, and (once `into_blocked`)
    // one into a blocked aggregate every 10 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let into_blocked = Arc::new(AtomicBool::new(false));
    let recorded = Arc::new(AtomicU64::new(0));
    let producer = {
        let (stop, into_blocked, recorded) = (
            Arc::clone(&stop),
            Arc::clone(&into_blocked),
            Arc::clone(&recorded),
        );
        let outbox = outbox::postgres::Outbox::new(&env.schema)?.notify(false);
        let mut conn = env.conn().await?;
        let handles = handles.clone();
        tokio::spawn(async move {
            let customer = uuid::Uuid::now_v7();
            let mut n: u64 = 0;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let mut events = vec![crate::setup::OrderPlaced {
                    order_id: format!("healthy-{}", n % 200),
                    customer_id: customer,
                    total_cents: n as i64,
                }];
                if into_blocked.load(Ordering::Relaxed) && n.is_multiple_of(5) {
                    events.push(crate::setup::OrderPlaced {
                        order_id: format!("blocked-{}", n % u64::from(heads)),
                        customer_id: customer,
                        total_cents: n as i64,
                    });
                }
                let done =
                    diesel_async::AsyncConnection::transaction::<_, outbox::postgres::Error, _>(
                        &mut conn,
                        async |conn| outbox.record_all(conn, &events).await,
                    )
                    .await;
                if done.is_ok() {
                    recorded.fetch_add(events.len() as u64, Ordering::Relaxed);
                    for handle in &handles {
                        handle.notify();
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        })
    };
    let sample = |env: &Env| {
        let env_pool = env.pool.clone();
        let schema = env.schema.clone();
        async move {
            let store = PgOutboxStore::builder(env_pool).schema(&schema).build()?;
            let mut times = Vec::with_capacity(samples);
            let mut buffers = Vec::with_capacity(samples);
            for _ in 0..samples {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                let plan = store.explain_claim(100).await?;
                times.push(plan[0]["Execution Time"].as_f64().unwrap_or(f64::NAN));
                let top = &plan[0]["Plan"];
                buffers.push(
                    top["Shared Hit Blocks"].as_f64().unwrap_or(0.0)
                        + top["Shared Read Blocks"].as_f64().unwrap_or(0.0),
                );
            }
            times.sort_by(f64::total_cmp);
            buffers.sort_by(f64::total_cmp);
            Ok::<_, BoxError>(ClaimCost {
                min_ms: times.first().copied().unwrap_or(f64::NAN),
                median_ms: crate::setup::percentile(&times, 50.0),
                buffers: crate::setup::percentile(&buffers, 50.0),
            })
        }
    };
    // Each phase samples while the relays drain the same healthy backlog
    // (so that every sampled claim has a full window, as in the empty case
    // above) and the producer writes.
    let busy = crate::setup::interleaved(100, 300);
    let result = async {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        env.backlog(&busy).await?;
        let healthy = sample(env).await?;
        let t = env.table("outbox_events");
        let inserted = std::time::Instant::now();
        env.exec(&format!(
            "INSERT INTO {t} (id, aggregate_type, aggregate_id, event_type, schema_version, \
             payload, occurred_at, status, attempts, last_error) \
             SELECT gen_random_uuid(), 'order', 'blocked-' || (g % {heads}), 'order.placed', 1, \
               '{{}}', now(), CASE WHEN g < {heads} THEN 'dead' ELSE 'pending' END, \
               CASE WHEN g < {heads} THEN 10 ELSE 0 END, \
               CASE WHEN g < {heads} THEN 'bench: dead head' END \
             FROM generate_series(0, {heads} * ({behind} + 1) - 1) g"
        ))
        .await?;
        into_blocked.store(true, Ordering::Relaxed);
        let want = i64::from(heads) * i64::from(behind);
        let settle = loop {
            if count(
                env,
                &format!("SELECT count(*) AS n FROM {t} WHERE status = 'held'"),
            )
            .await?
                >= want
            {
                break inserted.elapsed();
            }
            if inserted.elapsed() > std::time::Duration::from_secs(120) {
                return Err(
                    "W4 blocked: the relays did not hold the blocked backlog in 120 s".into(),
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        env.backlog(&busy).await?;
        let sent_before = count(
            env,
            &format!("SELECT count(*) AS n FROM {t} WHERE status = 'sent'"),
        )
        .await?;
        let blocked = sample(env).await?;
        let sent_after = count(
            env,
            &format!("SELECT count(*) AS n FROM {t} WHERE status = 'sent'"),
        )
        .await?;
        Ok::<_, BoxError>(Blocked {
            healthy,
            blocked,
            settle,
            published: u64::try_from(sent_after - sent_before).unwrap_or(0),
        })
    }
    .await;
    stop.store(true, Ordering::Relaxed);
    let _ = producer.await;
    for handle in &handles {
        handle.shutdown();
    }
    for task in tasks {
        let _ = task.await;
    }
    env.reset().await?;
    let _ = recorded;
    result
}

async fn count(env: &Env, sql: &str) -> Result<i64, BoxError> {
    #[derive(diesel::QueryableByName)]
    struct N {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    use diesel_async::RunQueryDsl;
    Ok(diesel::sql_query(sql)
        .get_result::<N>(&mut env.conn().await?)
        .await?
        .n)
}
