//! Held events under hostile interleavings and data (found by a review of
//! the `held` status): a due retry outside the claim's window, held events
//! whose head an earlier relay or an operator removed, retries waiting
//! behind dead events, over-long aggregate ids from other writers. Each
//! test failed on the first version of the `held` status. Against the real
//! PostgreSQL.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use chrono::{Duration, Utc};
use common::{TestDb, record, seqs_of};
use outbox_core::testing::fail_claimed;
use outbox_core::{Claim, DeliveryOrder, FailedAttempt, NextStep, OutboxStore};
use uuid::Uuid;

fn claimed(claim: &impl Claim) -> Vec<Uuid> {
    claim.records().iter().map(|r| r.id()).collect()
}

/// Finding 1 (order violation). The window's retries are the first
/// `window` due ones by `next_attempt_at`, not by `seq`: a due retry that
/// is not among them is missing from the window, and since a *due* retry
/// does not block in the probe, the pending event after it in its
/// aggregate is claimed first. Realistic after a broker outage: more than
/// 400 retries due at once, and an aggregate whose retry came due later
/// than the others gets a new event.
#[tokio::test]
async fn a_pending_event_is_not_claimed_before_a_due_retry_outside_the_window() {
    let db = TestDb::new("review_due_retry").await;
    let store = db.store();
    // a0 fails once; its retry is due.
    let a = record(&db, &[("a".into(), 0)]).await;
    fail_claimed(
        &store,
        &[a[0]],
        1,
        NextStep::RetryAt(Utc::now() - Duration::seconds(1)),
        |_| "nack".into(),
    )
    .await
    .unwrap();
    // a1 is recorded after a0's retry came due: nothing holds it.
    let a1 = record(&db, &[("a".into(), 1)]).await;
    // 400 retries of other aggregates (a default window: 4 x 100) came due
    // before a0's did.
    db.execute(
        "INSERT INTO {schema}.outbox_events (id, aggregate_type, aggregate_id, event_type, \
         schema_version, payload, occurred_at, status, attempts, next_attempt_at) \
         SELECT gen_random_uuid(), 'piece', 'other-' || g, 'piece.moved', 1, '{}', now(), \
           'retry', 1, now() - interval '10 seconds' \
         FROM generate_series(1, 400) g",
    );
    let claim = store.claim(100).await.unwrap().unwrap();
    let got = claimed(&claim);
    let a0_at = got.iter().position(|id| *id == a[0]);
    let a1_at = got.iter().position(|id| *id == a1[0]);
    let in_order = match (a0_at, a1_at) {
        (_, None) => true,
        (Some(x), Some(y)) => x < y,
        (None, Some(_)) => false,
    };
    assert!(
        in_order,
        "a1 was claimed while a0 (a due retry before it) was not: a1 would be published first"
    );
}

/// Finding 2 (order violation). Held events whose head left `retry` or
/// `dead` without a release (a relay of 0.1 still running during the
/// deploy marks its retry sent with its own SQL; an operator's manual
/// `UPDATE ... SET status = 'pending'`; a 0.1 replay tool) are only
/// repaired by `maintain`, later. Meanwhile the claim's gate skips the
/// held probe for that aggregate (it has no `retry` or `dead` row), so the
/// aggregate's next event is claimed before the held ones.
#[tokio::test]
async fn an_event_recorded_after_orphaned_held_events_does_not_overtake_them() {
    let db = TestDb::new("review_orphan_gate").await;
    let store = db.store();
    let ids = record(&db, &[("a".into(), 0), ("a".into(), 1)]).await;
    fail_claimed(
        &store,
        &[ids[0]],
        1,
        NextStep::RetryAt(Utc::now() + Duration::hours(1)),
        |_| "nack".into(),
    )
    .await
    .unwrap();
    // A 0.1 relay (which scans pending and retry rows only) takes the
    // retry and marks it sent with its own statement: no release.
    db.execute(&format!(
        "UPDATE {{schema}}.outbox_events SET status = 'sent', published_at = now(), \
         next_attempt_at = NULL WHERE id = '{}' AND status IN ('pending', 'retry')",
        ids[0]
    ));
    let late = record(&db, &[("a".into(), 2)]).await;
    if let Some(claim) = store.claim(100).await.unwrap() {
        let got = claimed(&claim);
        assert!(
            !got.contains(&late[0]) || got.contains(&ids[1]),
            "a2 claimed while a1 before it is still held: {got:?}"
        );
    }
}

