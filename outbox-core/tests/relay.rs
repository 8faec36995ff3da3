//! Relay engine behaviour on the in-memory store and recording publisher.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_core::testing::conformance;
use outbox_core::testing::{
    HookedStore, InMemoryStore, RecordingPublisher, TestEvent, run_until, wakeup_driven,
};
use outbox_core::{
    DeadSelector, EventEnvelope, EventStatus, OutboxStore, PublishOutcome, Relay, RelayHandle,
    RetryPolicy,
};
use proptest::prelude::*;
use uuid::Uuid;

fn record(store: &InMemoryStore, aggregate: &str, n: u32) -> Uuid {
    store
        .record(&TestEvent::new(aggregate).field("n", n))
        .unwrap()
}

/// Retries due at once, so tests do not depend on the wall clock.
fn instant_retries(max_attempts: u32) -> RetryPolicy {
    RetryPolicy::default()
        .base_delay(Duration::ZERO)
        .max_delay(Duration::ZERO)
        .max_attempts(max_attempts)
}

fn new_relay(
    store: &InMemoryStore,
    publisher: &RecordingPublisher,
    retry: RetryPolicy,
) -> (Relay<InMemoryStore, RecordingPublisher>, RelayHandle) {
    let relay = Relay::builder(store.clone(), publisher.clone())
        .batch_size(10)
        .poll_interval(Duration::from_millis(5))
        .pause(Duration::from_millis(50), Duration::from_millis(200))
        .retry(retry)
        .build()
        .unwrap();
    let handle = relay.handle();
    (relay, handle)
}

fn all_sent(store: &InMemoryStore) -> bool {
    store
        .records()
        .iter()
        .all(|r| r.status == EventStatus::Sent)
}

#[tokio::test(start_paused = true)]
async fn publishes_everything_and_marks_it_sent_only_after_ack() {
    let store = InMemoryStore::new();
    let ids: Vec<Uuid> = (0..35)
        .map(|n| record(&store, &format!("a{}", n % 4), n))
        .collect();
    let publisher = RecordingPublisher::new();
    let (relay, _) = new_relay(&store, &publisher, RetryPolicy::default());
    run_until(relay, &store, all_sent).await.unwrap();

    let mut published = publisher.published_ids();
    published.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(published, expected, "each event published exactly once");
    for record in store.records() {
        assert_eq!(record.attempts, 0);
        assert!(record.published_at.is_some());
    }
}

#[tokio::test(start_paused = true)]
async fn connection_lost_spends_no_attempts_and_pauses() {
    let store = InMemoryStore::new();
    for n in 0..5 {
        record(&store, "a", n);
    }
    let calls: Arc<Mutex<Vec<tokio::time::Instant>>> = Arc::default();
    let lost_left = Arc::new(Mutex::new(3));
    let publisher = RecordingPublisher::with_behaviour({
        let calls = Arc::clone(&calls);
        let lost_left = Arc::clone(&lost_left);
        move |_| {
            calls.lock().unwrap().push(tokio::time::Instant::now());
            let mut left = lost_left.lock().unwrap();
            if *left > 0 {
                *left -= 1;
                PublishOutcome::connection_lost("socket closed")
            } else {
                PublishOutcome::Acked
            }
        }
    });
    let (relay, _) = new_relay(&store, &publisher, instant_retries(2));
    run_until(relay, &store, all_sent).await.unwrap();

    for record in store.records() {
        assert_eq!(
            record.attempts, 0,
            "a lost connection must not spend attempts"
        );
        assert_eq!(record.last_error, None);
    }
    let calls = calls.lock().unwrap();
    // The first three publishes lost the connection; each was followed by a
    // pause of 50, 100, 200 ms (backoff) before the next claim.
    let gaps: Vec<Duration> = calls.windows(2).take(3).map(|w| w[1] - w[0]).collect();
    assert!(gaps[0] >= Duration::from_millis(50), "{gaps:?}");
    assert!(gaps[1] >= Duration::from_millis(100), "{gaps:?}");
    assert!(gaps[2] >= Duration::from_millis(200), "{gaps:?}");
}

