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
