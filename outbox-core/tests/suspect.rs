//! Isolating a message after which the broker connection dies: suspects are
//! counted in the row, published alone, and parked `Dead` at the limit.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::testing::{InMemoryStore, RecordingPublisher, TestEvent, run_until};
use outbox_core::{
    Claim, DeadSelector, EventEnvelope, EventStatus, OutboxStore, PublishOutcome, Publisher, Relay,
};
use uuid::Uuid;

fn record(store: &InMemoryStore, aggregate: &str, n: u32) -> Uuid {
    store
        .record(&TestEvent::new(aggregate).field("n", n))
        .unwrap()
}

/// A publisher in front of a [`RecordingPublisher`] whose "connection"
/// dies whenever a call carries the poison event: every message of that
/// call is `ConnectionDied`. Each call takes 10 ms (tokio time), and the
/// publisher checks that no other call is in flight while the poison is
/// published after its first death (it must be alone).
#[derive(Clone)]
struct Killer {
    recorder: RecordingPublisher,
    poison: Uuid,
    in_flight: Arc<AtomicUsize>,
    solo: Arc<AtomicBool>,
    violations: Arc<AtomicUsize>,
    /// Size of every call that carried the poison, in order.
    poison_calls: Arc<Mutex<Vec<usize>>>,
}

impl Killer {
    fn new(poison: Uuid) -> Self {
        let recorder = RecordingPublisher::new();
        recorder.set_batch_behaviour(move |events| {
            if events.iter().any(|e| e.id == poison) {
                events
                    .iter()
                    .map(|_| PublishOutcome::connection_died("connection reset by peer"))
                    .collect()
            } else {
                events.iter().map(|_| PublishOutcome::Acked).collect()
            }
        });
        Killer {
            recorder,
            poison,
            in_flight: Arc::default(),
            solo: Arc::default(),
            violations: Arc::default(),
            poison_calls: Arc::default(),
        }
    }

    fn poison_calls(&self) -> Vec<usize> {
        self.poison_calls.lock().unwrap().clone()
    }
}

