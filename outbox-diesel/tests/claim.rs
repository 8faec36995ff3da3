//! The relay store: concurrent claims, crash recovery, per-aggregate order,
//! dead events, stats and purge, against the real PostgreSQL.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use common::{PgFixture, TestDb, moved, record, seq_of, seqs_of};
use diesel_async::AsyncConnection as _;
use outbox_core::testing::{RecordingPublisher, wakeup_driven};
use outbox_core::testing::{conformance, fail_claimed};
use outbox_core::{
    Claim, DeadSelector, DeliveryOrder, EventStatus, FailedAttempt, NextStep, OutboxStore,
    PublishOutcome, Relay, RetryPolicy,
};
use outbox_diesel::{Error, PgOutboxStore};
use uuid::Uuid;

fn interleaved(aggregates: usize, per_aggregate: usize) -> Vec<(String, u32)> {
    (0..per_aggregate)
        .flat_map(|n| (0..aggregates).map(move |a| (format!("agg-{a}"), n as u32)))
        .collect()
}

fn ids_of(claim: &impl Claim) -> Vec<Uuid> {
    claim.records().iter().map(|r| r.id()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_concurrent_claimers_take_each_event_exactly_once() {
    let db = TestDb::new("claim_concurrent").await;
    let ids = record(&db, &interleaved(500, 10)).await;
    assert_eq!(ids.len(), 5000);
    let claimed: Arc<Mutex<HashMap<Uuid, usize>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let store = db.store();
        let claimed = Arc::clone(&claimed);
        tasks.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                if claimed.lock().unwrap().len() == 5000 {
                    return;
                }
                assert!(Instant::now() < deadline, "claimers did not finish");
                let Some(mut claim) = store.claim(100).await.unwrap() else {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                };
                let ids = ids_of(&claim);
                {
                    let mut claimed = claimed.lock().unwrap();
                    for id in &ids {
                        *claimed.entry(*id).or_default() += 1;
                    }
                }
                claim.mark_sent(&seqs_of(&claim, &ids)).await.unwrap();
                claim.finish().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let claimed = claimed.lock().unwrap();
    assert_eq!(claimed.len(), 5000, "none left behind");
    assert!(
        claimed.values().all(|n| *n == 1),
        "an event was claimed twice"
    );
    assert_eq!(db.count("outbox_events", "WHERE status = 'sent'"), 5000);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_held_claim_does_not_make_other_claimers_wait() {
    for order in [DeliveryOrder::PerAggregate, DeliveryOrder::Unordered] {
        let db = TestDb::new("claim_no_wait").await;
        record(&db, &interleaved(100, 2)).await;
        let store = db.store();
        store.set_delivery_order(order).await.unwrap();
        let held = store.claim(50).await.unwrap().unwrap();
        let other = tokio::time::timeout(Duration::from_secs(2), store.claim(50))
            .await
            .expect("the second claim must not wait for the first")
            .unwrap()
            .expect("other rows are claimable");
        let a: HashSet<Uuid> = ids_of(&held).into_iter().collect();
        let b: HashSet<Uuid> = ids_of(&other).into_iter().collect();
        assert!(a.is_disjoint(&b), "{order:?}: the same event claimed twice");
        assert_eq!(b.len(), 50, "{order:?}");
        if order == DeliveryOrder::PerAggregate {
            let aggregates = |c: &outbox_diesel::PgClaim| -> HashSet<String> {
                c.records()
                    .iter()
                    .map(|r| r.envelope.aggregate_id.clone())
                    .collect()
            };
            assert!(
                aggregates(&held).is_disjoint(&aggregates(&other)),
                "two claimers must never share an aggregate"
            );
        }
        held.finish().await.unwrap();
        other.finish().await.unwrap();
    }
}

/// pid of the session holding an open claim in this schema.
async fn claiming_backend(db: &TestDb) -> i32 {
    #[derive(diesel::QueryableByName)]
    struct Pid {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        pid: i32,
    }
    use diesel::RunQueryDsl;
    // The claim statement is longer than `track_activity_query_size`
    // shows; its start names the schema.
    let sql = format!(
        "SELECT pid FROM pg_stat_activity WHERE state = 'idle in transaction' \
         AND query LIKE 'WITH pause AS%' AND query LIKE '%\"{}\"%'",
        db.schema
    );
    let pids: Vec<Pid> = diesel::sql_query(sql).load(&mut db.sync_conn()).unwrap();
    assert_eq!(pids.len(), 1, "exactly one claiming session");
    pids[0].pid
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claimer_killed_mid_claim_loses_nothing() {
    let db = TestDb::new("claim_killed").await;
    record(&db, &interleaved(5, 4)).await;
    let store = db.store();
    let mut dying = store.claim(100).await.unwrap().unwrap();
    let held = ids_of(&dying);
    assert_eq!(held.len(), 20);
    let pid = claiming_backend(&db).await;
    db.execute(&format!("SELECT pg_terminate_backend({pid})"));

    let again = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let Some(claim) = store.claim(100).await.unwrap() {
                return claim;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the killed claimer's events are claimable again");
    assert_eq!(ids_of(&again), held, "same events, same order");
    // The dead claimer cannot mark anything any more.
    assert!(dying.mark_sent(&seqs_of(&dying, &held)).await.is_err());
    again.finish().await.unwrap();
    assert_eq!(db.count("outbox_events", "WHERE status = 'sent'"), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hung_claimer_is_released_after_the_claim_timeout() {
    let db = TestDb::new("claim_hung").await;
    record(&db, &interleaved(3, 2)).await;
    let store = PgOutboxStore::builder(db.pool.clone())
        .schema(&db.schema)
        .claim_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let hung = store.claim(100).await.unwrap().unwrap();
    let held = ids_of(&hung);
    let started = Instant::now();
    assert!(
        store.claim(100).await.unwrap().is_none(),
        "held rows are not claimable"
    );
    let again = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(claim) = store.claim(100).await.unwrap() {
                return claim;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("released within the claim timeout");
    assert!(started.elapsed() >= Duration::from_millis(900));
    assert_eq!(ids_of(&again), held);
    assert!(
        hung.finish().await.is_err(),
        "the hung claim lost its session"
    );
    again.finish().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_relays_with_random_failures_keep_per_aggregate_order() {
    let db = TestDb::new("claim_order_relays").await;
    let events = interleaved(50, 20);
    let ids = record(&db, &events).await;
    let mut recorded: HashMap<String, Vec<Uuid>> = HashMap::new();
    for ((aggregate, _), id) in events.iter().zip(&ids) {
        recorded.entry(aggregate.clone()).or_default().push(*id);
    }
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let publisher = RecordingPublisher::with_behaviour(move |_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        if state.is_multiple_of(10) {
            PublishOutcome::rejected("nack")
        } else {
            PublishOutcome::Acked
        }
    });
    let mut handles = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let relay = Relay::builder(db.store(), publisher.clone())
            .batch_size(25)
            .poll_interval(Duration::from_millis(10))
            .retry(
                RetryPolicy::default()
                    .base_delay(Duration::ZERO)
                    .max_delay(Duration::ZERO)
                    .max_attempts(1000),
            )
            .build()
            .unwrap();
        handles.push(relay.handle());
        tasks.push(tokio::spawn(relay.run()));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while db.count("outbox_events", "WHERE status = 'sent'") < 1000 {
        assert!(Instant::now() < deadline, "relays did not drain the outbox");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for handle in &handles {
        handle.shutdown();
    }
    for task in tasks {
        task.await.unwrap();
    }
    let acked = publisher.published_ids();
    assert_eq!(acked.len(), 1000, "each event acked once");
    let rejected = publisher
        .attempts()
        .iter()
        .filter(|a| a.outcome != PublishOutcome::Acked)
        .count();
    assert!(rejected > 0, "the test injected failures");
    for (aggregate, ids) in &recorded {
        let order: Vec<Uuid> = acked
            .iter()
            .copied()
            .filter(|id| ids.contains(id))
            .collect();
        assert_eq!(&order, ids, "order broken for {aggregate}");
    }
}

#[tokio::test]
async fn dead_event_blocks_only_its_aggregate_until_replayed_or_skipped() {
    let db = TestDb::new("claim_dead").await;
    let ids = record(
        &db,
        &[
            ("a".into(), 0),
            ("b".into(), 0),
            ("a".into(), 1),
            ("b".into(), 1),
            ("a".into(), 2),
        ],
    )
    .await;
    let (a0, b0, a1, b1, a2) = (ids[0], ids[1], ids[2], ids[3], ids[4]);
    let store = db.store();

    // a0 dies, b0 waits for a retry an hour away; the rest is released.
    let mut claim = store.claim(100).await.unwrap().unwrap();
    assert_eq!(ids_of(&claim), ids, "the head holder takes the followers");
    claim
        .mark_failed(&[
            FailedAttempt::new(seq_of(&claim, a0), 3, "NO_ROUTE", NextStep::Dead),
            FailedAttempt::new(
                seq_of(&claim, b0),
                1,
                "nack",
                NextStep::RetryAt(Utc::now() + chrono::Duration::hours(1)),
            ),
        ])
        .await
        .unwrap();
    claim.finish().await.unwrap();
    assert!(
        store.claim(100).await.unwrap().is_none(),
        "both aggregates are blocked"
    );
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.dead, 1);
    assert_eq!(stats.backlog, 4);
    assert_eq!(stats.blocked_aggregates, 2);

    // A new aggregate is not held back by them.
    let c0 = record(&db, &[("c".into(), 0)]).await[0];
    let claim = store.claim(100).await.unwrap().unwrap();
    assert_eq!(ids_of(&claim), [c0]);
    claim.finish().await.unwrap();

    // Replay a: a0, a1, a2 come back in their original order.
    assert_eq!(store.replay_dead(DeadSelector::Id(a0)).await.unwrap(), 1);
    let claim = store.claim(100).await.unwrap().unwrap();
    assert_eq!(ids_of(&claim), [a0, a1, a2, c0]);
    assert_eq!(claim.records()[0].attempts, 0, "replay resets attempts");
    assert_eq!(claim.records()[0].status, EventStatus::Pending);
    claim.finish().await.unwrap();

    // Kill b0 too, then skip it: b1 is unblocked.
    db.execute(&format!(
        "UPDATE {{schema}}.outbox_events SET status = 'dead' WHERE id = '{b0}'"
    ));
    assert!(store.skip_dead(b0).await.unwrap());
    assert!(
        !store.skip_dead(b0).await.unwrap(),
        "only dead events can be skipped"
    );
    let mut claim = store.claim(100).await.unwrap().unwrap();
    let claimed = ids_of(&claim);
    assert!(
        claimed.contains(&b1) && !claimed.contains(&b0),
        "{claimed:?}"
    );
    claim.mark_sent(&seqs_of(&claim, &claimed)).await.unwrap();
    claim.finish().await.unwrap();
    assert_eq!(db.count("outbox_events", "WHERE status = 'skipped'"), 1);
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.dead, stats.blocked_aggregates), (0, 0));
}

#[tokio::test]
async fn an_event_waiting_for_a_retry_holds_back_the_later_events_of_its_aggregate() {
    // Left by unordered delivery (switched to ordered since): a1 failed and
    // waits for a retry while a0, before it, was never attempted.
    let db = TestDb::new("claim_mid_block").await;
    let ids = record(
        &db,
        &[
            ("a".into(), 0),
            ("a".into(), 1),
            ("b".into(), 0),
            ("a".into(), 2),
        ],
    )
    .await;
    let (a0, a1, b0, a2) = (ids[0], ids[1], ids[2], ids[3]);
    db.execute(&format!(
        "UPDATE {{schema}}.outbox_events SET status = 'retry', attempts = 1, \
         next_attempt_at = now() + interval '1 hour' WHERE id = '{a1}'"
    ));
    let store = db.store();
    let mut claim = store.claim(100).await.unwrap().unwrap();
    assert_eq!(
        ids_of(&claim),
        [a0, b0],
        "a2 must wait for a1, which waits for its retry"
    );
    claim.mark_sent(&seqs_of(&claim, &[a0, b0])).await.unwrap();
    claim.finish().await.unwrap();
    assert!(store.claim(100).await.unwrap().is_none());
    assert_eq!(
        db.count(
            "outbox_events",
            &format!("WHERE id = '{a2}' AND status = 'held'")
        ),
        1,
        "the claim that saw a2 behind a1 held it"
    );

    // Once a1 is due, it goes; once it is sent, a2 is released and goes.
    db.execute(&format!(
        "UPDATE {{schema}}.outbox_events SET next_attempt_at = now() WHERE id = '{a1}'"
    ));
    let mut claim = store.claim(100).await.unwrap().unwrap();
    assert_eq!(ids_of(&claim), [a1]);
    claim.mark_sent(&seqs_of(&claim, &[a1])).await.unwrap();
    claim.finish().await.unwrap();
    let claim = store.claim(100).await.unwrap().unwrap();
    assert_eq!(ids_of(&claim), [a2]);
}

#[tokio::test]
async fn a_due_retry_is_claimed_again_with_its_attempts() {
    let db = TestDb::new("claim_retry_due").await;
    let ids = record(&db, &[("a".into(), 0), ("a".into(), 1)]).await;
    let store = db.store();
    fail_claimed(&store, &[ids[0]], 1, NextStep::RetryAt(Utc::now()), |_| {
        "nack".into()
    })
    .await
    .unwrap();
    assert_eq!(
        db.count("outbox_events", "WHERE status = 'held'"),
        1,
        "the event behind the failed one is held"
    );
    let mut claim = store.claim(10).await.unwrap().unwrap();
    assert_eq!(ids_of(&claim), [ids[0]]);
    let head = &claim.records()[0];
    assert_eq!(head.status, EventStatus::Retry);
    assert_eq!(head.attempts, 1);
    assert_eq!(head.last_error.as_deref(), Some("nack"));
    claim.mark_sent(&[seq_of(&claim, ids[0])]).await.unwrap();
    claim.finish().await.unwrap();
    let claim = store.claim(10).await.unwrap().unwrap();
    assert_eq!(ids_of(&claim), [ids[1]], "released once the retry was sent");
    assert_eq!(claim.records()[0].status, EventStatus::Pending);
}

#[tokio::test]
async fn dropping_a_claim_releases_it_and_marks_need_the_claim() {
    let db = TestDb::new("claim_drop").await;
    let ids = record(&db, &[("a".into(), 0), ("b".into(), 0)]).await;
    let store = db.store();
    let mut claim = store.claim(10).await.unwrap().unwrap();
    claim.mark_sent(&seqs_of(&claim, &ids)).await.unwrap();
    drop(claim); // never finished: the marks roll back
    let claim = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let Some(claim) = store.claim(10).await.unwrap() {
                return claim;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("released at once");
    assert_eq!(ids_of(&claim), ids);
    let mut claim = claim;
    let stranger = claim.records().iter().map(|r| r.seq).max().unwrap() + 1_000;
    assert!(
        matches!(
            claim.mark_sent(&[stranger]).await,
            Err(Error::NotInClaim { seq }) if seq == stranger
        ),
        "fenced to the claim's events"
    );
}

/// A seq of another relay's claim is refused with `NotInClaim` by every
/// mark, in a call with the claim's own seqs too, and that call marks
/// nothing: neither the other claim's row nor the claim's own.
#[tokio::test]
async fn marking_a_seq_not_in_the_claim_fails_with_not_in_claim_and_changes_nothing() {
    let fixture = PgFixture::new("claim_not_in_claim").await;
    conformance::marks_refuse_seqs_not_in_the_claim(&fixture)
        .await
        .unwrap();
    let message = Error::NotInClaim { seq: 1_234 }.to_string();
    assert!(message.contains("1234"), "{message}");
}

/// A seq named twice in one mark call is refused with `DuplicateSeq`
/// before any statement runs, and nothing of the call is marked.
#[tokio::test]
async fn marking_a_seq_twice_in_one_call_fails_with_duplicate_seq_and_changes_nothing() {
    let fixture = PgFixture::new("claim_duplicate_seq").await;
    conformance::marks_refuse_a_seq_named_twice(&fixture)
        .await
        .unwrap();
}

/// The store contract of per-aggregate order with a dead (or waiting)
/// head, replay and skip, as the in-memory store keeps it.
#[tokio::test]
async fn a_dead_event_holds_back_only_its_aggregate_as_the_store_contract_says() {
    let fixture = PgFixture::new("claim_contract_dead").await;
    conformance::a_dead_event_holds_back_only_its_aggregate(&fixture)
        .await
        .unwrap();
}

#[tokio::test]
async fn purge_deletes_old_sent_rows_in_chunks_and_keeps_dead_ones() {
    let db = TestDb::new("claim_purge").await;
    record(&db, &interleaved(10, 3)).await;
    db.execute(
        "UPDATE {schema}.outbox_events SET status = 'sent', published_at = now() - interval '2 days' \
         WHERE seq <= 25",
    );
    db.execute("UPDATE {schema}.outbox_events SET status = 'dead' WHERE seq IN (26, 27)");
    let store = db.store();
    let cutoff = Utc::now() - chrono::Duration::days(1);
    assert_eq!(store.purge_sent(cutoff, 10).await.unwrap(), 10);
    assert_eq!(store.purge_sent(cutoff, 10).await.unwrap(), 10);
    assert_eq!(store.purge_sent(cutoff, 10).await.unwrap(), 5);
    assert_eq!(store.purge_sent(cutoff, 10).await.unwrap(), 0);
    assert_eq!(db.count("outbox_events", ""), 5);
    assert_eq!(db.count("outbox_events", "WHERE status = 'dead'"), 2);
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.backlog, 3);
    assert!(stats.oldest_unsent_age.is_some());
}

#[tokio::test]
async fn replay_by_aggregate_and_all_keeps_sequence_order() {
    let db = TestDb::new("claim_replay_sel").await;
    let ids = record(
        &db,
        &[
            ("a".into(), 0),
            ("b".into(), 0),
            ("a".into(), 1),
            ("c".into(), 0),
        ],
    )
    .await;
    db.execute("UPDATE {schema}.outbox_events SET status = 'dead', attempts = 10");
    let store = db.store();
    assert!(store.claim(10).await.unwrap().is_none());
    let replayed = store
        .replay_dead(DeadSelector::Aggregate {
            aggregate_type: "piece".into(),
            aggregate_id: "a".into(),
        })
        .await
        .unwrap();
    assert_eq!(replayed, 2);
    let claim = store.claim(10).await.unwrap().unwrap();
    assert_eq!(ids_of(&claim), [ids[0], ids[2]]);
    claim.finish().await.unwrap();
    assert_eq!(store.replay_dead(DeadSelector::All).await.unwrap(), 2);
    let claim = store.claim(10).await.unwrap().unwrap();
    assert_eq!(ids_of(&claim), ids, "every event back, in seq order");
    assert!(claim.records().iter().all(|r| r.attempts == 0));
}

#[tokio::test]
async fn keep_sent_false_deletes_confirmed_events_only() {
    let db = TestDb::new("claim_delete_sent").await;
    let ids = record(&db, &[("a".into(), 0), ("b".into(), 0)]).await;
    let store = PgOutboxStore::builder(db.pool.clone())
        .schema(&db.schema)
        .keep_sent(false)
        .build()
        .unwrap();
    let mut claim = store.claim(10).await.unwrap().unwrap();
    claim.mark_sent(&seqs_of(&claim, &ids[..1])).await.unwrap();
    claim
        .mark_failed(&[FailedAttempt::new(
            seq_of(&claim, ids[1]),
            1,
            "nack",
            NextStep::Dead,
        )])
        .await
        .unwrap();
    claim.finish().await.unwrap();
    assert_eq!(db.count("outbox_events", ""), 1, "the sent event is gone");
    assert_eq!(
        db.count("outbox_events", "WHERE status = 'dead'"),
        1,
        "the dead one is kept"
    );
}

#[tokio::test]
async fn recording_claiming_and_marking_work_without_prepared_statements() {
    // What a deployment behind an old PgBouncer in transaction mode runs:
    // every statement unnamed, prepared anew each time.
    let db = TestDb::new("claim_unprepared").await;
    let outbox = db.outbox.clone().prepared_statements(false);
    let mut conn = db.conn().await;
    // (diesel-async prepares a statement of its own when connecting.)
    let baseline = prepared_statements(&mut conn).await;
    let ids = conn
        .transaction::<_, Error, _>(async |conn| {
            let one = outbox.record(conn, &moved("a", 0)).await?;
            let more = outbox
                .record_all(conn, &[moved("a", 1), moved("b", 0)])
                .await?;
            Ok([vec![one], more].concat())
        })
        .await
        .unwrap();
    // Nothing stays prepared on the connection; by default the INSERT does.
    assert_eq!(prepared_statements(&mut conn).await, baseline);
    conn.transaction::<_, Error, _>(async |conn| db.outbox.record(conn, &moved("c", 0)).await)
        .await
        .unwrap();
    assert_eq!(prepared_statements(&mut conn).await, baseline + 1);
    db.execute("DELETE FROM {schema}.outbox_events WHERE aggregate_id = 'c'");
    for order in [DeliveryOrder::PerAggregate, DeliveryOrder::Unordered] {
        let store = PgOutboxStore::builder(db.pool.clone())
            .schema(&db.schema)
            .prepared_statements(false)
            .build()
            .unwrap();
        store.set_delivery_order(order).await.unwrap();
        let claim = store.claim(10).await.unwrap().unwrap();
        assert_eq!(ids_of(&claim), ids, "{order:?}");
        claim.finish().await.unwrap();
    }
    let store = PgOutboxStore::builder(db.pool.clone())
        .schema(&db.schema)
        .prepared_statements(false)
        .build()
        .unwrap();
    let mut claim = store.claim(10).await.unwrap().unwrap();
    claim.mark_sent(&seqs_of(&claim, &ids)).await.unwrap();
    claim.finish().await.unwrap();
    assert_eq!(db.count("outbox_events", "WHERE status = 'sent'"), 3);
    assert_eq!(store.stats().await.unwrap().backlog, 0);
    // Every connection of the pool (all idle now): none kept a statement.
    let mut pooled = Vec::new();
    for _ in 0..db.pool.status().size {
        pooled.push(db.pool.get().await.unwrap());
    }
    assert!(!pooled.is_empty());
    for conn in &mut pooled {
        assert_eq!(prepared_statements(conn).await, baseline);
    }
}

/// How many statements are prepared on `conn`'s session.
async fn prepared_statements(conn: &mut diesel_async::AsyncPgConnection) -> i64 {
    outbox_testkit::pg::count(conn, "SELECT count(*) AS n FROM pg_prepared_statements").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_event_queued_behind_a_batch_in_flight_goes_as_soon_as_that_batch_ends() {
    // a0 is being published (slowly) when a1 commits; the loop woken for
    // a1 finds a0 held and a1 behind it, so it can take nothing. When a0's
    // batch ends, a1 must go at once, not at the next poll (an hour here).
    let db = TestDb::new("claim_follow").await;
    let a0 = record(&db, &[("a".into(), 0)]).await[0];
    // Publishes taking 400 ms for a0.
    let publisher = RecordingPublisher::new();
    publisher.set_delay(move |events| {
        if events.iter().any(|e| e.id == a0) {
            Duration::from_millis(400)
        } else {
            Duration::ZERO
        }
    });
    let relay = wakeup_driven(db.store(), publisher.clone())
        .concurrency(2)
        .build()
        .unwrap();
    let handle = relay.handle();
    // The relay's first claims on start take a0 (one loop) and nothing
    // (the other, which then waits).
    let task = tokio::spawn(relay.run());
    tokio::time::sleep(Duration::from_millis(150)).await;
    let a1 = record(&db, &[("a".into(), 1)]).await[0];
    handle.notify();
    tokio::time::timeout(Duration::from_secs(5), publisher.wait_for(2))
        .await
        .expect("a1 was published once a0's batch ended");
    assert_eq!(publisher.published_ids(), [a0, a1]);
    handle.shutdown();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mark_suspect_counts_in_the_row_and_every_claim_sees_it() {
    let db = TestDb::new("claim_suspect").await;
    let ids = record(&db, &[("a".into(), 0), ("a".into(), 1), ("b".into(), 0)]).await;
    let (a0, a1, b0) = (ids[0], ids[1], ids[2]);
    let store = db.store();

    // Twice in flight when the connection died: counted, nothing else.
    for round in 1..=2 {
        let mut claim = store.claim(100).await.unwrap().unwrap();
        assert_eq!(ids_of(&claim), ids);
        claim
            .mark_suspect(
                &seqs_of(&claim, &[a0, b0]),
                &format!("connection died ({round})"),
            )
            .await
            .unwrap();
        claim.finish().await.unwrap();
    }
    let claim = store.claim(100).await.unwrap().unwrap();
    let counts: Vec<(Uuid, u32, EventStatus, u32, Option<String>)> = claim
        .records()
        .iter()
        .map(|r| {
            (
                r.id(),
                r.suspect_count,
                r.status,
                r.attempts,
                r.last_error.clone(),
            )
        })
        .collect();
    assert_eq!(
        counts,
        [
            (
                a0,
                2,
                EventStatus::Pending,
                0,
                Some("connection died (2)".into())
            ),
            (a1, 0, EventStatus::Pending, 0, None),
            (
                b0,
                2,
                EventStatus::Pending,
                0,
                Some("connection died (2)".into())
            ),
        ],
        "suspect_count + 1 and the reason, status and attempts unchanged"
    );
    // Dropped without finish: released, unmarked.
    drop(claim);

    // Parked dead, then replayed: the count starts again.
    let mut claim = store.claim(100).await.unwrap().unwrap();
    claim
        .mark_suspect(&seqs_of(&claim, &[a0]), "died alone")
        .await
        .unwrap();
    claim
        .mark_failed(&[FailedAttempt::new(
            seq_of(&claim, a0),
            0,
            "the connection died 3 times",
            NextStep::Dead,
        )])
        .await
        .unwrap();
    claim.finish().await.unwrap();
    assert_eq!(
        db.count(
            "outbox_events",
            &format!("WHERE id = '{a0}' AND status = 'dead' AND suspect_count = 3")
        ),
        1
    );
    assert_eq!(
        db.count(
            "outbox_events",
            &format!("WHERE id = '{a1}' AND status = 'held'")
        ),
        1,
        "its follower is held"
    );
    assert_eq!(store.replay_dead(DeadSelector::Id(a0)).await.unwrap(), 1);
    let claim = store.claim(100).await.unwrap().unwrap();
    let a0_again = claim.records().iter().find(|r| r.id() == a0).unwrap();
    assert_eq!(
        a0_again.suspect_count, 1,
        "replay lowers the suspect count to 1: published alone first"
    );
    claim.finish().await.unwrap();
}

/// A delivery order this version does not know (written by a newer one, its
/// CHECK constraint widened) stops the claim with `UnknownDeliveryOrder`
/// naming the value and the schema: the relay never guesses an order.
#[tokio::test]
async fn an_unknown_delivery_order_in_the_table_is_a_clear_error_not_a_guess() {
    let db = TestDb::new("claim_unknown_order").await;
    record(&db, &[("a".to_owned(), 1)]).await;
    db.execute(
        "ALTER TABLE {schema}.outbox_settings \
         DROP CONSTRAINT outbox_settings_delivery_order_check",
    );
    db.execute("UPDATE {schema}.outbox_settings SET delivery_order = 'by_partition'");
    let store = db.store();
    let err = match store.claim(10).await {
        Err(err) => err,
        Ok(claimed) => panic!(
            "a claim under an unknown order must fail, got {:?}",
            claimed.map(|c| c.records().len())
        ),
    };
    assert!(
        matches!(&err, Error::UnknownDeliveryOrder { value, .. } if value == "by_partition"),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("by_partition") && message.contains(&db.schema),
        "{message}"
    );
    assert!(matches!(
        store.delivery_order().await,
        Err(Error::UnknownDeliveryOrder { .. })
    ));
}
