//! A claim costs the same with a million sent rows kept for audit as with an
//! outbox holding only the backlog: it scans the partial index of pending
//! rows, never the table, in ordered and unordered mode.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(clippy::print_stdout)] // the measured figures are part of the report

mod common;

use std::time::Instant;

use common::{TestDb, moved, record};
use diesel_async::AsyncConnection as _;
use outbox_core::DeliveryOrder;
use outbox_diesel::Error;
use serde_json::Value;

const SENT_ROWS: u32 = 1_000_000;
const PENDING_ROWS: u32 = 200;
const CLAIM: usize = 100;

/// Records the backlog through the API, then vacuums and analyzes the table.
async fn record_backlog_and_vacuum(db: &TestDb) {
    let events: Vec<_> = (0..PENDING_ROWS)
        .map(|n| moved(&(n % 50).to_string(), n))
        .collect();
    let mut conn = db.conn().await;
    let ids = conn
        .transaction::<_, Error, _>(async |conn| db.outbox.record_all(conn, &events).await)
        .await
        .unwrap();
    assert_eq!(ids.len(), PENDING_ROWS as usize);
    // Autocommit on the sync connection: VACUUM cannot run in a transaction.
    db.execute("VACUUM ANALYZE {schema}.outbox_events");
}

/// Every plan node under (and including) `node`.
fn nodes(node: &Value) -> Vec<&Value> {
    let mut out = vec![node];
    if let Some(children) = node.get("Plans").and_then(Value::as_array) {
        for child in children {
            out.extend(nodes(child));
        }
    }
    out
}

/// The top-level `Plan` of one `EXPLAIN (FORMAT JSON)` result.
fn top(plan: &Value) -> &Value {
    &plan[0]["Plan"]
}

fn is_index_scan_on_unsent(node: &Value) -> bool {
    matches!(
        node["Node Type"].as_str(),
        Some("Index Scan" | "Index Only Scan")
    ) && node["Index Name"].as_str() == Some("outbox_events_pending")
}

fn is_seq_scan_on_outbox(node: &Value) -> bool {
    node["Node Type"].as_str() == Some("Seq Scan")
        && node["Relation Name"].as_str() == Some("outbox_events")
}

/// Shared buffers touched (hit + read) by the statements, from the
/// top-level node of each (which includes its children and subplans).
fn shared_blocks(plans: &[Value]) -> u64 {
    plans
        .iter()
        .map(|plan| {
            let top = top(plan);
            let field = |name: &str| {
                top[name]
                    .as_u64()
                    .unwrap_or_else(|| panic!("no {name:?} in {top}"))
            };
            field("Shared Hit Blocks") + field("Shared Read Blocks")
        })
        .sum()
}

/// One line per statement: its nodes and what each touched.
fn summary(plan: &Value) -> String {
    nodes(top(plan))
        .iter()
        .map(|n| {
            format!(
                "{}{} [{} hit, {} read]",
                n["Node Type"].as_str().unwrap_or("?"),
                n["Index Name"]
                    .as_str()
                    .map(|i| format!(" using {i}"))
                    .unwrap_or_default(),
                n["Shared Hit Blocks"],
                n["Shared Read Blocks"],
            )
        })
        .collect::<Vec<_>>()
        .join(" > ")
}

async fn explain(db: &TestDb, order: DeliveryOrder) -> Vec<Value> {
    let store = db.store();
    store.set_delivery_order(order).await.unwrap();
    // Once to warm the caches; the figures compared are of the second run.
    store.explain_claim(CLAIM).await.unwrap();
    // The ordered and the unordered claim are one statement each.
    vec![store.explain_claim(CLAIM).await.unwrap()]
}

