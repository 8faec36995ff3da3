//! A broker that keeps its connections open but stops answering: a node
//! frozen with `kill -STOP` (as a hung VM or a long GC pause looks to a
//! client), and a memory alarm raised while a batch is in flight. Each test
//! gets a private RabbitMQ node ([`PrivateRabbit`]), so freezing it touches
//! no other test.
//!
//! What must hold: no publisher call waits beyond its timeouts, a stall
//! spends no attempt, nothing is marked sent that the broker did not route,
//! and everything is delivered once the broker answers again.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use outbox::rabbitmq::LapinPublisher;
use outbox::testing::InMemoryStore;
use outbox::{
    DomainEvent, EventEnvelope, EventStatus, OutboxStore, PublishOutcome, Publisher, Relay,
    RetryPolicy,
};
use outbox_testkit::amqp::TestBroker;
use outbox_testkit::servers::PrivateRabbit;
use uuid::Uuid;

use outbox_tests::test_logs as logs;

async fn private_rabbit() -> Arc<PrivateRabbit> {
    Arc::new(
        tokio::task::spawn_blocking(PrivateRabbit::start)
            .await
            .unwrap(),
    )
}

/// The exchange and a queue bound to it for `binding`, on the private node;
/// deleted on drop.
struct Topology {
    broker: TestBroker,
    exchange: String,
    queue: String,
}

impl Topology {
    async fn new(rabbit: &PrivateRabbit, test: &str, binding: &str) -> Topology {
        let broker = TestBroker::on(&rabbit.url(), test).await;
        let exchange = broker.topic_exchange(&broker.named("x")).await;
        let queue = broker.queue(&broker.named("q")).await;
        broker.bind(&queue, &exchange, binding).await;
        Topology {
            broker,
            exchange,
            queue,
        }
    }

    /// The ids of every message in the queue (taken).
    async fn delivered(&self) -> HashSet<Uuid> {
        let mut ids = HashSet::new();
        for message in self.broker.drain(&self.queue).await {
            let id = message.delivery.properties.message_id().as_ref().unwrap();
            ids.insert(Uuid::parse_str(id.as_str()).unwrap());
        }
        ids
    }
}

#[derive(serde::Serialize)]
struct Changed {
    aggregate: String,
    n: u32,
    /// Makes messages large enough to fill the socket buffers.
    padding: String,
    #[serde(skip)]
    event_type: &'static str,
}

impl DomainEvent for Changed {
    fn aggregate_type(&self) -> &'static str {
        "thing"
    }
    fn event_type(&self) -> &'static str {
        self.event_type
    }
    fn aggregate_id(&self) -> String {
        self.aggregate.clone()
    }
}

fn event(aggregate: &str, n: u32, padding: usize, event_type: &'static str) -> Changed {
    Changed {
        aggregate: aggregate.into(),
        n,
        padding: "x".repeat(padding),
        event_type,
    }
}