#[tokio::test(start_paused = true)]
async fn rejections_spend_attempts_and_end_dead_blocking_only_their_aggregate() {
    let store = InMemoryStore::new();
    let poison = record(&store, "bad", 0);
    let held_back = record(&store, "bad", 1);
    let fine: Vec<Uuid> = (0..6).map(|n| record(&store, "good", n)).collect();
    let publisher = RecordingPublisher::with_behaviour(move |event| {
        if event.id == poison {
            PublishOutcome::rejected("NO_ROUTE: unroutable")
        } else {
            PublishOutcome::Acked
        }
    });
    let (relay, _) = new_relay(&store, &publisher, instant_retries(3));
    run_until(relay, &store, |s| {
        s.get(poison).unwrap().status == EventStatus::Dead
            && fine
                .iter()
                .all(|id| s.get(*id).unwrap().status == EventStatus::Sent)
    })
    .await
    .unwrap();

    let dead = store.get(poison).unwrap();
    assert_eq!(dead.attempts, 3);
    assert_eq!(dead.last_error.as_deref(), Some("NO_ROUTE: unroutable"));
    let rejected = publisher
        .attempts()
        .iter()
        .filter(|a| a.id == poison)
        .count();
    assert_eq!(
        rejected, 3,
        "exactly max_attempts publishes of the poison event"
    );
    let blocked = store.get(held_back).unwrap();
    assert_eq!(
        blocked.status,
        EventStatus::Pending,
        "held back behind the dead event"
    );
    assert_eq!(blocked.attempts, 0);
    assert!(!publisher.attempts().iter().any(|a| a.id == held_back));

    let stats = store.stats().await.unwrap();
    assert_eq!(stats.dead, 1);
    assert_eq!(stats.blocked_aggregates, 1);
    assert_eq!(stats.backlog, 1);
}

#[tokio::test(start_paused = true)]
async fn an_unpublishable_event_ends_dead_at_once_blocking_only_its_aggregate() {
    let store = InMemoryStore::new();
    let poison = record(&store, "bad", 0);
    let held_back = record(&store, "bad", 1);
    let fine: Vec<Uuid> = (0..3).map(|n| record(&store, "good", n)).collect();
    let publisher = RecordingPublisher::with_behaviour(move |event| {
        if event.id == poison {
            PublishOutcome::unpublishable("header name over 255 bytes")
        } else {
            PublishOutcome::Acked
        }
    });
    let (relay, _) = new_relay(&store, &publisher, instant_retries(5));
    run_until(relay, &store, |s| {
        s.get(poison).unwrap().status == EventStatus::Dead
            && fine
                .iter()
                .all(|id| s.get(*id).unwrap().status == EventStatus::Sent)
    })
    .await
    .unwrap();
    let dead = store.get(poison).unwrap();
    assert_eq!(dead.attempts, 1, "no retry schedule for a hopeless event");
    assert_eq!(
        dead.last_error.as_deref(),
        Some("header name over 255 bytes")
    );
    assert_eq!(
        publisher
            .attempts()
            .iter()
            .filter(|a| a.id == poison)
            .count(),
        1
    );
    assert_eq!(store.get(held_back).unwrap().status, EventStatus::Pending);
}

#[tokio::test(start_paused = true)]
async fn replay_publishes_in_original_order_and_skip_unblocks() {
    let store = InMemoryStore::new();
    let a0 = record(&store, "a", 0);
    let a1 = record(&store, "a", 1);
    let b0 = record(&store, "b", 0);
    let b1 = record(&store, "b", 1);
    let refuse: Arc<Mutex<Vec<Uuid>>> = Arc::new(Mutex::new(vec![a0, b0]));
    let publisher = RecordingPublisher::with_behaviour({
        let refuse = Arc::clone(&refuse);
        move |event| {
            if refuse.lock().unwrap().contains(&event.id) {
                PublishOutcome::rejected("nack")
            } else {
                PublishOutcome::Acked
            }
        }
    });
    let (relay, _) = new_relay(&store, &publisher, instant_retries(1));
    run_until(relay, &store, |s| {
        s.get(a0).unwrap().status == EventStatus::Dead
            && s.get(b0).unwrap().status == EventStatus::Dead
    })
    .await
    .unwrap();
    assert!(publisher.published_ids().is_empty());

    // The broker is fixed: replay a's dead event, skip b's.
    refuse.lock().unwrap().clear();
    assert_eq!(store.replay_dead(DeadSelector::Id(a0)).await.unwrap(), 1);
    assert!(store.skip_dead(b0).await.unwrap());
    assert!(
        !store.skip_dead(b0).await.unwrap(),
        "skipped is not dead any more"
    );
    let (relay, _) = new_relay(&store, &publisher, instant_retries(1));
    run_until(relay, &store, |s| {
        [a0, a1, b1]
            .iter()
            .all(|id| s.get(*id).unwrap().status == EventStatus::Sent)
    })
    .await
    .unwrap();
    let published = publisher.published_ids();
    let pos = |id| published.iter().position(|p| *p == id).unwrap();
    assert!(pos(a0) < pos(a1), "replayed event keeps its place");
    assert!(!published.contains(&b0), "skipped event is never published");
    assert_eq!(store.get(b0).unwrap().status, EventStatus::Skipped);
    assert_eq!(store.get(a0).unwrap().attempts, 0, "replay resets attempts");
}