fn check(order: DeliveryOrder, big: &[Value], small: &[Value]) {
    // The window (ordered) or the single locking select (unordered) walks
    // the partial index of unsent rows.
    let first = nodes(top(&big[0]));
    assert!(
        first.iter().any(|n| is_index_scan_on_unsent(n)),
        "{order:?}: no index scan on outbox_events_pending in {}",
        big[0]
    );
    for plan in big {
        assert!(
            !nodes(top(plan)).iter().any(|n| is_seq_scan_on_outbox(n)),
            "{order:?}: sequential scan of outbox_events in {plan}"
        );
    }
    let with_sent = shared_blocks(big);
    let backlog_only = shared_blocks(small);
    for (name, plans) in [("with sent rows", big), ("backlog only", small)] {
        for plan in plans {
            println!("{order:?}, {name}: {}", summary(plan));
        }
    }
    println!(
        "{order:?}: claim of {CLAIM} touches {with_sent} shared buffers with {SENT_ROWS} sent rows, \
         {backlog_only} with the backlog only"
    );
    assert!(
        with_sent as f64 <= 1.5 * backlog_only as f64 + 20.0,
        "{order:?}: {with_sent} buffers with sent rows vs {backlog_only} without\n\
         with sent rows: {big:#?}\nbacklog only: {small:#?}"
    );
}

#[tokio::test]
async fn claim_cost_does_not_grow_with_sent_rows() {
    let started = Instant::now();
    let big = TestDb::new("scale_big").await;
    big.execute(&format!(
        "INSERT INTO {{schema}}.outbox_events (id, aggregate_type, aggregate_id, event_type, \
         schema_version, payload, occurred_at, status, published_at) \
         SELECT gen_random_uuid(), 'piece', (g % 1000)::text, 'piece.moved', 1, '{{}}', now(), \
         'sent', now() FROM generate_series(1, {SENT_ROWS}) g"
    ));
    record_backlog_and_vacuum(&big).await;
    assert_eq!(
        big.count("outbox_events", "WHERE status = 'sent'"),
        i64::from(SENT_ROWS)
    );
    let small = TestDb::new("scale_small").await;
    record_backlog_and_vacuum(&small).await;
    assert_eq!(small.count("outbox_events", ""), i64::from(PENDING_ROWS));
    println!("setup took {:?}", started.elapsed());

    for order in [DeliveryOrder::PerAggregate, DeliveryOrder::Unordered] {
        let with_sent = explain(&big, order).await;
        let backlog_only = explain(&small, order).await;
        check(order, &with_sent, &backlog_only);
    }
    // explain_claim rolled back: the backlog is still there, unclaimed.
    assert_eq!(
        big.count("outbox_events", "WHERE status = 'pending'"),
        i64::from(PENDING_ROWS)
    );
    println!("test took {:?}", started.elapsed());
}

/// A claim never JIT-compiles, whatever the server's JIT thresholds: its
/// cost estimate grows with the table, and a compilation (0.1–3 s with a
/// large backlog) costs far more than the claim's bounded index scans.
#[tokio::test]
async fn a_claim_runs_without_jit_even_where_every_query_would_be_compiled() {
    let db = TestDb::new("scale_jit").await;
    record(&db, &[("a".into(), 1), ("b".into(), 2)]).await;
    let separator = if db.url.contains('?') { '&' } else { '?' };
    // With these thresholds at 0, JIT compiles every statement it may.
    let url = format!(
        "{}{separator}options=-c%20jit_above_cost%3D0%20-c%20jit_inline_above_cost%3D0",
        db.url
    );
    let mut conn = diesel_async::AsyncPgConnection::establish(&url)
        .await
        .unwrap();
    #[derive(diesel::QueryableByName)]
    struct Plan {
        #[diesel(sql_type = diesel::sql_types::Json)]
        #[diesel(column_name = "QUERY PLAN")]
        plan: Value,
    }
    use diesel_async::RunQueryDsl;
    let plain: Plan =
        diesel::sql_query("EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM pg_class")
            .get_result(&mut conn)
            .await
            .unwrap();
    if !plain.plan.to_string().contains("\"JIT\"") {
        panic!(
            "this PostgreSQL does not JIT-compile even with jit_above_cost = 0 (jit = off, or \
             no LLVM: pg_jit_available()); the test cannot show that a claim turns it off: {}",
            plain.plan
        );
    }
    let pool = outbox_diesel::pool(&url, 2).unwrap();
    let store = outbox_diesel::PgOutboxStore::builder(pool)
        .schema(&db.schema)
        .build()
        .unwrap();
    for order in [DeliveryOrder::PerAggregate, DeliveryOrder::Unordered] {
        store.set_delivery_order(order).await.unwrap();
        let plan = store.explain_claim(CLAIM).await.unwrap();
        assert!(
            !plan.to_string().contains("\"JIT\""),
            "{order:?}: the claim was JIT-compiled: {plan:#}"
        );
    }
}
