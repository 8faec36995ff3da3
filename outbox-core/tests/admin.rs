//! The admin verbs over the in-memory store: the reference semantics the
//! PostgreSQL store's tests check again on the real database.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use outbox_core::admin::{Admin, AdminError, AttemptOutcome, Caller, EventFilter, PurgeTarget};
use outbox_core::testing::{
    HookedStore, InMemoryStore, RecordingPublisher, TestEvent, fail_claimed,
};
use outbox_core::{
    Claim, Claimed, EventStatus, FailedAttempt, NextStep, OutboxStore, Relay, RelayRegistration,
};
use uuid::Uuid;

fn record(store: &InMemoryStore, aggregate: &str) -> Uuid {
    store.record(&TestEvent::new(aggregate)).unwrap()
}

/// Claims what is claimable and marks the events `ids` dead with `error`
/// (the rest of the claim is released).
async fn kill(store: &InMemoryStore, ids: &[Uuid], error: &str) {
    fail_claimed(store, ids, 5, NextStep::Dead, |_| error.to_owned())
        .await
        .unwrap();
}

/// The seq (the claim's key for marks) of the claimed event `id`.
fn seq_of(claim: &impl Claim, id: Uuid) -> i64 {
    claim
        .records()
        .iter()
        .find(|r| r.id() == id)
        .expect("event is part of the claim")
        .seq
}

fn operator() -> Caller {
    Caller::operator("alice")
}

fn status(store: &InMemoryStore, id: Uuid) -> EventStatus {
    store.get(id).unwrap().status
}

#[tokio::test]
async fn replaying_a_later_dead_event_leaves_it_held_behind_an_earlier_one() {
    let store = InMemoryStore::new();
    let admin = Admin::new(store.clone());
    let first = record(&store, "a");
    let second = record(&store, "a");
    kill(&store, &[first, second], "nack 1").await;
    assert_eq!(status(&store, first), EventStatus::Dead);
    assert_eq!(status(&store, second), EventStatus::Dead);

    let report = admin
        .replay(&operator(), &EventFilter::id(second), false, &|_| {})
        .await
        .unwrap();
    assert_eq!((report.matched, report.changed), (1, 1));
    assert_eq!(status(&store, second), EventStatus::Pending);
    // The earlier dead event still holds the aggregate: nothing to claim.
    assert!(store.claim(10).await.unwrap().is_none());

    admin
        .replay(&operator(), &EventFilter::id(first), false, &|_| {})
        .await
        .unwrap();
    let claim = store.claim(10).await.unwrap().unwrap();
    let ids: Vec<Uuid> = claim.records().iter().map(|r| r.id()).collect();
    assert_eq!(ids, [first, second], "replayed events keep their order");
}

#[tokio::test]
async fn a_dry_run_counts_and_changes_nothing_and_a_real_run_is_audited_in_chunks() {
    let store = InMemoryStore::new();
    let admin = Admin::new(store.clone()).chunk_size(2);
    let ids: Vec<Uuid> = (0..5)
        .map(|i| record(&store, &format!("agg-{i}")))
        .collect();
    kill(&store, &ids, "NOT_FOUND - no exchange 'x'").await;

    let dead = EventFilter::new().with_status(EventStatus::Dead);
    let dry = admin
        .replay(&operator(), &dead, true, &|_| {})
        .await
        .unwrap();
    assert!(dry.dry_run);
    assert_eq!((dry.matched, dry.changed, dry.audit_id), (5, 0, None));
    assert!(
        ids.iter()
            .all(|id| status(&store, *id) == EventStatus::Dead)
    );

    let progress = std::sync::Mutex::new(Vec::new());
    let report = admin
        .replay(&operator(), &dead, false, &|n| {
            progress.lock().unwrap().push(n)
        })
        .await
        .unwrap();
    assert_eq!((report.matched, report.changed), (5, 5));
    assert_eq!(
        *progress.lock().unwrap(),
        [2, 4, 5, 5],
        "one call per chunk"
    );
    let log = admin.audit_log(None, 10).await.unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].entry.identity, "alice");
    assert_eq!(log[0].entry.action, "replay");
    assert_eq!(log[0].count, 5);
    assert_eq!(Some(log[0].id), report.audit_id);
    assert_eq!(log[0].outcome.as_deref(), Some("done"));
    assert!(log[0].finished_at.is_some());
}

