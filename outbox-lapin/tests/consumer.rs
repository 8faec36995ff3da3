//! `InboxConsumer` and `QueueTopology` against the real RabbitMQ, with the
//! in-memory inbox (the PostgreSQL inbox is tested end to end in the
//! workspace's `tests` crate): malformed messages, retries, dead letters,
//! duplicates, shutdown, per-aggregate order under concurrency, reconnects,
//! the dead-letter queue depth gauge.
//!
//! Each test declares its own exchange and queues, named after the test and
//! the process, and deletes them when it ends, also when it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::message::BasicGetMessage;
use lapin::options::{BasicGetOptions, BasicPublishOptions, QueueDeleteOptions};
use lapin::types::AMQPValue;
use lapin::{BasicProperties, ExchangeKind};
use outbox_core::testing::{InMemoryInbox, InboxTx};
use outbox_lapin::consumer_metrics::DEAD_LETTERS;
use outbox_lapin::wire::{self, header_i64, header_str};
use outbox_lapin::{
    ATTEMPT_HEADER, DEAD_REASON_HEADER, EventHandler, HandlerError, InboxConsumer,
    InboxConsumerBuilder, IncomingEvent, ORIGINAL_ROUTING_KEY_HEADER, QueueTopology, handler_fn,
};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use uuid::Uuid;

use common::{Broker, Running, WAIT, amqp_url, placed};
use outbox_testkit::amqp::{close_connection, connect, connection_pid};

/// This test's broker objects: an exchange and a queue bound with `order.*`
/// and `inventory.#`, with its dead-letter exchange and queue.
async fn broker(test: &str) -> Broker {
    Broker::new("test_consumer", test, &["order.*", "inventory.#"]).await
}

/// What a handler saw.
#[derive(Debug, Clone)]
struct Call {
    event: IncomingEvent,
    at: Instant,
}

#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<Call>>>);

impl Calls {
    /// Records a call; returns how many calls `event.id` has had, this one
    /// included.
    fn record(&self, event: &IncomingEvent) -> usize {
        let mut calls = self.0.lock().unwrap();
        calls.push(Call {
            event: event.clone(),
            at: Instant::now(),
        });
        calls.iter().filter(|c| c.event.id == event.id).count()
    }

    fn all(&self) -> Vec<Call> {
        self.0.lock().unwrap().clone()
    }

    fn of(&self, id: Uuid) -> Vec<Call> {
        self.all()
            .into_iter()
            .filter(|c| c.event.id == id)
            .collect()
    }