/// An event of another type (another destination for the relay's breakers).
fn record_stuck(store: &InMemoryStore, aggregate: &str) -> Uuid {
    let stuck = TestEvent::new(aggregate).of_type("thing", "thing.stuck");
    store.record(&stuck).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_wave_unconfirmed_across_destinations_pauses_and_spends_nothing() {
    let store = InMemoryStore::new();
    for n in 0..4 {
        record(&store, &format!("a{n}"), n);
        record_stuck(&store, &format!("s{n}"));
    }
    let calls: Arc<Mutex<Vec<tokio::time::Instant>>> = Arc::default();
    let publisher = RecordingPublisher::with_behaviour({
        let calls = Arc::clone(&calls);
        move |_| {
            let mut calls = calls.lock().unwrap();
            calls.push(tokio::time::Instant::now());
            // The first two waves (8 messages each) go unconfirmed.
            if calls.len() <= 16 {
                PublishOutcome::unconfirmed("no publisher confirm within 10s")
            } else {
                PublishOutcome::Acked
            }
        }
    });
    let (relay, _) = new_relay(&store, &publisher, instant_retries(2));
    run_until(relay, &store, all_sent).await.unwrap();
    for record in store.records() {
        assert_eq!(record.attempts, 0, "silence spends no attempt");
        assert_eq!(
            record.last_error, None,
            "released unmarked, as for a lost connection"
        );
    }
    let calls = calls.lock().unwrap();
    assert!(
        calls[8] - calls[0] >= Duration::from_millis(50),
        "the relay paused after the first wave"
    );
    assert!(
        calls[16] - calls[8] >= Duration::from_millis(100),
        "and longer after the second"
    );
}

#[tokio::test]
async fn partly_unconfirmed_events_wait_behind_their_destinations_breaker_only() {
    let store = InMemoryStore::new();
    let stuck: Vec<Uuid> = (0..3)
        .map(|n| record_stuck(&store, &format!("s{n}")))
        .collect();
    let fine: Vec<Uuid> = (0..6)
        .map(|n| record(&store, &format!("a{n}"), n))
        .collect();
    let queue_stuck = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let publisher = RecordingPublisher::with_behaviour({
        let queue_stuck = Arc::clone(&queue_stuck);
        move |event| {
            if event.event_type == "thing.stuck"
                && queue_stuck.load(std::sync::atomic::Ordering::SeqCst)
            {
                PublishOutcome::unconfirmed("no publisher confirm within 10s")
            } else {
                PublishOutcome::Acked
            }
        }
    });
    let retry = RetryPolicy::default()
        .base_delay(Duration::from_millis(300))
        .max_delay(Duration::from_millis(300))
        .max_attempts(2)
        .deterministic();
    let (relay, handle) = new_relay(&store, &publisher, retry);
    let task = tokio::spawn(relay.run());
    let wait = |what: &'static str, done: Box<dyn Fn(&InMemoryStore) -> bool>| {
        let store = store.clone();
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            while !done(&store) {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{what}: {:?}",
                    store.records()
                );
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    };
    let status = |store: &InMemoryStore, id: Uuid| store.get(id).unwrap().status;
    {
        let (stuck, fine) = (stuck.clone(), fine.clone());
        wait(
            "the other destination flows, the stuck one is released",
            Box::new(move |s| {
                fine.iter().all(|id| status(s, *id) == EventStatus::Sent)
                    && stuck.iter().all(|id| status(s, *id) == EventStatus::Retry)
            }),
        )
        .await;
    }
    for id in &stuck {
        let record = store.get(*id).unwrap();
        assert_eq!(record.attempts, 0, "no attempt spent");
        assert!(
            record.next_attempt_at.unwrap() > chrono::Utc::now(),
            "released with a delay"
        );
        assert!(record.last_error.unwrap().contains("no attempt spent"));
    }
    // While the breaker is open, a new event for that destination is held
    // back without being sent; others still flow.
    let later = record_stuck(&store, "s-later");
    let other = record(&store, "a-later", 0);
    handle.notify();
    {
        wait(
            "held by the open breaker",
            Box::new(move |s| {
                status(s, later) == EventStatus::Retry && status(s, other) == EventStatus::Sent
            }),
        )
        .await;
    }
    assert!(
        publisher.attempts().iter().all(|a| a.id != later),
        "held back without being sent"
    );
    assert!(
        store
            .get(later)
            .unwrap()
            .last_error
            .unwrap()
            .contains("circuit breaker open")
    );
    // The queue recovers: once the breaker's delay is over, all is sent.
    queue_stuck.store(false, std::sync::atomic::Ordering::SeqCst);
    wait("delivered after recovery", Box::new(all_sent)).await;
    handle.shutdown();
    task.await.unwrap();
    for record in store.records() {
        assert_eq!(record.attempts, 0, "{record:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_waves_confirm_wait_ends_at_the_claims_deadline() {
    /// A broker that never confirms: waits for as long as it may.
    struct Silent(Arc<std::sync::atomic::AtomicUsize>);
    impl outbox_core::Publisher for Silent {
        async fn publish(
            &self,
            events: &[&EventEnvelope],
            deadline: Option<std::time::Instant>,
        ) -> Vec<PublishOutcome> {
            match deadline {
                Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
                None => std::future::pending().await,
            }
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            events
                .iter()
                .map(|_| PublishOutcome::unconfirmed("no confirm"))
                .collect()
        }
    }
    let store = InMemoryStore::new().with_claim_timeout(Duration::from_secs(5));
    for n in 0..4 {
        record(&store, &format!("a{n}"), n);
        record_stuck(&store, &format!("s{n}"));
    }
    let returned = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let relay = Relay::builder(store.clone(), Silent(Arc::clone(&returned)))
        .concurrency(1)
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    let started = tokio::time::Instant::now();
    while returned.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the wave waited beyond its claim's deadline"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    handle.shutdown();
    task.await.unwrap();
    assert_eq!(store.claimed(), 0);
    for record in store.records() {
        assert_eq!((record.status, record.attempts), (EventStatus::Pending, 0));
    }
}

#[tokio::test(start_paused = true)]
async fn the_claims_deadline_is_passed_to_each_wave() {
    let store = InMemoryStore::new().with_claim_timeout(Duration::from_secs(30));
    for n in 0..3 {
        record(&store, "a", n);
    }
    let publisher = RecordingPublisher::new();
    let before = std::time::Instant::now();
    let (relay, _) = new_relay(&store, &publisher, RetryPolicy::default());
    run_until(relay, &store, all_sent).await.unwrap();
    let deadlines = publisher.deadlines();
    assert_eq!(deadlines.len(), 3, "one wave per event of the aggregate");
    for deadline in deadlines {
        let deadline = deadline.expect("the claim's valid_until");
        assert!(
            deadline > before && deadline <= std::time::Instant::now() + Duration::from_secs(30)
        );
    }
}

/// A store whose first claim holds rows for a while and then finds nothing
/// to take (as an ordered claim that locked rows and kept none of them);
/// claims made meanwhile skip the held rows and find nothing either.
fn first_claim_holds(inner: InMemoryStore) -> HookedStore<InMemoryStore> {
    use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
    let first = Arc::new(AtomicU8::new(0));
    HookedStore::new(inner).on_claim(move |inner, limit| {
        let first = Arc::clone(&first);
        async move {
            match first.compare_exchange(0, 1, SeqCst, SeqCst) {
                Ok(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    first.store(2, SeqCst);
                    Ok(None)
                }
                Err(1) => Ok(None),
                Err(_) => inner.claim(limit).await,
            }
        }
    })
}

#[tokio::test(start_paused = true)]
async fn an_empty_claim_that_held_rows_wakes_the_loops_that_skipped_them() {
    let inner = InMemoryStore::new();
    record(&inner, "a", 0);
    let store = first_claim_holds(inner.clone());
    let publisher = RecordingPublisher::new();
    // No wakeups and no polls (an hour): only the end of the empty claim
    // can send the other loop back to claim.
    let relay = Relay::builder(store, publisher.clone())
        .concurrency(2)
        .poll_interval(Duration::from_secs(3600))
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    let published = tokio::time::timeout(Duration::from_secs(60), publisher.wait_for(1)).await;
    handle.shutdown();
    task.await.unwrap();
    assert!(
        published.is_ok(),
        "the loop that skipped the held rows claimed again when the empty claim ended"
    );
}

#[tokio::test(start_paused = true)]
async fn idle_loops_whose_empty_claims_overlap_do_not_wake_each_other_forever() {
    // Each claim takes 10 ms and finds nothing.
    let store = HookedStore::new(InMemoryStore::new()).on_claim(|_, _| async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok(None)
    });
    let relay = Relay::builder(store.clone(), RecordingPublisher::new())
        .concurrency(2)
        .poll_interval(Duration::from_secs(3600))
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    tokio::time::sleep(Duration::from_secs(10)).await;
    handle.shutdown();
    task.await.unwrap();
    let claims = store.claims();
    assert!(
        claims <= 6,
        "idle loops claimed {claims} times in 10 s without a poll"
    );
}

#[tokio::test(start_paused = true)]
async fn store_errors_are_retried() {
    let store = InMemoryStore::new();
    for n in 0..20 {
        record(&store, &format!("a{n}"), n);
    }
    store.fail_next(5);
    let publisher = RecordingPublisher::new();
    let (relay, _) = new_relay(&store, &publisher, RetryPolicy::default());
    run_until(relay, &store, all_sent).await.unwrap();
    assert_eq!(publisher.published_ids().len(), 20);
}

#[tokio::test(start_paused = true)]
async fn missing_outcomes_are_not_marked_sent() {
    #[derive(Clone)]
    struct Truncating(RecordingPublisher);
    impl outbox_core::Publisher for Truncating {
        async fn publish(
            &self,
            events: &[&EventEnvelope],
            deadline: Option<std::time::Instant>,
        ) -> Vec<PublishOutcome> {
            let mut outcomes = self.0.publish(events, deadline).await;
            outcomes.truncate(1);
            outcomes
        }
    }
    let store = InMemoryStore::unordered();
    let ids: Vec<Uuid> = (0..3)
        .map(|n| record(&store, &format!("a{n}"), n))
        .collect();
    let relay = Relay::builder(store.clone(), Truncating(RecordingPublisher::new()))
        .poll_interval(Duration::from_secs(3600))
        .pause(Duration::from_secs(3600), Duration::from_secs(3600))
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    // Let one batch happen, then stop during the (long) pause that follows.
    while store.get(ids[0]).unwrap().status != EventStatus::Sent {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    handle.shutdown();
    task.await.unwrap();
    for id in &ids[1..] {
        let record = store.get(*id).unwrap();
        assert_eq!(record.status, EventStatus::Pending);
        assert_eq!(record.attempts, 0);
    }
    assert_eq!(store.claimed(), 0);
}

#[tokio::test(start_paused = true)]
async fn shutdown_finishes_the_batch_in_flight() {
    #[derive(Clone)]
    struct Slow(RecordingPublisher);
    impl outbox_core::Publisher for Slow {
        async fn publish(
            &self,
            events: &[&EventEnvelope],
            deadline: Option<std::time::Instant>,
        ) -> Vec<PublishOutcome> {
            tokio::time::sleep(Duration::from_secs(1)).await;
            self.0.publish(events, deadline).await
        }
    }
    let store = InMemoryStore::unordered();
    for n in 0..10 {
        record(&store, &format!("a{n}"), n);
    }
    let inner = RecordingPublisher::new();
    let relay = Relay::builder(store.clone(), Slow(inner.clone()))
        .batch_size(10)
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    tokio::time::sleep(Duration::from_millis(500)).await; // mid-publish
    handle.shutdown();
    task.await.unwrap();
    assert!(
        all_sent(&store),
        "the batch in flight was published and marked"
    );
    assert_eq!(store.claimed(), 0);
    assert_eq!(inner.published_ids().len(), 10);
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_a_batch_that_overruns_the_grace_period() {
    #[derive(Clone)]
    struct Stuck;
    impl outbox_core::Publisher for Stuck {
        async fn publish(
            &self,
            _: &[&EventEnvelope],
            _: Option<std::time::Instant>,
        ) -> Vec<PublishOutcome> {
            std::future::pending().await
        }
    }
    let store = InMemoryStore::new();
    for n in 0..4 {
        record(&store, "a", n);
    }
    let relay = Relay::builder(store.clone(), Stuck)
        .shutdown_grace(Duration::from_secs(2))
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    while store.claimed() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let stopping = tokio::time::Instant::now();
    handle.shutdown();
    task.await.unwrap();
    assert!(stopping.elapsed() >= Duration::from_secs(2));
    assert_eq!(store.claimed(), 0, "nothing stays claimed");
    for record in store.records() {
        assert_eq!((record.status, record.attempts), (EventStatus::Pending, 0));
    }
}

#[tokio::test]
async fn notify_wakes_the_relay_without_waiting_for_the_poll() {
    let store = InMemoryStore::new();
    let publisher = RecordingPublisher::new();
    let relay = Relay::builder(store.clone(), publisher.clone())
        .poll_interval(Duration::from_secs(3600))
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    tokio::time::sleep(Duration::from_millis(50)).await; // relay is idle, waiting
    record(&store, "a", 1);
    handle.notify();
    tokio::time::timeout(Duration::from_secs(5), publisher.wait_for(1))
        .await
        .expect("a notified relay publishes well before its hour-long poll");
    handle.shutdown();
    task.await.unwrap();
}

#[test]
fn invalid_settings_are_rejected_at_build() {
    let build = |f: fn(
        outbox_core::RelayBuilder<InMemoryStore, RecordingPublisher>,
    ) -> outbox_core::RelayBuilder<InMemoryStore, RecordingPublisher>| {
        f(Relay::builder(
            InMemoryStore::new(),
            RecordingPublisher::new(),
        ))
        .build()
    };
    assert!(build(|b| b).is_ok());
    assert!(build(|b| b.batch_size(0)).is_err());
    assert!(build(|b| b.batch_size(10_001)).is_err());
    assert!(build(|b| b.concurrency(0)).is_err());
    assert!(build(|b| b.concurrency(17)).is_err());
    assert!(build(|b| b.poll_interval(Duration::ZERO)).is_err());
    assert!(build(|b| b.retry(RetryPolicy::default().max_attempts(0))).is_err());
    let err = build(|b| b.batch_size(0)).unwrap_err().to_string();
    assert!(err.contains("batch_size"), "{err}");
    assert!(build(|b| b.batch_size(50).max_batch_size(50)).is_ok());
    assert!(build(|b| b.batch_size(50).max_batch_size(10_000)).is_ok());
    assert!(build(|b| b.batch_size(50).max_batch_size(49)).is_err());
    assert!(build(|b| b.max_batch_size(10_001)).is_err());
    let err = build(|b| b.max_batch_size(1)).unwrap_err().to_string();
    assert!(err.contains("max_batch_size"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn claims_grow_while_a_backlog_lasts_and_shrink_when_it_is_drained() {
    let store = InMemoryStore::new();
    for n in 0..200 {
        record(&store, &format!("a{n}"), n);
    }
    let publisher = RecordingPublisher::new();
    let sizes = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&sizes);
    publisher.set_delay(move |batch| {
        seen.lock().unwrap().push(batch.len());
        Duration::ZERO
    });
    let relay = Relay::builder(store.clone(), publisher.clone())
        .batch_size(10)
        .max_batch_size(40)
        .concurrency(1)
        .poll_interval(Duration::from_millis(5))
        .build()
        .unwrap();
    run_until(relay, &store, all_sent).await.unwrap();
    // 10, 20, then 40 while full; the last claim finds the 10 left.
    assert_eq!(*sizes.lock().unwrap(), [10, 20, 40, 40, 40, 40, 10]);
    assert_eq!(publisher.published_ids().len(), 200);

    // Drained: a lone event is claimed by a claim of `batch_size`.
    sizes.lock().unwrap().clear();
    for n in 0..15 {
        record(&store, &format!("b{n}"), n);
    }
    let relay = Relay::builder(store.clone(), publisher.clone())
        .batch_size(10)
        .max_batch_size(40)
        .concurrency(1)
        .poll_interval(Duration::from_millis(5))
        .build()
        .unwrap();
    run_until(relay, &store, all_sent).await.unwrap();
    assert_eq!(*sizes.lock().unwrap(), [10, 5]);
}

fn random_failures_case(
    seed: u64,
    aggregates: usize,
    events: usize,
    batch_size: usize,
    ordered: bool,
    concurrency: usize,
) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = if ordered {
            InMemoryStore::new()
        } else {
            InMemoryStore::unordered()
        };
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut recorded: HashMap<String, Vec<Uuid>> = HashMap::new();
        for n in 0..events {
            let aggregate = format!("agg-{}", rng.usize(..aggregates));
            let id = record(&store, &aggregate, n as u32);
            recorded.entry(aggregate).or_default().push(id);
        }
        let rejections: Arc<Mutex<HashMap<Uuid, u32>>> = Arc::default();
        let publisher = RecordingPublisher::with_behaviour({
            let rejections = Arc::clone(&rejections);
            let mut rng = fastrand::Rng::with_seed(seed ^ 0xDEAD_BEEF);
            move |event| match rng.u64(..) % 10 {
                0 | 1 => {
                    *rejections.lock().unwrap().entry(event.id).or_default() += 1;
                    PublishOutcome::rejected("nack")
                }
                2 => PublishOutcome::connection_lost("reset"),
                _ => PublishOutcome::Acked,
            }
        });
        let relay = Relay::builder(store.clone(), publisher.clone())
            .batch_size(batch_size)
            .concurrency(concurrency)
            .poll_interval(Duration::from_millis(5))
            .pause(Duration::from_millis(1), Duration::from_millis(4))
            .retry(instant_retries(10_000))
            .build()
            .unwrap();
        run_until(relay, &store, all_sent).await.unwrap();

        // Every event acked exactly once, and nothing marked without an ack.
        let acked = publisher.published_ids();
        let mut unique = acked.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), acked.len(), "an event was acked twice");
        assert_eq!(acked.len(), events, "every event published");
        // Attempts count exactly the rejections, never connection losses.
        let rejections = rejections.lock().unwrap();
        for record in store.records() {
            assert_eq!(
                record.attempts,
                rejections.get(&record.id()).copied().unwrap_or(0)
            );
        }
        if ordered {
            for (aggregate, ids) in &recorded {
                let published: Vec<Uuid> = acked
                    .iter()
                    .copied()
                    .filter(|id| ids.contains(id))
                    .collect();
                assert_eq!(
                    &published, ids,
                    "order broken for {aggregate} (seed {seed})"
                );
            }
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn per_aggregate_order_holds_under_random_failures(
        seed in any::<u64>(),
        aggregates in 1usize..8,
        events in 1usize..120,
        batch_size in 1usize..40,
        concurrency in 1usize..4,
    ) {
        random_failures_case(seed, aggregates, events, batch_size, true, concurrency);
    }

    #[test]
    fn unordered_mode_loses_and_duplicates_nothing(
        seed in any::<u64>(),
        events in 1usize..120,
        batch_size in 1usize..40,
        concurrency in 1usize..4,
    ) {
        random_failures_case(seed, 3, events, batch_size, false, concurrency);
    }
}

/// Runs a relay with `policy` for unroutable events on one event every
/// publish of which comes back unroutable, until `done` holds.
async fn unroutable_run(
    policy: outbox_core::UnroutablePolicy,
    done: impl Fn(&outbox_core::OutboxRecord) -> bool,
) -> (outbox_core::OutboxRecord, RecordingPublisher) {
    let store = InMemoryStore::new();
    let id = record(&store, "a", 0);
    let publisher =
        RecordingPublisher::with_behaviour(|_| PublishOutcome::unroutable("312 NO_ROUTE"));
    let relay = Relay::builder(store.clone(), publisher.clone())
        .batch_size(10)
        .poll_interval(Duration::from_millis(5))
        .retry(instant_retries(3))
        .unroutable(policy)
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let row = store.get(id).unwrap();
        if done(&row) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not reached: {row:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    handle.shutdown();
    task.await.unwrap();
    (store.get(id).unwrap(), publisher)
}

#[tokio::test]
async fn an_unroutable_event_is_held_without_spending_attempts_by_default() {
    let (row, publisher) = unroutable_run(outbox_core::UnroutablePolicy::default(), |r| {
        r.unroutable_since.is_some()
    })
    .await;
    assert_eq!(row.status, EventStatus::Retry);
    assert_eq!(row.attempts, 0, "no attempt spent");
    assert!(row.next_attempt_at.is_some());
    assert!(row.last_error.unwrap().contains("NO_ROUTE"));
    assert_eq!(publisher.published().len(), 0);
}

#[tokio::test]
async fn an_unroutable_event_held_past_its_maximum_ends_dead_with_the_reason() {
    let (row, _) = unroutable_run(
        outbox_core::UnroutablePolicy::hold(Duration::ZERO, Duration::from_secs(1)),
        |r| r.status == EventStatus::Dead,
    )
    .await;
    let error = row.last_error.unwrap();
    assert!(
        error.contains("max_hold") && error.contains("NO_ROUTE"),
        "{error}"
    );
}

#[tokio::test]
async fn unroutable_policies_spend_attempts_or_accept_when_told_to() {
    let (row, _) = unroutable_run(outbox_core::UnroutablePolicy::SpendAttempts, |r| {
        r.status == EventStatus::Dead
    })
    .await;
    assert_eq!(row.attempts, 3, "every return spent an attempt");
    let (row, _) = unroutable_run(outbox_core::UnroutablePolicy::Accept, |r| {
        r.status == EventStatus::Sent
    })
    .await;
    assert_eq!(row.attempts, 0);
}

/// Marks name events by their seq, and a claim refuses a seq that is not
/// one of its records (another claim's, or none at all) with
/// `NotInClaim`, marking nothing of the call.
#[tokio::test]
async fn the_in_memory_store_refuses_a_seq_not_in_the_claim_and_marks_nothing() {
    conformance::marks_refuse_seqs_not_in_the_claim(&InMemoryStore::new())
        .await
        .unwrap();
}

/// A seq named twice in one mark call is refused and nothing is marked.
#[tokio::test]
async fn the_in_memory_store_refuses_a_seq_named_twice_in_one_mark() {
    conformance::marks_refuse_a_seq_named_twice(&InMemoryStore::new())
        .await
        .unwrap();
}

#[tokio::test]
async fn in_the_in_memory_store_a_dead_event_holds_back_only_its_aggregate() {
    conformance::a_dead_event_holds_back_only_its_aggregate(&InMemoryStore::new())
        .await
        .unwrap();
}

/// The in-memory store with a wakeup stream fed by the test's channel.
fn wakeups_from(rx: tokio::sync::mpsc::UnboundedReceiver<()>) -> HookedStore<InMemoryStore> {
    HookedStore::new(InMemoryStore::new())
        .with_wakeups(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|()| ((), rx))
        }))
}

/// Each item of the store's wakeup stream wakes the relay; when the stream
/// ends the relay neither stops nor spins, it polls; when the relay stops it
/// drops the stream.
#[tokio::test(start_paused = true)]
async fn store_wakeups_wake_the_relay_and_after_they_end_polling_goes_on() {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let store = wakeups_from(rx);
    let publisher = RecordingPublisher::new();
    let relay = wakeup_driven(store.clone(), publisher.clone())
        .concurrency(1)
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Woken by the stream (polling is an hour away).
    record(store.inner(), "a", 0);
    tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(1), publisher.wait_for(1))
        .await
        .expect("a wakeup from the store's stream wakes the relay");

    // The stream ends: no spin, no stop, and the next poll publishes.
    let ended = tx.clone();
    drop(tx);
    assert!(!ended.is_closed(), "the relay holds the stream");
    drop(ended);
    let claims = store.claims();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let idle_claims = store.claims() - claims;
    assert!(
        idle_claims <= 2,
        "{idle_claims} claims in a minute after the stream ended"
    );
    record(store.inner(), "a", 1);
    tokio::time::timeout(Duration::from_secs(3600), publisher.wait_for(2))
        .await
        .expect("polling publishes once the store's wakeups ended");
    assert!(!task.is_finished(), "the relay runs on");
    handle.shutdown();
    task.await.unwrap();
}