#[tokio::test]
async fn mutations_need_a_selection_and_the_operator_role() {
    let store = InMemoryStore::new();
    let admin = Admin::new(store.clone());
    let id = record(&store, "a");
    kill(&store, &[id], "boom").await;

    let everything = admin
        .replay(&operator(), &EventFilter::new(), false, &|_| {})
        .await;
    assert!(
        matches!(everything, Err(AdminError::Invalid(_))),
        "{everything:?}"
    );
    let sent = EventFilter::new().with_status(EventStatus::Sent);
    let wrong = admin.replay(&operator(), &sent, false, &|_| {}).await;
    assert!(matches!(wrong, Err(AdminError::Invalid(_))), "{wrong:?}");

    let reader = Caller::read_only("bob");
    let denied = admin
        .replay(&reader, &EventFilter::id(id), false, &|_| {})
        .await;
    assert!(
        matches!(denied, Err(AdminError::Forbidden { .. })),
        "{denied:?}"
    );
    let denied = admin.skip(&reader, id, false).await;
    assert!(
        matches!(denied, Err(AdminError::Forbidden { .. })),
        "{denied:?}"
    );
    assert_eq!(status(&store, id), EventStatus::Dead);
    assert!(admin.audit_log(None, 10).await.unwrap().is_empty());
    // Reading needs no role.
    assert_eq!(
        admin.show(id).await.unwrap().summary.status,
        EventStatus::Dead
    );
}

#[tokio::test]
async fn skipping_an_aggregates_head_releases_the_events_behind_it() {
    let store = InMemoryStore::new();
    let admin = Admin::new(store.clone());
    let head = record(&store, "a");
    let behind = record(&store, "a");
    kill(&store, &[head], "poison").await;
    assert!(
        store.claim(10).await.unwrap().is_none(),
        "the dead head holds `a`"
    );

    let missing = admin.skip_head(&operator(), "thing", "b", false).await;
    assert!(
        matches!(missing, Err(AdminError::NotFound(_))),
        "{missing:?}"
    );
    let report = admin
        .skip_head(&operator(), "thing", "a", false)
        .await
        .unwrap();
    assert_eq!(report.changed, 1);
    assert_eq!(status(&store, head), EventStatus::Skipped);
    let claim = store.claim(10).await.unwrap().unwrap();
    assert_eq!(claim.records()[0].id(), behind);
    drop(claim);
    // A skipped event cannot be skipped again.
    let again = admin.skip(&operator(), head, false).await;
    assert!(matches!(again, Err(AdminError::NotFound(_))), "{again:?}");
}

#[tokio::test]
async fn failures_that_differ_in_ids_form_one_group_which_can_be_replayed() {
    let store = InMemoryStore::new();
    let admin = Admin::new(store.clone());
    let a = record(&store, "a");
    let b = record(&store, "b");
    let c = record(&store, "c");
    kill(&store, &[a], &format!("nack for {a} after 12 ms")).await;
    kill(&store, &[b], &format!("nack for {b} after 7 ms")).await;
    kill(&store, &[c], "NO_ROUTE").await;

    let groups = admin.failure_groups(&EventFilter::new()).await.unwrap();
    assert_eq!(groups.len(), 2, "{groups:#?}");
    assert_eq!(groups[0].dead, 2);
    assert_eq!(groups[0].error, "nack for <id> after <n> ms");
    assert_eq!(groups[1].error, "NO_ROUTE");

    let group = EventFilter::new().with_group(groups[0].id.clone());
    let report = admin
        .replay(&operator(), &group, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(report.changed, 2);
    assert_eq!(status(&store, a), EventStatus::Pending);
    assert_eq!(status(&store, b), EventStatus::Pending);
    assert_eq!(status(&store, c), EventStatus::Dead);

    let detail = admin.show(c).await.unwrap();
    assert_eq!(detail.group.as_deref(), Some(groups[1].id.as_str()));
    assert_eq!(detail.history.len(), 1);
    assert_eq!(detail.history[0].outcome, AttemptOutcome::Dead);
    assert_eq!(
        detail.payload,
        Some(serde_json::json!({ "aggregate": "c" }))
    );
    assert_eq!(detail.clone().redacted().payload, None);
}

#[tokio::test]
async fn listing_pages_by_cursor_and_filters() {
    let store = InMemoryStore::new();
    let admin = Admin::new(store.clone());
    for i in 0..7 {
        record(&store, &format!("x{}", i % 2));
    }
    let x0 = EventFilter::new().with_aggregate("thing", "x0");
    let first = admin.list(&x0, None, 3).await.unwrap();
    assert_eq!(first.items.len(), 3);
    // Recorded between two pages: lands on a later page, nothing repeats.
    record(&store, "x0");
    let second = admin.list(&x0, first.next, 3).await.unwrap();
    let seqs: Vec<i64> = first
        .items
        .iter()
        .chain(&second.items)
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, [1, 3, 5, 7, 8]);
    assert_eq!(second.next, None);
    assert!(admin.list(&x0, None, 0).await.is_err());
}