impl Publisher for Killer {
    async fn publish(
        &self,
        events: &[&EventEnvelope],
        deadline: Option<Instant>,
    ) -> Vec<PublishOutcome> {
        let poisoned = events.iter().any(|e| e.id == self.poison);
        let concurrent = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        if self.solo.load(Ordering::SeqCst) {
            // Another call started while the suspect was alone in flight.
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        let alone = poisoned && {
            let mut calls = self.poison_calls.lock().unwrap();
            calls.push(events.len());
            calls.len() > 1
        };
        if alone {
            if concurrent > 1 || events.len() > 1 {
                self.violations.fetch_add(1, Ordering::SeqCst);
            }
            self.solo.store(true, Ordering::SeqCst);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        let outcomes = self.recorder.publish(events, deadline).await;
        if alone {
            self.solo.store(false, Ordering::SeqCst);
        }
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        outcomes
    }
}

fn relay<P: Publisher>(store: &InMemoryStore, publisher: P) -> Relay<InMemoryStore, P> {
    Relay::builder(store.clone(), publisher)
        .batch_size(10)
        .concurrency(2)
        .poll_interval(Duration::from_millis(5))
        .pause(Duration::from_millis(20), Duration::from_millis(50))
        .build()
        .unwrap()
}

/// Healthy events of several aggregates, and a poison event (`p`, 0) with
/// two later events of its aggregate, the poison among the first events of
/// the others (so that it first goes out in a wave with them). Returns
/// (poison, its followers).
fn poisoned_outbox(store: &InMemoryStore) -> (Uuid, [Uuid; 2]) {
    for a in 0..6 {
        record(store, &format!("a{a}"), 0);
    }
    let poison = record(store, "p", 0);
    let followers = [record(store, "p", 1), record(store, "p", 2)];
    // Other aggregates, enough for the relay's other loop to keep
    // publishing meanwhile.
    for n in 0..10 {
        for a in 6..30 {
            record(store, &format!("a{a}"), n);
        }
    }
    (poison, followers)
}

fn settled(poison: Uuid) -> impl Fn(&InMemoryStore) -> bool {
    move |store| {
        store
            .records()
            .iter()
            .all(|r| r.status == EventStatus::Sent || r.envelope.aggregate_id == "p")
            && store.get(poison).unwrap().status == EventStatus::Dead
    }
}

#[tokio::test(start_paused = true)]
async fn a_message_that_kills_the_connection_is_published_alone_then_parked_dead() {
    let store = InMemoryStore::new();
    let (poison, followers) = poisoned_outbox(&store);
    let publisher = Killer::new(poison);
    run_until(relay(&store, publisher.clone()), &store, settled(poison))
        .await
        .unwrap();

    let dead = store.get(poison).unwrap();
    assert_eq!(dead.status, EventStatus::Dead);
    assert_eq!(dead.suspect_count, 3, "the default suspect limit is 3");
    assert_eq!(dead.attempts, 0, "a dead connection spends no attempt");
    let reason = dead.last_error.unwrap();
    assert!(
        reason.contains("died 3 times") && reason.contains("alone"),
        "{reason}"
    );
    assert!(reason.contains("connection reset by peer"), "{reason}");
    for id in followers {
        let follower = store.get(id).unwrap();
        assert_ne!(follower.status, EventStatus::Sent, "order: it waits");
        assert!(!publisher.recorder.published_ids().contains(&id));
        assert!(
            !publisher
                .recorder
                .attempts()
                .iter()
                .any(|attempt| attempt.id == id),
            "a later event of the suspect's aggregate is never sent before it"
        );
    }
    // Its first death was in a batch; after that it went alone, twice.
    let calls = publisher.poison_calls();
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(calls[0] > 1, "{calls:?}");
    assert_eq!(&calls[1..], [1, 1]);
    assert_eq!(
        publisher.violations.load(Ordering::SeqCst),
        0,
        "a suspect is the only message in flight on the relay's publisher"
    );
    // Bystanders of the first death were suspects too, went alone once and
    // were sent; every healthy event went out once, in aggregate order.
    let published = publisher.recorder.published_ids();
    let mut per_aggregate: HashMap<String, Vec<i64>> = HashMap::new();
    for record in store.records() {
        if record.envelope.aggregate_id != "p" {
            assert_eq!(record.status, EventStatus::Sent);
            assert_eq!(record.attempts, 0);
            assert!(record.suspect_count <= 1);
        }
    }
    for id in &published {
        let record = store.get(*id).unwrap();
        per_aggregate
            .entry(record.envelope.aggregate_id.clone())
            .or_default()
            .push(record.seq);
    }
    assert_eq!(
        published.len(),
        6 + 24 * 10,
        "each healthy event published once"
    );
    for (aggregate, seqs) in per_aggregate {
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "{aggregate}: {seqs:?}"
        );
    }
    let bystanders = store
        .records()
        .iter()
        .filter(|r| r.suspect_count == 1)
        .count();
    assert!(
        bystanders >= 1,
        "the first batch's messages became suspects"
    );

    // A replay lowers the count to 1: the event is published alone first,
    // and parked again only after as many deaths as the limit allows.
    assert_eq!(
        store.replay_dead(DeadSelector::Id(poison)).await.unwrap(),
        1
    );
    let replayed = store.get(poison).unwrap();
    assert_eq!(replayed.suspect_count, 1);
    assert_eq!(replayed.status, EventStatus::Pending);
}

#[tokio::test(start_paused = true)]
async fn another_relay_sees_the_count_in_the_row_and_sends_the_suspect_alone() {
    let store = InMemoryStore::new();
    let (poison, _) = poisoned_outbox(&store);
    // The first relay sees the connection die once with the poison in a
    // batch, then stops.
    let first = Killer::new(poison);
    run_until(relay(&store, first.clone()), &store, move |store| {
        store.get(poison).unwrap().suspect_count >= 1
    })
    .await
    .unwrap();
    let first_calls = first.poison_calls();
    assert!(first_calls[0] > 1, "{first_calls:?}");
    assert_eq!(store.get(poison).unwrap().status, EventStatus::Pending);

    // A second relay (its own publisher and connection) never sends it in
    // a batch.
    let second = Killer::new(poison);
    run_until(relay(&store, second.clone()), &store, settled(poison))
        .await
        .unwrap();
    // (The first relay may have sent it alone once more while stopping.)
    let second_calls = second.poison_calls();
    assert!(!second_calls.is_empty() && second_calls.iter().all(|&n| n == 1));
    assert_eq!(first_calls.len() + second_calls.len(), 3);
    assert_eq!(second.violations.load(Ordering::SeqCst), 0);
    assert_eq!(store.get(poison).unwrap().suspect_count, 3);
}

#[tokio::test(start_paused = true)]
async fn a_suspect_that_goes_through_alone_is_sent_and_unblocks_its_aggregate() {
    let store = InMemoryStore::new();
    let (poison, followers) = poisoned_outbox(&store);
    // The connection dies once with the poison in a batch (a broker crash,
    // say); alone, it is accepted.
    let publisher = RecordingPublisher::new();
    let deaths = Arc::new(AtomicUsize::new(0));
    publisher.set_batch_behaviour({
        let deaths = Arc::clone(&deaths);
        move |events| {
            if events.len() > 1
                && events.iter().any(|e| e.id == poison)
                && deaths.fetch_add(1, Ordering::SeqCst) == 0
            {
                events
                    .iter()
                    .map(|_| PublishOutcome::connection_died("EOF"))
                    .collect()
            } else {
                events.iter().map(|_| PublishOutcome::Acked).collect()
            }
        }
    });
    run_until(relay(&store, publisher.clone()), &store, |store| {
        store
            .records()
            .iter()
            .all(|r| r.status == EventStatus::Sent)
    })
    .await
    .unwrap();
    let sent = store.get(poison).unwrap();
    assert_eq!(sent.suspect_count, 1);
    assert_eq!(sent.attempts, 0);
    let published = publisher.published_ids();
    let at = |id: Uuid| published.iter().position(|p| *p == id).unwrap();
    assert!(at(poison) < at(followers[0]) && at(followers[0]) < at(followers[1]));
}

#[tokio::test(start_paused = true)]
async fn a_lost_connection_makes_nothing_suspect() {
    let store = InMemoryStore::new();
    for n in 0..10 {
        record(&store, &format!("a{}", n % 3), n);
    }
    let publisher = RecordingPublisher::new();
    let lost = Arc::new(AtomicUsize::new(0));
    publisher.set_batch_behaviour({
        let lost = Arc::clone(&lost);
        move |events| {
            let outcome = if lost.fetch_add(1, Ordering::SeqCst) < 3 {
                PublishOutcome::connection_lost("320 CONNECTION_FORCED")
            } else {
                PublishOutcome::Acked
            };
            events.iter().map(|_| outcome.clone()).collect()
        }
    });
    run_until(relay(&store, publisher.clone()), &store, |store| {
        store
            .records()
            .iter()
            .all(|r| r.status == EventStatus::Sent)
    })
    .await
    .unwrap();
    assert!(store.records().iter().all(|r| r.suspect_count == 0));
}

#[test]
fn a_suspect_limit_below_two_is_rejected() {
    for limit in [0, 1] {
        let err = Relay::builder(InMemoryStore::new(), RecordingPublisher::new())
            .suspect_limit(limit)
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("suspect_limit"), "{err}");
    }
}