/// A stopped relay has dropped its store wakeup stream.
#[tokio::test(start_paused = true)]
async fn a_stopped_relay_drops_the_store_wakeup_stream() {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let store = wakeups_from(rx);
    let relay = Relay::builder(store, RecordingPublisher::new())
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!tx.is_closed(), "the running relay holds the stream");
    handle.shutdown();
    task.await.unwrap();
    assert!(tx.is_closed(), "the stopped relay dropped the stream");
}

/// A store whose wakeup stream is always ready (a faulty or very chatty
/// store) does not starve the relay's claim loops: events are still
/// published.
#[tokio::test]
async fn an_always_ready_wakeup_stream_does_not_starve_the_relay() {
    // Always ready, and never touches tokio's budget.
    let store =
        HookedStore::new(InMemoryStore::new()).with_wakeups(futures_util::stream::repeat(()));
    let publisher = RecordingPublisher::new();
    let relay = Relay::builder(store.clone(), publisher.clone())
        .concurrency(1)
        .poll_interval(Duration::from_millis(50))
        .stats_interval(Duration::from_secs(3600))
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    record(store.inner(), "a", 0);
    tokio::time::timeout(Duration::from_secs(10), publisher.wait_for(1))
        .await
        .expect("the relay publishes although its store wakes it without pause");
    handle.shutdown();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the relay stops")
        .unwrap();
}