#[tokio::test]
async fn retry_now_makes_waiting_retries_due() {
    let store = InMemoryStore::new();
    let admin = Admin::new(store.clone());
    let id = record(&store, "a");
    let mut claim = store.claim(10).await.unwrap().unwrap();
    claim
        .mark_failed(&[FailedAttempt {
            seq: seq_of(&claim, id),
            attempts: 1,
            error: "unroutable".into(),
            next: NextStep::RetryAt(chrono::Utc::now() + chrono::Duration::hours(1)),
            unroutable_since: Some(chrono::Utc::now()),
        }])
        .await
        .unwrap();
    claim.finish().await.unwrap();
    assert!(
        store.claim(10).await.unwrap().is_none(),
        "not due for an hour"
    );

    let retry = EventFilter::new().with_status(EventStatus::Retry);
    let report = admin
        .retry_now(&operator(), &retry, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(report.changed, 1);
    assert_eq!(
        store.claim(10).await.unwrap().unwrap().records()[0].id(),
        id
    );
}

#[tokio::test]
async fn purge_deletes_old_sent_events_but_never_dead_ones() {
    let store = InMemoryStore::new();
    let admin = Admin::new(store.clone()).chunk_size(2);
    let sent: Vec<Uuid> = (0..3).map(|i| record(&store, &format!("s{i}"))).collect();
    let dead = record(&store, "d");
    let mut claim = store.claim(10).await.unwrap().unwrap();
    let sent_seqs: Vec<i64> = sent.iter().map(|id| seq_of(&claim, *id)).collect();
    claim.mark_sent(&sent_seqs).await.unwrap();
    claim
        .mark_failed(&[FailedAttempt::new(
            seq_of(&claim, dead),
            5,
            "x",
            NextStep::Dead,
        )])
        .await
        .unwrap();
    claim.finish().await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;

    let report = admin
        .purge(
            &operator(),
            PurgeTarget::Sent,
            Duration::from_millis(10),
            false,
            &|_| {},
        )
        .await
        .unwrap();
    assert_eq!(report.changed, 3);
    assert!(sent.iter().all(|id| store.get(*id).is_none()));
    assert_eq!(status(&store, dead), EventStatus::Dead);
    assert_eq!(admin.audit_log(None, 1).await.unwrap()[0].count, 3);
}

#[tokio::test(start_paused = true)]
async fn a_relay_registers_heartbeats_and_obeys_pause_and_resume() {
    let store = InMemoryStore::new();
    let publisher = RecordingPublisher::new();
    let admin = Admin::new(store.clone());
    let relay = Relay::builder(store.clone(), publisher.clone())
        .name("relay-one")
        .stats_interval(Duration::from_secs(1))
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    tokio::time::sleep(Duration::from_millis(100)).await;

    let relays = admin.relays().await.unwrap();
    assert_eq!(relays.len(), 1);
    assert_eq!(relays[0].name, "relay-one");
    assert!(relays[0].live);
    assert_eq!(store.stats().await.unwrap().relays_live, 1);

    let unknown = admin.set_paused(&operator(), "nobody", true).await;
    assert!(
        matches!(unknown, Err(AdminError::NotFound(_))),
        "{unknown:?}"
    );
    admin
        .set_paused(&operator(), "relay-one", true)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await; // next heartbeat
    record(&store, "a");
    handle.notify();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        publisher.published().is_empty(),
        "a paused relay claims nothing"
    );

    admin
        .set_paused(&operator(), "relay-one", false)
        .await
        .unwrap();
    publisher.wait_for(1).await;
    handle.shutdown();
    task.await.unwrap();
    assert!(
        admin.relays().await.unwrap().is_empty(),
        "a stopped relay deregisters"
    );
    let actions: Vec<String> = admin
        .audit_log(None, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.entry.action)
        .collect();
    assert_eq!(actions, ["resume", "pause"]);
}