#[tokio::test(start_paused = true)]
async fn suspects_go_first_and_wait_for_a_later_batch_after_one_is_not_confirmed() {
    let store = InMemoryStore::new();
    // s1's destination (its event type) has a stuck queue.
    let s1 = store
        .record(&TestEvent::new("s1").of_type("thing", "thing.stuck"))
        .unwrap();
    let s2 = record(&store, "s2", 0);
    let healthy: Vec<Uuid> = (0..5)
        .map(|n| record(&store, &format!("h{n}"), 0))
        .collect();
    // Both are suspects already (the connection died under them before).
    let mut claim = store.claim(100).await.unwrap().unwrap();
    let suspects: Vec<i64> = claim
        .records()
        .iter()
        .filter(|r| r.id() == s1 || r.id() == s2)
        .map(|r| r.seq)
        .collect();
    assert_eq!(suspects.len(), 2);
    claim
        .mark_suspect(&suspects, "earlier death")
        .await
        .unwrap();
    claim.finish().await.unwrap();
    // The broker does not confirm s1 (its queue is stuck); the rest is acked.
    let calls: Arc<Mutex<Vec<Vec<Uuid>>>> = Arc::default();
    let publisher = RecordingPublisher::new();
    publisher.set_batch_behaviour({
        let calls = Arc::clone(&calls);
        move |events| {
            calls
                .lock()
                .unwrap()
                .push(events.iter().map(|e| e.id).collect());
            events
                .iter()
                .map(|e| {
                    if e.id == s1 {
                        PublishOutcome::unconfirmed("no confirm in time")
                    } else {
                        PublishOutcome::Acked
                    }
                })
                .collect()
        }
    });
    let relay = Relay::builder(store.clone(), publisher)
        .batch_size(10)
        .concurrency(1)
        .poll_interval(Duration::from_millis(5))
        .build()
        .unwrap();
    run_until(relay, &store, move |store| {
        healthy
            .iter()
            .chain([&s2])
            .all(|id| store.get(*id).unwrap().status == EventStatus::Sent)
    })
    .await
    .unwrap();
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls[0], vec![s1], "a suspect goes first, alone: {calls:?}");
    assert!(
        calls[1].len() > 1 && !calls[1].contains(&s2),
        "after s1 was not confirmed, s2 waits for a later batch and the shared call goes: \
         {calls:?}"
    );
    assert!(
        calls
            .iter()
            .filter(|c| c.contains(&s2))
            .all(|c| c == &vec![s2]),
        "s2 is only ever published alone: {calls:?}"
    );
    let s1_row = store.get(s1).unwrap();
    assert_ne!(s1_row.status, EventStatus::Sent);
    assert_eq!(
        s1_row.attempts, 0,
        "an unconfirmed publish spends no attempt"
    );
    assert!(store.records().iter().all(|r| r.attempts == 0));
}