/// Finding 3 (stuck). Due retries that wait behind a dead event of their
/// aggregate are never held (the claim holds pending rows only) and stay
/// in every window. Unordered mode leaves such aggregates (each event is
/// retried on its own); after the switch to ordered mode, a window's worth
/// of them starves every healthy aggregate: the defect this change fixes,
/// through retries instead of pending rows.
#[tokio::test]
async fn due_retries_behind_dead_events_do_not_starve_healthy_aggregates() {
    let db = TestDb::new("review_retry_window").await;
    let store = db.store();
    store
        .set_delivery_order(DeliveryOrder::Unordered)
        .await
        .unwrap();
    let events: Vec<(String, u32)> = (0..400)
        .flat_map(|i| [(format!("b-{i}"), 0), (format!("b-{i}"), 1)])
        .collect();
    let ids = record(&db, &events).await;
    // Unordered: b-i:0 ends dead, b-i:1 is retried later.
    while let Some(mut claim) = store.claim(100).await.unwrap() {
        let failures: Vec<FailedAttempt> = claim
            .records()
            .iter()
            .map(|r| {
                let first = ids.iter().position(|id| *id == r.id()).unwrap() % 2 == 0;
                FailedAttempt {
                    seq: r.seq,
                    attempts: if first { 10 } else { 1 },
                    error: "unroutable".into(),
                    next: if first {
                        NextStep::Dead
                    } else {
                        NextStep::RetryAt(Utc::now() + Duration::hours(1))
                    },
                    unroutable_since: None,
                }
            })
            .collect();
        claim.mark_failed(&failures).await.unwrap();
        claim.finish().await.unwrap();
        if db.count("outbox_events", "WHERE status = 'pending'") == 0 {
            break;
        }
    }
    store
        .set_delivery_order(DeliveryOrder::PerAggregate)
        .await
        .unwrap();
    // Time passes: the retries come due.
    db.execute(
        "UPDATE {schema}.outbox_events SET next_attempt_at = now() - interval '1 second' \
         WHERE status = 'retry'",
    );
    // The order cache lives a second.
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let healthy = record(&db, &[("ok".into(), 0)]).await;
    let mut got = Vec::new();
    for _ in 0..5 {
        if let Some(mut claim) = store.claim(100).await.unwrap() {
            let ids = claimed(&claim);
            claim.mark_sent(&seqs_of(&claim, &ids)).await.unwrap();
            claim.finish().await.unwrap();
            got.extend(ids);
        }
    }
    assert!(
        got.contains(&healthy[0]),
        "the healthy event never entered a window: {} due retries behind dead events fill it",
        db.count("outbox_events", "WHERE status = 'retry'")
    );
}

/// An incompressible aggregate id of 4,000 bytes, as another writer may
/// store it (the table takes it; only `retry`, `dead` and `held` rows
/// enter the indexes on the aggregate).
const LONG_ID: &str = "(SELECT string_agg(md5(g::text || random()::text), '') \
                       FROM generate_series(1, 125) g)";

/// Finding 4 (stuck). A row with an over-long aggregate id from another
/// writer could never be marked failed, held or dead (its entry would not
/// fit the aggregate indexes), so a malformed one wedged every claim and a
/// failed publish of it lost its batch's marks. The table now refuses it
/// at the other writer's insert, and the claims go on.
#[tokio::test]
async fn another_writers_over_long_aggregate_id_is_refused_at_its_insert() {
    let db = TestDb::new("review_long_id").await;
    let store = db.store();
    for headers in ["'null'::jsonb", "'{}'::jsonb"] {
        let inserted = db.try_execute(&format!(
            "INSERT INTO {{schema}}.outbox_events (id, aggregate_type, aggregate_id, \
                 event_type, schema_version, payload, headers, occurred_at) VALUES \
                 (gen_random_uuid(), 'piece', {LONG_ID}, 'piece.moved', 1, '{{}}', {headers}, \
                 now())"
        ));
        let refused = inserted.expect_err("the insert is refused");
        assert!(
            refused.to_string().contains("outbox_events_key_lengths"),
            "{refused}"
        );
    }
    assert_eq!(db.count("outbox_events", ""), 0);
    let healthy = record(&db, &[("ok".into(), 0)]).await;
    let claim = store.claim(100).await.unwrap().unwrap();
    assert_eq!(claimed(&claim), healthy);
}