    async fn wait_for(&self, what: &str, done: impl Fn(&[Call]) -> bool) {
        let deadline = Instant::now() + WAIT;
        loop {
            if done(&self.all()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {:?}",
                self.all()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A handler that records every call and then behaves as `behave` says,
/// given how many times this event was handled.
fn recording<B>(calls: &Calls, behave: B) -> impl EventHandler<InboxTx> + use<B>
where
    B: Fn(usize, &IncomingEvent) -> Result<(), HandlerError> + Send + Sync + 'static,
{
    let calls = calls.clone();
    let behave = Arc::new(behave);
    handler_fn(move |_tx: &mut InboxTx, event: &IncomingEvent| {
        let calls = calls.clone();
        let behave = behave.clone();
        Box::pin(async move {
            let n = calls.record(event);
            behave(n, event)
        })
    })
}

fn dead_reason(message: &BasicGetMessage) -> String {
    let headers = message.properties.headers().as_ref().expect("headers");
    header_str(headers, DEAD_REASON_HEADER)
        .expect("x-outbox-dead-reason")
        .to_owned()
}

#[tokio::test]
async fn malformed_messages_are_dead_lettered_and_the_consumer_keeps_going() {
    let broker = broker("malformed").await;
    let inbox = InMemoryInbox::new();
    let calls = Calls::default();
    let consumer = broker
        .consumer(inbox.clone(), recording(&calls, |_, _| Ok(())))
        .build()
        .unwrap();
    let running = Running::start(consumer);

    let valid = placed("o-1", 1);
    let good = wire::properties(&valid, "/tests");
    // 1. Not JSON, otherwise a proper event.
    broker
        .publish_raw(
            "order.placed",
            b"not json {",
            good.clone()
                .with_message_id(Uuid::now_v7().to_string().into()),
        )
        .await;
    // 2. JSON, but no message_id.
    let no_id = BasicProperties::default()
        .with_type("order.placed".into())
        .with_headers(good.headers().clone().unwrap());
    broker
        .publish_raw("order.placed", br#"{"n":2}"#, no_id)
        .await;
    // 3. message_id and type, but no aggregate headers.
    let no_headers_id = Uuid::now_v7().to_string();
    let no_headers = BasicProperties::default()
        .with_message_id(no_headers_id.as_str().into())
        .with_type("inventory.reserved".into())
        .with_content_type("application/json".into());
    broker
        .publish_raw("inventory.reserved", br#"{"n":3}"#, no_headers)
        .await;
    // 4. A valid event after them.
    broker.publish(&valid).await;

    calls
        .wait_for("the valid event", |c| {
            c.iter().any(|c| c.event.id == valid.id)
        })
        .await;
    let dead = broker.dead_letters(3).await;
    running.stop().await;

    assert_eq!(
        calls.all().len(),
        1,
        "the handler ran only for the valid event"
    );
    assert_eq!(inbox.len(), 1);
    let reasons: Vec<String> = dead.iter().map(dead_reason).collect();
    assert!(reasons[0].contains("not JSON"), "{reasons:?}");
    assert!(reasons[1].contains("message_id"), "{reasons:?}");
    assert!(reasons[2].contains("aggregate_type"), "{reasons:?}");
    // Republished unchanged: body, routing key and properties.
    assert_eq!(dead[0].data, b"not json {");
    assert_eq!(dead[0].routing_key.as_str(), "order.placed");
    assert_eq!(dead[1].data, br#"{"n":2}"#);
    assert_eq!(dead[2].data, br#"{"n":3}"#);
    assert_eq!(dead[2].routing_key.as_str(), "inventory.reserved");
    assert_eq!(
        dead[2].properties.message_id().as_ref().unwrap().as_str(),
        no_headers_id
    );
    assert_eq!(
        dead[0]
            .properties
            .headers()
            .as_ref()
            .unwrap()
            .inner()
            .get("aggregate_id"),
        good.headers().as_ref().unwrap().inner().get("aggregate_id")
    );
    assert_eq!(
        broker.ready(broker.queue()).await,
        0,
        "nothing left in the queue"
    );
}

#[tokio::test]
async fn a_handler_that_always_fails_is_dead_lettered_after_max_attempts() {
    let broker = broker("always_fails").await;
    let inbox = InMemoryInbox::new();
    let calls = Calls::default();
    let delay = Duration::from_millis(300);
    let consumer = broker
        .consumer(
            inbox.clone(),
            recording(&calls, |n, _| Err(HandlerError::new(format!("boom #{n}")))),
        )
        .max_attempts(3)
        .retry_delay(delay)
        .build()
        .unwrap();
    let running = Running::start(consumer);

    let event = placed("o-1", 1);
    broker.publish(&event).await;
    let dead = broker.dead_letters(1).await;
    // Give a wrong extra attempt the time to show up.
    tokio::time::sleep(delay * 2).await;
    running.stop().await;

    let attempts = calls.of(event.id);
    assert_eq!(attempts.len(), 3, "exactly max_attempts calls");
    for pair in attempts.windows(2) {
        let gap = pair[1].at - pair[0].at;
        assert!(
            gap >= delay,
            "attempts {gap:?} apart, less than the retry delay"
        );
    }
    assert!(
        attempts
            .iter()
            .all(|c| c.event.routing_key == "order.placed"),
        "retries keep the original routing key"
    );
    assert!(
        inbox.is_empty(),
        "every attempt rolled back its inbox entry"
    );
    let message = &dead[0];
    assert_eq!(dead_reason(message), "boom #3");
    let headers = message.properties.headers().as_ref().unwrap();
    assert_eq!(header_i64(headers, ATTEMPT_HEADER), Some(3));
    assert_eq!(
        header_str(headers, ORIGINAL_ROUTING_KEY_HEADER),
        Some("order.placed")
    );
    assert_eq!(message.routing_key.as_str(), "order.placed");
    assert_eq!(message.data, event.payload.as_bytes());
    assert_eq!(
        message.properties.message_id().as_ref().unwrap().as_str(),
        event.id.to_string()
    );
    assert_eq!(broker.ready(broker.queue()).await, 0);
}

#[tokio::test]
async fn a_handler_that_fails_twice_then_succeeds_takes_effect_once() {
    let broker = broker("fails_twice").await;
    let inbox = InMemoryInbox::new();
    let calls = Calls::default();
    let effects = Arc::new(Mutex::new(Vec::<Uuid>::new()));
    let event = placed("o-1", 1);
    let sentinel = placed("o-2", 1);
    let flaky = event.id;
    let handler = {
        let calls = calls.clone();
        let effects = effects.clone();
        handler_fn(move |_tx: &mut InboxTx, event: &IncomingEvent| {
            let calls = calls.clone();
            let effects = effects.clone();
            Box::pin(async move {
                match calls.record(event) {
                    1 if event.id == flaky => Err(HandlerError::new("database busy")),
                    2 if event.id == flaky => panic!("handler bug"),
                    _ => {
                        effects.lock().unwrap().push(event.id);
                        Ok(())
                    }
                }
            })
        })
    };
    let consumer = broker
        .consumer(inbox.clone(), handler)
        .retry_delay(Duration::from_millis(100))
        .build()
        .unwrap();
    let running = Running::start(consumer);

    broker.publish(&event).await;
    calls
        .wait_for("the third attempt", |c| {
            c.iter().filter(|c| c.event.id == event.id).count() == 3
        })
        .await;
    // Handled after the success was acked (one worker, in order).
    broker.publish(&sentinel).await;
    calls
        .wait_for("the sentinel", |c| {
            c.iter().any(|c| c.event.id == sentinel.id)
        })
        .await;
    running.stop().await;

    assert_eq!(
        *effects.lock().unwrap(),
        [event.id, sentinel.id],
        "one effect each"
    );
    assert_eq!(
        calls.of(event.id).len(),
        3,
        "a panic counts as a failed attempt"
    );
    assert_eq!(inbox.len(), 2);
    assert_eq!(broker.ready(broker.queue()).await, 0, "acked");
    assert_eq!(
        broker.ready(broker.dead_letter_queue()).await,
        0,
        "not dead"
    );
}

#[tokio::test]
async fn a_permanent_error_is_dead_lettered_at_once() {
    let broker = broker("permanent").await;
    let calls = Calls::default();
    let consumer = broker
        .consumer(
            InMemoryInbox::new(),
            recording(&calls, |_, _| {
                Err(HandlerError::permanent("unknown product"))
            }),
        )
        .retry_delay(Duration::from_millis(100))
        .build()
        .unwrap();
    let running = Running::start(consumer);

    let event = placed("o-1", 1);
    broker.publish(&event).await;
    let dead = broker.dead_letters(1).await;
    running.stop().await;

    assert_eq!(calls.of(event.id).len(), 1, "no retries");
    assert_eq!(dead_reason(&dead[0]), "unknown product");
    let headers = dead[0].properties.headers().as_ref().unwrap();
    assert_eq!(header_i64(headers, ATTEMPT_HEADER), Some(1));
}

#[tokio::test]
async fn the_same_message_twice_runs_the_handler_once() {
    let broker = broker("duplicate").await;
    let inbox = InMemoryInbox::new();
    let calls = Calls::default();
    let consumer = broker
        .consumer(inbox.clone(), recording(&calls, |_, _| Ok(())))
        .build()
        .unwrap();
    let running = Running::start(consumer);

    let event = placed("o-1", 1);
    let sentinel = placed("o-1", 2);
    broker.publish(&event).await;
    broker.publish(&event).await;
    broker.publish(&sentinel).await;
    calls
        .wait_for("the sentinel", |c| {
            c.iter().any(|c| c.event.id == sentinel.id)
        })
        .await;
    running.stop().await;

    let ids: Vec<Uuid> = calls.all().iter().map(|c| c.event.id).collect();
    assert_eq!(
        ids,
        [event.id, sentinel.id],
        "the copy was dropped, in order"
    );
    assert_eq!(inbox.len(), 2);
    assert_eq!(
        broker.ready(broker.queue()).await,
        0,
        "the copy was acked too"
    );
}

#[tokio::test]
async fn graceful_shutdown_finishes_the_in_flight_delivery() {
    let broker = broker("shutdown").await;
    let inbox = InMemoryInbox::new();
    let started = Arc::new(tokio::sync::Notify::new());
    let finished = Arc::new(Mutex::new(Vec::<Uuid>::new()));
    let handler = {
        let started = started.clone();
        let finished = finished.clone();
        handler_fn(move |_tx: &mut InboxTx, event: &IncomingEvent| {
            let started = started.clone();
            let finished = finished.clone();
            Box::pin(async move {
                started.notify_one();
                tokio::time::sleep(Duration::from_millis(700)).await;
                finished.lock().unwrap().push(event.id);
                Ok(())
            })
        })
    };
    let consumer = broker.consumer(inbox.clone(), handler).build().unwrap();
    let running = Running::start(consumer);

    let first = placed("o-1", 1);
    let second = placed("o-1", 2);
    broker.publish(&first).await;
    broker.publish(&second).await;
    tokio::time::timeout(WAIT, started.notified())
        .await
        .expect("the first delivery starts");
    let stopping = Instant::now();
    running.stop().await;

    assert!(
        stopping.elapsed() >= Duration::from_millis(300),
        "run waited for the handler"
    );
    assert_eq!(
        *finished.lock().unwrap(),
        [first.id],
        "in-flight finished, next not started"
    );
    assert_eq!(inbox.len(), 1, "and committed");
    assert_eq!(
        broker.ready(broker.queue()).await,
        1,
        "the first was acked, the second went back to the queue"
    );
}

#[tokio::test]
async fn concurrency_keeps_each_aggregate_in_order() {
    let broker = broker("concurrency").await;
    let inbox = InMemoryInbox::new();
    #[derive(Default)]
    struct Seen {
        running: usize,
        max_running: usize,
        per_aggregate: HashMap<String, usize>,
        overlapping_aggregate: Option<String>,
        order: BTreeMap<String, Vec<u32>>,
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let handler = {
        let seen = seen.clone();
        handler_fn(move |_tx: &mut InboxTx, event: &IncomingEvent| {
            let seen = seen.clone();
            Box::pin(async move {
                let aggregate = event.aggregate_id.clone();
                {
                    let mut seen = seen.lock().unwrap();
                    seen.running += 1;
                    seen.max_running = seen.max_running.max(seen.running);
                    let same = seen.per_aggregate.entry(aggregate.clone()).or_default();
                    *same += 1;
                    if *same > 1 {
                        seen.overlapping_aggregate = Some(aggregate.clone());
                    }
                }
                // Uneven work: a spread that ignored aggregates would let a
                // later event of the slow aggregate overtake an earlier one.
                let ms = if aggregate == "o-0" { 100 } else { 10 };
                tokio::time::sleep(Duration::from_millis(ms)).await;
                let payload: serde_json::Value = event.payload_as()?;
                let n = u32::try_from(payload["n"].as_u64().unwrap()).unwrap();
                let mut seen = seen.lock().unwrap();
                seen.order.entry(aggregate.clone()).or_default().push(n);
                seen.running -= 1;
                *seen.per_aggregate.get_mut(&aggregate).unwrap() -= 1;
                Ok(())
            })
        })
    };
    let consumer = broker
        .consumer(inbox.clone(), handler)
        .concurrency(4)
        .prefetch(64)
        .build()
        .unwrap();

    // 10 aggregates × 6 events, interleaved, published before consuming (a
    // count that a round-robin spread would split across workers).
    let aggregates: Vec<String> = (0..10).map(|i| format!("o-{i}")).collect();
    for n in 0..6 {
        for aggregate in &aggregates {
            broker.publish(&placed(aggregate, n)).await;
        }
    }
    let running = Running::start(consumer);
    let deadline = Instant::now() + WAIT;
    while inbox.len() < 60 {
        assert!(
            Instant::now() < deadline,
            "handled only {} of 60",
            inbox.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    running.stop().await;

    let seen = seen.lock().unwrap();
    assert_eq!(
        seen.overlapping_aggregate, None,
        "one aggregate's events never overlap"
    );
    for aggregate in &aggregates {
        assert_eq!(
            seen.order[aggregate],
            [0, 1, 2, 3, 4, 5],
            "order of {aggregate}"
        );
    }
    assert!(
        (2..=4).contains(&seen.max_running),
        "different aggregates overlap, at most 4 at once: {}",
        seen.max_running
    );
}

#[tokio::test]
async fn the_consumer_reconnects_after_its_connection_is_closed() {
    let broker = broker("reconnect").await;
    let calls = Calls::default();
    let name = broker.consumer_name();
    let consumer = InboxConsumer::builder(
        amqp_url(),
        broker.queue(),
        &name,
        InMemoryInbox::new(),
        recording(&calls, |_, _| Ok(())),
    )
    .build()
    .unwrap();
    let running = Running::start(consumer);

    let before = placed("o-1", 1);
    broker.publish(&before).await;
    calls.wait_for("the first event", |c| c.len() == 1).await;
    let pid = connection_pid(&name).expect("the consumer's connection is listed by name");
    assert_eq!(
        close_connection(&name),
        1,
        "test: simulated connection loss"
    );

    let after = placed("o-1", 2);
    broker.publish(&after).await;
    calls
        .wait_for("the event after the reconnect", |c| c.len() == 2)
        .await;
    let reconnected = tokio::task::spawn_blocking(move || connection_pid(&name))
        .await
        .unwrap();
    assert!(
        reconnected.is_some() && reconnected != Some(pid),
        "a new connection under the same name: {reconnected:?}"
    );
    running.stop().await;
    let ids: Vec<Uuid> = calls.all().iter().map(|c| c.event.id).collect();
    assert_eq!(ids, [before.id, after.id]);
}

#[tokio::test]
async fn a_missing_queue_or_dead_letter_exchange_stops_run_with_an_error() {
    let broker = broker("missing").await;
    let missing_queue = InboxConsumer::builder(
        amqp_url(),
        format!("{}.nope", broker.queue()),
        broker.consumer_name(),
        InMemoryInbox::new(),
        recording(&Calls::default(), |_, _| Ok(())),
    )
    .dead_letter_exchange(broker.topology.dead_letter_exchange_name().unwrap())
    .build()
    .unwrap();
    let err = tokio::time::timeout(WAIT, missing_queue.run(std::future::pending()))
        .await
        .expect("run gives up")
        .unwrap_err();
    assert!(err.to_string().contains(".nope"), "{err}");

    let missing_dlx = broker
        .consumer(
            InMemoryInbox::new(),
            recording(&Calls::default(), |_, _| Ok(())),
        )
        .dead_letter_exchange(format!("{}.no-dlx", broker.queue()))
        .build()
        .unwrap();
    let err = tokio::time::timeout(WAIT, missing_dlx.run(std::future::pending()))
        .await
        .expect("run gives up")
        .unwrap_err();
    assert!(err.to_string().contains("no-dlx"), "{err}");
}

fn builder(consumer: &str) -> InboxConsumerBuilder<InMemoryInbox, impl EventHandler<InboxTx>> {
    InboxConsumer::builder(
        amqp_url(),
        "q",
        consumer,
        InMemoryInbox::new(),
        recording(&Calls::default(), |_, _| Ok(())),
    )
}

#[test]
fn the_builder_rejects_invalid_settings() {
    let rejected = |b: InboxConsumerBuilder<_, _>| b.build().unwrap_err().to_string();
    assert!(builder("c").build().is_ok());
    assert!(rejected(builder("c").prefetch(0)).contains("prefetch"));
    assert!(rejected(builder("c").concurrency(0)).contains("concurrency"));
    assert!(rejected(builder("c").concurrency(17)).contains("prefetch (16)"));
    assert!(rejected(builder("c").max_attempts(0)).contains("max_attempts"));
    assert!(rejected(builder("c").dead_letter_exchange("")).contains("dead-letter"));
    assert!(rejected(builder("c").declare(QueueTopology::new("other"))).contains("other"));
    assert!(rejected(builder("")).contains("consumer name"));
}

#[tokio::test]
async fn declared_topology_routes_bound_patterns_and_collects_dead_letters() {
    let broker = broker("topology").await;
    // Declaring again is a no-op.
    broker.topology.declare(&broker.channel).await.unwrap();
    outbox_lapin::declare_exchange(&broker.channel, &broker.exchange, ExchangeKind::Topic)
        .await
        .unwrap();

    broker
        .publish_raw("order.placed", b"{}", BasicProperties::default())
        .await;
    broker
        .publish_raw("inventory.stock.low", b"{}", BasicProperties::default())
        .await;
    // Not bound: returned as unroutable.
    let confirm = broker
        .channel
        .basic_publish(
            broker.exchange.as_str().into(),
            "payment.captured".into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            b"{}",
            BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(confirm.take_message().is_some(), "payment.* is not bound");
    assert_eq!(broker.ready(broker.queue()).await, 2);

    // Anything published to the dead-letter exchange lands in the dead-letter queue.
    broker
        .channel
        .basic_publish(
            broker.topology.dead_letter_exchange_name().unwrap().into(),
            "any.key".into(),
            BasicPublishOptions::default(),
            b"dead",
            BasicProperties::default(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let dead = broker.dead_letters(1).await;
    assert_eq!(dead[0].data, b"dead");

    // The queue dead-letters into the same exchange (x-dead-letter-exchange).
    let rejected = broker
        .channel
        .basic_get(broker.queue().into(), BasicGetOptions { no_ack: false })
        .await
        .unwrap()
        .unwrap();
    rejected
        .delivery
        .acker
        .reject(lapin::options::BasicRejectOptions { requeue: false })
        .await
        .unwrap();
    let dead = broker.dead_letters(1).await;
    assert_eq!(dead[0].routing_key.as_str(), "order.placed");

    // A conflicting redeclaration is refused with a clear error.
    let conn = connect(&amqp_url(), &format!("{}.redeclare", broker.exchange)).await;
    let channel = conn.create_channel().await.unwrap();
    let err = QueueTopology::new(broker.queue())
        .exchange(&broker.exchange)
        .bind("order.*")
        .without_dead_letter()
        .argument("x-max-length", AMQPValue::LongLongInt(5))
        .declare(&channel)
        .await
        .unwrap_err();
    assert!(err.to_string().contains(broker.queue()), "{err}");
}

/// The in-memory inbox behind a switch: while `down`, `begin` fails as a
/// database that does not answer would. Counts `begin` calls.
#[derive(Clone, Default)]
struct SwitchedInbox {
    inner: InMemoryInbox,
    down: Arc<std::sync::atomic::AtomicBool>,
    begins: Arc<AtomicU32>,
}

#[derive(Debug, thiserror::Error)]
#[error("connection refused (database down on purpose)")]
struct DatabaseDown;

impl outbox_core::InboxDatabase for SwitchedInbox {
    type Tx = InboxTx;
    type Error = DatabaseDown;

    async fn begin(&self) -> Result<InboxTx, DatabaseDown> {
        self.begins.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(DatabaseDown);
        }
        Ok(self.inner.begin())
    }

    async fn receive(
        &self,
        tx: &mut InboxTx,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<outbox_core::InboxOutcome, DatabaseDown> {
        Ok(
            outbox_core::InboxStore::receive(&self.inner, tx, consumer, event_id)
                .await
                .unwrap_or_else(|never| match never {}),
        )
    }

    async fn commit(&self, tx: InboxTx) -> Result<(), DatabaseDown> {
        tx.commit();
        Ok(())
    }
}

#[tokio::test]
async fn an_unavailable_database_spends_no_attempts_and_shutdown_requeues() {
    let broker = broker("db_down").await;
    let db = SwitchedInbox::default();
    db.down.store(true, Ordering::SeqCst);
    let calls = Calls::default();
    let build = |db: &SwitchedInbox| {
        broker
            .consumer(db.clone(), recording(&calls, |_, _| Ok(())))
            .max_attempts(2)
            .retry_delay(Duration::from_millis(50))
            .build()
            .unwrap()
    };
    let start = |consumer: InboxConsumer<SwitchedInbox, _>| {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(consumer.run(async {
            let _ = stopped.await;
        }));
        (stop, task)
    };
    let stop = |running: (oneshot::Sender<()>, JoinHandle<outbox_lapin::Result<()>>)| async move {
        let _ = running.0.send(());
        tokio::time::timeout(WAIT, running.1)
            .await
            .expect("the consumer stops")
            .unwrap()
            .expect("run returns Ok after shutdown");
    };

    // The database is down: far more tries than max_attempts, none spent.
    let running = start(build(&db));
    let event = placed("o-1", 1);
    broker.publish(&event).await;
    let deadline = Instant::now() + WAIT;
    while db.begins.load(Ordering::SeqCst) < 6 {
        assert!(Instant::now() < deadline, "the consumer keeps trying");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        broker.ready(broker.dead_letter_queue()).await,
        0,
        "not dead-lettered"
    );
    assert!(calls.all().is_empty(), "the handler never ran");
    // Shutdown during the outage puts the message back, unspent.
    stop(running).await;
    assert_eq!(
        broker.ready(broker.queue()).await,
        1,
        "requeued at shutdown"
    );

    // The database is back: handled once, on the first attempt.
    db.down.store(false, Ordering::SeqCst);
    let running = start(build(&db));
    calls
        .wait_for("the handler", |c| c.iter().any(|c| c.event.id == event.id))
        .await;
    stop(running).await;
    assert_eq!(calls.of(event.id).len(), 1);
    assert_eq!(db.inner.len(), 1);
    assert_eq!(broker.ready(broker.queue()).await, 0, "acked");
    assert_eq!(broker.ready(broker.dead_letter_queue()).await, 0);
}

#[tokio::test]
async fn a_queue_missing_while_reconnecting_is_waited_for_not_fatal() {
    let broker = broker("queue_gone").await;
    let calls = Calls::default();
    let consumer = broker
        .consumer(InMemoryInbox::new(), recording(&calls, |_, _| Ok(())))
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(200))
        .build()
        .unwrap();
    let running = Running::start(consumer);
    let before = placed("o-1", 1);
    broker.publish(&before).await;
    calls.wait_for("the first event", |c| c.len() == 1).await;

    // The queue disappears under the running consumer (as while a broker
    // restarts and has not recovered it yet): it keeps trying.
    broker
        .channel
        .queue_delete(broker.queue().into(), QueueDeleteOptions::default())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !running.task.is_finished(),
        "run must not stop on a 404 once it has consumed"
    );
    // The queue comes back: consuming resumes.
    broker.topology.declare(&broker.channel).await.unwrap();
    let after = placed("o-1", 2);
    broker.publish(&after).await;
    calls
        .wait_for("the event after the queue came back", |c| c.len() == 2)
        .await;
    running.stop().await;
}

#[tokio::test]
async fn an_original_routing_key_header_longer_than_amqp_allows_does_not_loop_forever() {
    let broker = broker("long_original_key").await;
    let inbox = InMemoryInbox::new();
    let calls = Calls::default();
    let consumer = broker
        .consumer(
            inbox.clone(),
            recording(&calls, |_, _| Err(HandlerError::permanent("refused"))),
        )
        .retry_delay(Duration::from_millis(100))
        .build()
        .unwrap();
    let running = Running::start(consumer);

    // Another publisher's header: 300 bytes cannot be a routing key (AMQP
    // short strings hold 255), so the message cannot be dead-lettered with it.
    let long = "k".repeat(300);
    let with_long_header = |properties: BasicProperties| {
        let mut headers = properties.headers().clone().unwrap_or_default();
        headers.insert(
            ORIGINAL_ROUTING_KEY_HEADER.into(),
            AMQPValue::LongString(long.as_str().into()),
        );
        properties.with_headers(headers)
    };
    // 1. A valid event its handler refuses.
    let refused = placed("o-1", 1);
    broker
        .publish_raw(
            "order.placed",
            refused.payload.as_bytes(),
            with_long_header(wire::properties(&refused, "/tests")),
        )
        .await;
    // 2. A message that cannot be decoded.
    let undecodable_id = Uuid::now_v7().to_string();
    broker
        .publish_raw(
            "order.placed",
            b"not json {",
            with_long_header(
                wire::properties(&placed("o-2", 2), "/tests")
                    .with_message_id(undecodable_id.as_str().into()),
            ),
        )
        .await;

    let dead = broker.dead_letters(2).await;
    running.stop().await;

    let by_id = |id: &str| {
        dead.iter()
            .find(|m| m.properties.message_id().as_ref().map(|m| m.as_str()) == Some(id))
            .unwrap_or_else(|| panic!("no dead letter for {id}"))
    };
    for (id, reason) in [
        (refused.id.to_string(), "refused"),
        (undecodable_id, "not JSON"),
    ] {
        let message = by_id(&id);
        assert!(
            dead_reason(message).contains(reason),
            "{}",
            dead_reason(message)
        );
        assert_eq!(
            message.routing_key.as_str(),
            "order.placed",
            "dead-lettered with the delivery's routing key"
        );
        let headers = message.properties.headers().as_ref().unwrap();
        assert_eq!(
            header_str(headers, ORIGINAL_ROUTING_KEY_HEADER),
            Some("order.placed"),
            "the unusable header is replaced"
        );
    }
    let handled = calls.of(refused.id);
    assert_eq!(handled.len(), 1, "a permanent error: one call");
    assert_eq!(handled[0].event.routing_key, "order.placed");
    assert_eq!(broker.ready(broker.queue()).await, 0, "nothing requeued");
}

/// The gauges set through the `metrics` facade, by name and `consumer`
/// label: a recorder of this test binary's own, installed once (counters
/// and histograms are dropped).
#[derive(Default)]
struct Gauges(Mutex<HashMap<(String, String), Arc<AtomicU64>>>);

impl Gauges {
    fn installed() -> &'static Gauges {
        static GAUGES: std::sync::OnceLock<&'static Gauges> = std::sync::OnceLock::new();
        GAUGES.get_or_init(|| {
            let gauges: &'static Gauges = Box::leak(Box::default());
            metrics::set_global_recorder(GaugeRecorder(gauges))
                .expect("no other metrics recorder in this test binary");
            gauges
        })
    }

    fn get(&self, name: &str, consumer: &str) -> Option<f64> {
        self.0
            .lock()
            .unwrap()
            .get(&(name.to_owned(), consumer.to_owned()))
            .map(|value| f64::from_bits(value.load(Ordering::Relaxed)))
    }

    /// Waits up to `within` for the gauge to read `expected`.
    async fn wait_for(&self, name: &str, consumer: &str, expected: f64, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let got = self.get(name, consumer);
            if got == Some(expected) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{name}{{consumer={consumer:?}}} is {got:?} after {within:?}, expected {expected}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

struct GaugeRecorder(&'static Gauges);

impl metrics::Recorder for GaugeRecorder {
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
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        let consumer = key
            .labels()
            .find(|label| label.key() == "consumer")
            .map(|label| label.value().to_owned())
            .unwrap_or_default();
        let value = self
            .0
            .0
            .lock()
            .unwrap()
            .entry((key.name().to_owned(), consumer))
            .or_default()
            .clone();
        metrics::Gauge::from_arc(value)
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

#[tokio::test]
async fn the_dead_letter_gauge_follows_the_depth_of_the_dead_letter_queue() {
    let gauges = Gauges::installed();
    let broker = broker("dead_letter_depth").await;
    // Two dead letters are waiting before the consumer starts.
    for n in 0..2 {
        let confirm = broker
            .channel
            .basic_publish(
                "".into(),
                broker.dead_letter_queue().into(),
                BasicPublishOptions::default(),
                format!("old dead letter {n}").as_bytes(),
                BasicProperties::default(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert_eq!(confirm, lapin::Confirmation::Ack(None));
    }
    let name = broker.consumer_name();
    let consumer = InboxConsumer::builder(
        amqp_url(),
        broker.queue(),
        &name,
        InMemoryInbox::new(),
        recording(&Calls::default(), |_, _| Ok(())),
    )
    .declare(broker.topology.clone())
    .build()
    .unwrap();
    // The same queue without a declared topology: the consumer does not
    // know its dead-letter queue, so it exports no depth.
    let blind_name = format!("{name}.blind");
    let blind = InboxConsumer::builder(
        amqp_url(),
        broker.queue(),
        &blind_name,
        InMemoryInbox::new(),
        recording(&Calls::default(), |_, _| Ok(())),
    )
    .build()
    .unwrap();
    let running = Running::start(consumer);
    let running_blind = Running::start(blind);

    // Read when the session starts.
    gauges.wait_for(DEAD_LETTERS, &name, 2.0, WAIT).await;

    // A malformed message is dead-lettered; the next read (every 15 s)
    // sees the real depth.
    broker
        .publish_raw("order.placed", b"not json {", BasicProperties::default())
        .await;
    let deadline = Instant::now() + WAIT;
    while broker.ready(broker.dead_letter_queue()).await < 3 {
        assert!(
            Instant::now() < deadline,
            "the malformed message is dead-lettered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    gauges
        .wait_for(
            DEAD_LETTERS,
            &name,
            f64::from(broker.ready(broker.dead_letter_queue()).await),
            Duration::from_secs(15) + WAIT,
        )
        .await;
    assert_eq!(gauges.get(DEAD_LETTERS, &name), Some(3.0));
    assert_eq!(
        gauges.get(DEAD_LETTERS, &blind_name),
        None,
        "a consumer that does not know its dead-letter queue exports no depth"
    );

    running_blind.stop().await;
    running.stop().await;
}