#[tokio::test(start_paused = true)]
async fn a_relay_restarted_under_a_paused_name_claims_nothing() {
    let store = InMemoryStore::new();
    let publisher = RecordingPublisher::new();
    let admin = Admin::new(store.clone());
    let build = || {
        Relay::builder(store.clone(), publisher.clone())
            .name("relay-one")
            .stats_interval(Duration::from_secs(1))
            .build()
            .unwrap()
    };
    let first = build();
    let handle = first.handle();
    let task = tokio::spawn(first.run());
    tokio::time::sleep(Duration::from_millis(100)).await;
    admin
        .set_paused(&operator(), "relay-one", true)
        .await
        .unwrap();
    handle.shutdown();
    task.await.unwrap();
    // A paused relay keeps its registry entry when it stops: the next
    // instance under that name starts paused.
    assert!(admin.relays().await.unwrap()[0].paused);
    record(&store, "a");
    let second = build();
    let handle = second.handle();
    let task = tokio::spawn(second.run());
    handle.notify();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        publisher.published().is_empty(),
        "paused from its first claim"
    );
    admin
        .set_paused(&operator(), "relay-one", false)
        .await
        .unwrap();
    publisher.wait_for(1).await;
    handle.shutdown();
    task.await.unwrap();
}

#[tokio::test]
async fn a_claim_for_a_paused_relay_takes_nothing_and_says_so() {
    let store = InMemoryStore::new();
    let admin = Admin::new(store.clone());
    let id = record(&store, "a");
    store
        .register_relay(&RelayRegistration::new("relay-one", Duration::from_secs(5)))
        .await
        .unwrap();
    admin
        .set_paused(&operator(), "relay-one", true)
        .await
        .unwrap();

    let paused = store.claim_for("relay-one", 10).await.unwrap();
    assert!(matches!(paused, Claimed::Paused), "{paused:?}");
    assert_eq!(store.claimed(), 0, "a paused relay's claim holds nothing");
    // Another relay, registered or not, is not held up by that pause.
    match store.claim_for("relay-two", 10).await.unwrap() {
        Claimed::Batch(claim) => assert_eq!(claim.records()[0].id(), id),
        other => panic!("relay-two claims: {other:?}"),
    }
    admin
        .set_paused(&operator(), "relay-one", false)
        .await
        .unwrap();
    match store.claim_for("relay-one", 10).await.unwrap() {
        Claimed::Batch(claim) => {
            assert_eq!(claim.records()[0].id(), id);
            let empty = store.claim_for("relay-one", 10).await.unwrap();
            assert!(matches!(empty, Claimed::Empty), "{empty:?}");
        }
        other => panic!("resumed, relay-one claims: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_pause_stops_a_running_relay_at_its_next_claim_not_its_next_heartbeat() {
    let store = InMemoryStore::new();
    // The in-memory store, counting the relay's claims.
    let counting = HookedStore::new(store.clone());
    let publisher = RecordingPublisher::new();
    let admin = Admin::new(store.clone());
    // Heartbeats every 5 s (the most a stats interval of an hour gives):
    // the pause below is read by the claims, long before the next one.
    let relay = Relay::builder(counting.clone(), publisher.clone())
        .name("relay-one")
        .stats_interval(Duration::from_secs(3600))
        .poll_interval(Duration::from_millis(50))
        .build()
        .unwrap();
    let handle = relay.handle();
    let started = tokio::time::Instant::now();
    let task = tokio::spawn(relay.run());
    record(&store, "a");
    handle.notify();
    publisher.wait_for(1).await;

    admin
        .set_paused(&operator(), "relay-one", true)
        .await
        .unwrap();
    let later: Vec<Uuid> = (0..3).map(|_| record(&store, "a")).collect();
    handle.notify();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "no heartbeat since the pause: the claims read it"
    );
    assert_eq!(
        publisher.published().len(),
        1,
        "nothing claimed once paused"
    );
    assert!(
        later
            .iter()
            .all(|id| status(&store, *id) == EventStatus::Pending)
    );
    assert_eq!(store.claimed(), 0);
    // Told so by its claims, the relay stopped claiming (not a claim per
    // poll, 40 a loop in these 2 s) until a heartbeat resumes it.
    assert!(counting.claims() <= 8, "{} claims", counting.claims());

    admin
        .set_paused(&operator(), "relay-one", false)
        .await
        .unwrap();
    // Resumed by the next heartbeat.
    tokio::time::timeout(Duration::from_secs(10), publisher.wait_for(4))
        .await
        .expect("delivered once resumed");
    assert_eq!(&publisher.published_ids()[1..], later.as_slice());
    handle.shutdown();
    task.await.unwrap();
}

/// Claims what is claimable and marks `id` for a retry in an hour (the
/// rest of the claim is released).
async fn fail_for_an_hour(store: &InMemoryStore, id: Uuid) {
    let in_an_hour = NextStep::RetryAt(chrono::Utc::now() + chrono::Duration::hours(1));
    fail_claimed(store, &[id], 1, in_an_hour, |_| "unroutable".into())
        .await
        .unwrap();
}

#[tokio::test]
async fn a_replay_leaves_alone_an_event_recorded_after_it_began_that_dies_while_it_runs() {
    use futures_util::FutureExt as _;
    let store = InMemoryStore::new();
    let admin = Admin::new(store.clone()).chunk_size(1);
    let ids: Vec<Uuid> = (0..3)
        .map(|i| record(&store, &format!("agg-{i}")))
        .collect();
    kill(&store, &ids, "nack").await;

    // After the first chunk, an event recorded then dies (as a relay's
    // claim would kill it). The in-memory store never waits, so its calls
    // complete at once inside the (synchronous) progress callback.
    let late = std::sync::Mutex::new(None);
    let dead = EventFilter::new().with_status(EventStatus::Dead);
    let report = admin
        .replay(&operator(), &dead, false, &|_| {
            let mut late = late.lock().unwrap();
            if late.is_none() {
                let id = record(&store, "late");
                kill(&store, &[id], "nack")
                    .now_or_never()
                    .expect("the in-memory store does not wait");
                *late = Some(id);
            }
        })
        .await
        .unwrap();
    let late = late.into_inner().unwrap().expect("killed between chunks");
    assert_eq!(status(&store, late), EventStatus::Dead, "not replayed");
    assert_eq!((report.matched, report.changed), (3, 3));
    assert!(report.changed <= report.matched);
    assert!(
        ids.iter()
            .all(|id| status(&store, *id) == EventStatus::Pending)
    );
    let log = admin.audit_log(None, 1).await.unwrap();
    assert_eq!(log[0].count, 3);
    assert_eq!(
        log[0].entry.target["seq_at_most"], 3,
        "the audit row says where the run stopped"
    );
}

#[tokio::test]
async fn retry_now_leaves_alone_an_event_recorded_after_it_began() {
    use futures_util::FutureExt as _;
    let store = InMemoryStore::new();
    let admin = Admin::new(store.clone()).chunk_size(1);
    let ids: Vec<Uuid> = (0..2)
        .map(|i| record(&store, &format!("agg-{i}")))
        .collect();
    for id in &ids {
        fail_for_an_hour(&store, *id).await;
    }
    let late = std::sync::Mutex::new(None);
    let retry = EventFilter::new().with_status(EventStatus::Retry);
    let report = admin
        .retry_now(&operator(), &retry, false, &|_| {
            let mut late = late.lock().unwrap();
            if late.is_none() {
                let id = record(&store, "late");
                fail_for_an_hour(&store, id)
                    .now_or_never()
                    .expect("the in-memory store does not wait");
                *late = Some(id);
            }
        })
        .await
        .unwrap();
    let late = late.into_inner().unwrap().expect("failed between chunks");
    assert_eq!((report.matched, report.changed), (2, 2));
    let now = chrono::Utc::now();
    assert!(
        store.get(late).unwrap().next_attempt_at.unwrap() > now,
        "still waiting for its retry"
    );
    assert!(
        ids.iter()
            .all(|id| store.get(*id).unwrap().next_attempt_at.unwrap() <= now)
    );
}