/// A `metrics` recorder that keeps the values of one histogram.
#[derive(Default)]
struct HistogramRecorder {
    name: &'static str,
    values: Arc<RecordedValues>,
}

#[derive(Default)]
struct RecordedValues(Mutex<Vec<f64>>);

impl metrics::HistogramFn for RecordedValues {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

impl metrics::Recorder for HistogramRecorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        if key.name() == self.name {
            metrics::Histogram::from_arc(self.values.clone())
        } else {
            metrics::Histogram::noop()
        }
    }
}

/// Raise-to-confirm is recorded once per confirmed event, measured from
/// when the event was raised; a rejected event records nothing.
#[tokio::test(flavor = "current_thread")]
async fn raise_to_confirm_is_recorded_for_each_confirmed_event() {
    let recorder = HistogramRecorder {
        name: outbox_core::relay::metric_names::RAISE_TO_CONFIRM_SECONDS,
        ..HistogramRecorder::default()
    };
    // Thread-local, and the relay's tasks run on this (current) thread.
    let _installed = metrics::set_default_local_recorder(&recorder);
    let store = InMemoryStore::new();
    let raised_early = |aggregate: &str| {
        let mut envelope =
            EventEnvelope::from_event(&outbox_core::testing::TestEvent::new(aggregate)).unwrap();
        envelope.occurred_at -= chrono::Duration::seconds(30);
        store.record_envelope(envelope.clone()).unwrap();
        envelope.id
    };
    raised_early("a");
    raised_early("b");
    let rejected = raised_early("c");
    let publisher = RecordingPublisher::with_behaviour(move |envelope| {
        if envelope.id == rejected {
            PublishOutcome::rejected("refused")
        } else {
            PublishOutcome::Acked
        }
    });
    let (relay, _) = new_relay(&store, &publisher, RetryPolicy::default().max_attempts(1));
    run_until(relay, &store, |s| {
        s.records()
            .iter()
            .all(|r| matches!(r.status, EventStatus::Sent | EventStatus::Dead))
    })
    .await
    .unwrap();

    let values = recorder.values.0.lock().unwrap().clone();
    assert_eq!(values.len(), 2, "one value per confirmed event: {values:?}");
    for value in values {
        assert!((30.0..90.0).contains(&value), "raised 30 s before: {value}");
    }
}