fn envelope(n: u32, padding: usize) -> EventEnvelope {
    EventEnvelope::from_event(&event(&format!("a{n}"), n, padding, "thing.changed")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_broker_holds_no_publish_beyond_its_timeouts() {
    logs();
    let rabbit = private_rabbit().await;
    let topology = Topology::new(&rabbit, "stall_calls", "#").await;
    let publisher = LapinPublisher::builder(rabbit.url())
        .exchange(&topology.exchange)
        .connection_name("stall_calls.relay")
        .confirm_timeout(Duration::from_secs(2))
        .operation_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let warm = envelope(0, 10);
    assert_eq!(
        publisher.publish(&[&warm], None).await,
        [PublishOutcome::Acked]
    );

    // A publisher with a long confirm timeout, for the claim's deadline.
    let patient = LapinPublisher::builder(rabbit.url())
        .exchange(&topology.exchange)
        .connection_name("stall_calls.patient")
        .confirm_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let warm = envelope(0, 10);
    assert_eq!(
        patient.publish(&[&warm], None).await,
        [PublishOutcome::Acked]
    );

    let frozen = rabbit.freeze();
    // Several batches at once, as the relay's loops do: one takes the idle
    // channel, the others need new channels (channel.open is never
    // answered); a large one fills the socket buffers, so basic_publish
    // itself blocks.
    let small: Vec<EventEnvelope> = (1..4).map(|n| envelope(n, 10)).collect();
    let large: Vec<EventEnvelope> = (10..410).map(|n| envelope(n, 64 * 1024)).collect();
    let publishing = async {
        let smalls = futures_util::future::join_all(small.iter().map(|e| {
            let publisher = publisher.clone();
            async move { publisher.publish(&[e], None).await }
        }));
        let large_refs: Vec<&EventEnvelope> = large.iter().collect();
        tokio::join!(smalls, publisher.publish(&large_refs, None))
    };
    // The node stays frozen until every call is back: each must return
    // within its own timeouts, not wait for a thaw.
    let (smalls, large_outcomes) = tokio::time::timeout(Duration::from_secs(20), publishing)
        .await
        .expect("publishes to a frozen broker return within their timeouts, not after the thaw");
    let outcomes: Vec<&PublishOutcome> = smalls.iter().flatten().chain(&large_outcomes).collect();
    for outcome in &outcomes {
        assert!(
            matches!(
                outcome,
                PublishOutcome::Unconfirmed { .. } | PublishOutcome::ConnectionLost { .. }
            ),
            "a frozen broker confirms nothing and spends no attempt: {outcome:?}"
        );
    }
    // The relay passes its claim's deadline: the confirm wait ends there,
    // not after the 60 s confirm timeout.
    let claim_ends = std::time::Instant::now() + Duration::from_secs(1);
    let deadline_bound = envelope(500, 10);
    let outcome = tokio::time::timeout(
        Duration::from_secs(8),
        patient.publish(&[&deadline_bound], Some(claim_ends)),
    )
    .await
    .expect("the claim's deadline bounds the confirm wait");
    assert!(
        matches!(outcome[..], [PublishOutcome::Unconfirmed { .. }]),
        "{outcome:?}"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    drop(frozen);

    // Once it answers again, publishing works again (after the connection
    // the publisher dropped is replaced).
    let after = envelope(1000, 10);
    let mut acked = false;
    for _ in 0..60 {
        if publisher.publish(&[&after], None).await == [PublishOutcome::Acked] {
            acked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(acked, "the publisher recovers after the thaw");
    assert!(topology.delivered().await.contains(&after.id));
}

/// The relay's view of one stall.
enum Fault {
    /// The node frozen (SIGSTOP) for this long.
    Freeze(Duration),
    /// A memory alarm (every publishing connection blocked) for this long.
    MemoryAlarm(Duration),
}

/// Runs a relay (in-memory store, the library's publisher on a private
/// node) through `fault`, raised while it drains a backlog of large events
/// and producers keep recording, some of an event type no queue is bound
/// for. Then checks: no routable event spent an attempt; nothing unroutable
/// was marked sent; everything marked sent was delivered; every routable
/// event was delivered after the broker came back.
async fn relay_through(test: &str, fault: Fault) {
    logs();
    let rabbit = private_rabbit().await;
    let topology = Topology::new(&rabbit, test, "thing.changed").await;
    let store = InMemoryStore::new();
    let mut n = 0u32;
    let mut record = move |store: &InMemoryStore, padding: usize| {
        n += 1;
        let kind = if n.is_multiple_of(10) {
            "thing.ignored"
        } else {
            "thing.changed"
        };
        store
            .record(&event(&format!("a{}", n % 40), n, padding, kind))
            .unwrap();
    };
    for _ in 0..2000 {
        record(&store, 8 * 1024);
    }
    let publisher = LapinPublisher::builder(rabbit.url())
        .exchange(&topology.exchange)
        .connection_name(format!("{test}.relay"))
        .confirm_timeout(Duration::from_secs(3))
        .operation_timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let relay = Relay::builder(store.clone(), publisher)
        .batch_size(50)
        .poll_interval(Duration::from_millis(50))
        .pause(Duration::from_millis(100), Duration::from_secs(2))
        .retry(
            RetryPolicy::default()
                .base_delay(Duration::from_millis(200))
                .max_delay(Duration::from_secs(2))
                .max_attempts(1000),
        )
        .build()
        .unwrap();
    let handle = relay.handle();
    let running = tokio::spawn(relay.run());
    // The fault comes while batches are in flight.
    while store
        .records()
        .iter()
        .all(|r| r.status != EventStatus::Sent)
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let producing = {
        let store = store.clone();
        let stop = handle.clone();
        tokio::spawn(async move {
            while !stop.is_shutdown() {
                record(&store, 1024);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    match fault {
        Fault::Freeze(how_long) => {
            let rabbit = Arc::clone(&rabbit);
            let frozen = tokio::task::spawn_blocking(move || rabbit.freeze())
                .await
                .unwrap();
            tokio::time::sleep(how_long).await;
            drop(frozen);
        }
        Fault::MemoryAlarm(how_long) => {
            let ctl = |args: &'static [&'static str]| {
                let rabbit = Arc::clone(&rabbit);
                tokio::task::spawn_blocking(move || rabbit.ctl(args))
            };
            ctl(&["set_vm_memory_high_watermark", "0.0001"])
                .await
                .unwrap();
            tokio::time::sleep(how_long).await;
            ctl(&["set_vm_memory_high_watermark", "0.4"]).await.unwrap();
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    producing.abort();
    let _ = producing.await;
    let routable = |r: &outbox::OutboxRecord| r.envelope.event_type == "thing.changed";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !store
        .records()
        .iter()
        .filter(|r| routable(r))
        .all(|r| r.status == EventStatus::Sent)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "routable events still unsent 120 s after the fault: {:?}",
            store.stats().await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    handle.shutdown();
    running.await.unwrap();

    let records = store.records();
    let delivered = topology.delivered().await;
    let spent: Vec<_> = records
        .iter()
        .filter(|r| routable(r) && r.attempts > 0)
        .map(|r| (r.id(), r.attempts, r.last_error.clone()))
        .collect();
    assert!(
        spent.is_empty(),
        "a stalled broker spent attempts of {} routable events, e.g. {:?}",
        spent.len(),
        spent.first()
    );
    for record in &records {
        if routable(record) {
            assert!(
                delivered.contains(&record.id()),
                "routable event {} was marked sent but never delivered",
                record.id()
            );
        } else {
            assert_ne!(
                record.status,
                EventStatus::Sent,
                "an unroutable event was marked sent: {:?}",
                record.last_error
            );
        }
    }
    assert!(records.len() > 2000, "producers kept recording");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_frozen_for_30_s_spends_no_attempt_and_loses_nothing() {
    relay_through("stall_freeze", Fault::Freeze(Duration::from_secs(30))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_alarm_raised_mid_batch_spends_no_attempt_and_loses_nothing() {
    relay_through("stall_alarm", Fault::MemoryAlarm(Duration::from_secs(10))).await;
}
