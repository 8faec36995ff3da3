//! Upgrading an outbox in use: migration 2 applied to a table of 1,000,000
//! rows while a producer records and a relay of the earlier version claims,
//! with no writer blocked for long; then the new relay delivers what the old
//! table held, in order, including the events an earlier version left
//! pending behind dead ones. Against the real PostgreSQL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{TestDb, moved};
use diesel_async::{AsyncConnection as _, SimpleAsyncConnection};
use outbox_core::Relay;
use outbox_core::testing::RecordingPublisher;
use outbox_diesel::Error;

/// How long a writer may wait during the migration: its lock waits are
/// bounded by the migration's `lock_timeout` (5 s), with a margin for a
/// machine that is busy building indexes.
const LONGEST_ACCEPTABLE_WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrating_a_million_rows_in_use_blocks_no_writer_for_long() {
    let db = TestDb::at_version_1("upgrade_million").await;
    // 1,000,000 rows: sent ones kept for audit, 100 dead events with 20
    // pending behind each (as the earlier version left them), and 2,000
    // pending events of healthy aggregates.
    db.execute(
        "INSERT INTO {schema}.outbox_events (id, aggregate_type, aggregate_id, event_type, \
         schema_version, payload, occurred_at, status, published_at) \
         SELECT gen_random_uuid(), 'piece', 'old-' || (g % 5000), 'piece.moved', 1, '{}', \
           now(), 'sent', now() FROM generate_series(1, 995900) g",
    );
    db.execute(
        "INSERT INTO {schema}.outbox_events (id, aggregate_type, aggregate_id, event_type, \
         schema_version, payload, occurred_at, status, attempts) \
         SELECT gen_random_uuid(), 'piece', 'dead-' || (g % 100), 'piece.moved', 1, '{}', now(), \
           CASE WHEN g < 100 THEN 'dead' ELSE 'pending' END, CASE WHEN g < 100 THEN 10 ELSE 0 END \
         FROM generate_series(0, 2099) g",
    );
    db.execute(
        "INSERT INTO {schema}.outbox_events (id, aggregate_type, aggregate_id, event_type, \
         schema_version, payload, occurred_at) \
         SELECT gen_random_uuid(), 'piece', 'ok-' || (g % 100), 'piece.moved', 1, '{}', now() \
         FROM generate_series(1, 2000) g",
    );
    db.execute("VACUUM ANALYZE {schema}.outbox_events");
    assert_eq!(db.count("outbox_events", ""), 1_000_000);

    let stop = Arc::new(AtomicBool::new(false));
    // A producer recording all along, timing each transaction.
    let producer = {
        let stop = Arc::clone(&stop);
        let outbox = db.outbox.clone();
        let mut conn = db.conn().await;
        tokio::spawn(async move {
            let (mut n, mut longest) = (0u32, Duration::ZERO);
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                conn.transaction::<_, Error, _>(async |conn| {
                    outbox.record(conn, &moved("live", n)).await.map(drop)
                })
                .await
                .unwrap();
                longest = longest.max(started.elapsed());
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (n, longest)
        })
    };
    // A relay of the earlier version: its claim takes row locks in
    // transactions that stay open while it publishes.
    let old_relay = {
        let stop = Arc::clone(&stop);
        let mut conn = db.conn().await;
        let table = format!("\"{}\".outbox_events", db.schema);
        tokio::spawn(async move {
            let (mut claims, mut longest) = (0u32, Duration::ZERO);
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                conn.batch_execute(&format!(
                    "BEGIN; \
                     SELECT seq FROM {table} WHERE status IN ('pending', 'retry') \
                       AND aggregate_id = 'live' ORDER BY seq LIMIT 10 FOR UPDATE SKIP LOCKED; \
                     SELECT pg_sleep(0.05); \
                     UPDATE {table} SET status = 'sent', published_at = now() WHERE seq IN ( \
                       SELECT seq FROM {table} WHERE status IN ('pending', 'retry') \
                       AND aggregate_id = 'live' ORDER BY seq LIMIT 10); \
                     COMMIT"
                ))
                .await
                .unwrap();
                longest = longest.max(started.elapsed());
                claims += 1;
            }
            (claims, longest)
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;

    let started = Instant::now();
    let mut conn = db.conn().await;
    let applied = outbox_diesel::migrate(&mut conn, &db.schema).await.unwrap();
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    let (recorded, producer_longest) = producer.await.unwrap();
    let (claims, relay_longest) = old_relay.await.unwrap();
    println!(
        "UPGRADE SUMMARY rows=1000000 migrate={took:.1?} producer_transactions={recorded} \
         producer_longest={producer_longest:.1?} old_relay_claims={claims} \
         old_relay_longest={relay_longest:.1?}"
    );
    assert_eq!(
        applied,
        vec![2, 4, 5],
        "expand only: the contract step waits"
    );
    assert!(recorded > 0 && claims > 0);
    assert!(
        producer_longest < LONGEST_ACCEPTABLE_WAIT,
        "a producer transaction took {producer_longest:?} during the migration"
    );
    assert!(
        relay_longest < LONGEST_ACCEPTABLE_WAIT,
        "an old relay's claim took {relay_longest:?} during the migration"
    );
    assert_eq!(db.count("outbox_events", "WHERE status = 'held'"), 0);

    // The new relay delivers every healthy pending event, in order, and
    // holds what waits behind the dead ones.
    let publisher = RecordingPublisher::new();
    let relay = Relay::builder(db.store(), publisher.clone())
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    let pending_healthy = db.count(
        "outbox_events",
        "WHERE status = 'pending' AND aggregate_id NOT LIKE 'dead-%'",
    );
    tokio::time::timeout(
        Duration::from_secs(60),
        publisher.wait_for(usize::try_from(pending_healthy).unwrap()),
    )
    .await
    .expect("the new relay delivers the healthy backlog");
    handle.shutdown();
    task.await.unwrap();
    let mut last: HashMap<String, i64> = HashMap::new();
    for envelope in publisher.published() {
        assert!(!envelope.aggregate_id.starts_with("dead-"));
        // The producer's events carry their number as the aggregate version.
        if let Some(version) = envelope.aggregate_version
            && let Some(previous) = last.insert(envelope.aggregate_id.clone(), version)
        {
            assert!(previous < version, "{} out of order", envelope.aggregate_id);
        }
    }
    assert_eq!(db.count("outbox_events", "WHERE status = 'held'"), 2_000);

    // Once no relay of the earlier version runs: the contract step.
    let contracted = outbox_diesel::migrate_contract(&mut conn, &db.schema)
        .await
        .unwrap();
    assert_eq!(contracted, vec![3]);
    assert!(
        outbox_diesel::migrate(&mut conn, &db.schema)
            .await
            .unwrap()
            .is_empty()
    );
}
