//! The relay stopped (panicking) at each named failpoint loses nothing: a
//! fresh relay publishes every event, and only events in flight at the crash
//! may be published twice.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use outbox_core::testing::{InMemoryStore, RecordingPublisher, TestEvent};
use outbox_core::{EventStatus, Relay, failpoints};

/// Event `n`, of one of three aggregates.
fn ping(n: u32) -> TestEvent {
    TestEvent::new((n % 3).to_string())
        .of_type("ping", "ping.sent")
        .field("n", n)
}

const EVENTS: u32 = 25;
const BATCH: usize = 10;

fn relay(
    store: &InMemoryStore,
    publisher: &RecordingPublisher,
) -> Relay<InMemoryStore, RecordingPublisher> {
    Relay::builder(store.clone(), publisher.clone())
        .batch_size(BATCH)
        .poll_interval(Duration::from_millis(5))
        .build()
        .unwrap()
}

/// One scenario per failpoint; `fail`'s registry is global, so they run in
/// one test, one after another.
#[test]
fn a_relay_crashing_at_any_failpoint_loses_nothing() {
    let scenario = fail::FailScenario::setup();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for name in failpoints::ALL {
        let store = InMemoryStore::new();
        for n in 0..EVENTS {
            store.record(&ping(n)).unwrap();
        }
        let publisher = RecordingPublisher::new();

        fail::cfg(name, "1*panic").unwrap();
        let crashed =
            runtime.block_on(async { tokio::spawn(relay(&store, &publisher).run()).await });
        assert!(
            crashed.is_err_and(|e| e.is_panic()),
            "{name}: the relay should have crashed at the failpoint"
        );
        assert_eq!(
            store.claimed(),
            0,
            "{name}: a crashed relay's claim is released"
        );
        let published_before_restart = publisher.published_ids().len();
        fail::remove(name);

        runtime.block_on(async {
            let relay = relay(&store, &publisher);
            let handle = relay.handle();
            let task = tokio::spawn(relay.run());
            tokio::time::timeout(Duration::from_secs(10), async {
                while !store
                    .records()
                    .iter()
                    .all(|r| r.status == EventStatus::Sent)
                {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await
            .unwrap_or_else(|_| panic!("{name}: events left unsent: {:?}", store.records()));
            handle.shutdown();
            task.await.unwrap();
        });

        let acked = publisher.published_ids();
        let mut unique = acked.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(
            unique.len(),
            EVENTS as usize,
            "{name}: every event published"
        );
        let duplicates = acked.len() - unique.len();
        assert!(
            duplicates <= published_before_restart && duplicates <= BATCH,
            "{name}: {duplicates} duplicates; only the crashed batch may repeat"
        );
        let expect_duplicates = matches!(name, failpoints::AFTER_CONFIRM_BEFORE_MARK);
        assert_eq!(
            duplicates > 0,
            expect_duplicates,
            "{name}: {duplicates} duplicates"
        );
        for record in store.records() {
            assert_eq!(record.attempts, 0, "{name}: a crash spends no attempts");
        }
    }
    scenario.teardown();
}
