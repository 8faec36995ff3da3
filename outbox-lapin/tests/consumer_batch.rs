//! `InboxConsumer` in batch mode (`InboxConsumerBuilder::batch`) against the
//! real RabbitMQ and PostgreSQL (`PgInboxDatabase`): a batch commits its
//! events in one transaction (the handler records `txid_current()`),
//! duplicates inside a batch and against the inbox are skipped, a poison
//! event in a batch leaves the others applied and is retried and
//! dead-lettered as without batching, shutdown mid-batch loses nothing, and
//! a lone message on an idle queue waits at most `max_wait`; a consumer
//! dropped mid-batch (not shut down) loses nothing either.
//!
//! Each test migrates its own schema and declares its own exchange and
//! queues; both are dropped when it ends, also when it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::sql_types::{Integer, Text};
use outbox_core::testing::{InMemoryInbox, InboxTx};
use outbox_core::{EventEnvelope, InboxDatabase, InboxOutcome};
use outbox_diesel::{PgInbox, PgInboxDatabase, PgTransaction};
use outbox_lapin::consumer_metrics::{
    BATCH_FAILURES_TOTAL, BATCH_SIZE, DUPLICATES_TOTAL, PROCESSED_TOTAL,
};
use outbox_lapin::wire::{header_i64, header_str};
use outbox_lapin::{
    ATTEMPT_HEADER, DEAD_REASON_HEADER, Error, EventHandler, HandlerError, InboxConsumer,
    IncomingEvent, handler_fn,
};
use outbox_testkit::eventually::eventually;
use outbox_testkit::names;
use outbox_testkit::pg::TestSchema;
use outbox_testkit::urls::database_url;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use uuid::Uuid;

use common::{Broker, WAIT, placed};

/// This test's schema (migrated, plus an `effects` table) and broker
/// objects.
struct Env {
    broker: Broker,
    schema: TestSchema,
    db: PgInboxDatabase,
}

impl Env {
    async fn new(test: &str) -> Env {
        let broker = Broker::new("test_cbatch", test, &["order.*"]).await;
        let schema = TestSchema::reserve(&database_url(), names::unique("t_cbatch", test));
        let mut conn = outbox_diesel::connect(&database_url())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        outbox_diesel::migrate(&mut conn, schema.name())
            .await
            .unwrap();
        // No key on the event id: an event applied twice shows as two rows.
        schema
            .run(
                "CREATE TABLE {schema}.effects (id bigserial PRIMARY KEY, event_id uuid NOT NULL, \
                 aggregate text NOT NULL, n integer NOT NULL, txid bigint NOT NULL)",
            )
            .await;
        let pool = outbox_diesel::pool(&database_url(), 4).unwrap();
        let db = PgInboxDatabase::new(pool, PgInbox::new(schema.name()).unwrap());
        Env { broker, schema, db }
    }

    async fn count(&self, sql: &str) -> i64 {
        self.schema.count(sql).await
    }

    /// How many times `event` was applied (committed effect rows).
    async fn effects(&self, event: Uuid) -> i64 {
        self.count(&format!(
            "SELECT count(*) AS n FROM {{schema}}.effects WHERE event_id = '{event}'"
        ))
        .await
    }

    async fn wait_effects(&self, n: i64) {
        eventually(format!("{n} effects committed"))
            .within(WAIT)
            .equals(n, || {
                self.count("SELECT count(*) AS n FROM {schema}.effects")
            })
            .await;
    }

    /// Distinct transactions the committed effects were written in.
    async fn transactions(&self) -> i64 {
        self.count("SELECT count(DISTINCT txid) AS n FROM {schema}.effects")
            .await
    }

    async fn inbox_rows(&self) -> i64 {
        self.count("SELECT count(*) AS n FROM {schema}.inbox_events")
            .await
    }

    /// The `n` of each committed effect of `aggregate`, in commit order.
    async fn order_of(&self, aggregate: &str) -> Vec<i32> {
        #[derive(diesel::QueryableByName)]
        struct Row {
            #[diesel(sql_type = Integer)]
            n: i32,
        }
        use diesel_async::RunQueryDsl;
        let sql = self.schema.sql(&format!(
            "SELECT n FROM {{schema}}.effects WHERE aggregate = '{aggregate}' ORDER BY id"
        ));
        let rows: Vec<Row> = diesel::sql_query(sql)
            .load(&mut *self.schema.conn().await)
            .await
            .unwrap();
        rows.into_iter().map(|r| r.n).collect()
    }
}

/// What the handler does for an event, given how many times it was called
/// for it (this call included).
type Behave = dyn Fn(&IncomingEvent, usize) -> Result<(), HandlerError> + Send + Sync;

/// Writes an effect row (event, aggregate, `n` of the payload, the
/// transaction id) on the consumer's transaction, after `delay`, then
/// behaves as told.
#[derive(Clone)]
struct Effects {
    schema: String,
    delay: Duration,
    calls: Arc<Mutex<HashMap<Uuid, usize>>>,
    behave: Arc<Behave>,
    /// This event's call also runs a failing statement and ignores its
    /// error (PostgreSQL then aborts the transaction), and returns `Ok`.
    swallow: Option<Uuid>,
}

impl Effects {
    fn new(env: &Env) -> Effects {
        Effects {
            schema: env.schema.name().to_owned(),
            delay: Duration::ZERO,
            calls: Arc::default(),
            behave: Arc::new(|_, _| Ok(())),
            swallow: None,
        }
    }

    fn calls(&self, event: Uuid) -> usize {
        self.calls.lock().unwrap().get(&event).copied().unwrap_or(0)
    }

    fn total_calls(&self) -> usize {
        self.calls.lock().unwrap().values().sum()
    }
}

impl EventHandler<PgTransaction> for Effects {
    async fn handle(
        &self,
        tx: &mut PgTransaction,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        // Here only: its `load` would shadow `AtomicU64::load` on an `Arc`.
        use diesel_async::RunQueryDsl;
        let call = {
            let mut calls = self.calls.lock().unwrap();
            let call = calls.entry(event.id).or_default();
            *call += 1;
            *call
        };
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        #[derive(serde::Deserialize)]
        struct Payload {
            n: i32,
        }
        let payload: Payload = event.payload_as().map_err(HandlerError::permanent)?;
        diesel::sql_query(format!(
            "INSERT INTO \"{}\".effects (event_id, aggregate, n, txid) \
             VALUES ($1, $2, $3, txid_current())",
            self.schema
        ))
        .bind::<diesel::sql_types::Uuid, _>(event.id)
        .bind::<Text, _>(&event.aggregate_id)
        .bind::<Integer, _>(payload.n)
        .execute(&mut **tx)
        .await?;
        if self.swallow == Some(event.id) {
            let failed = diesel::sql_query("SELECT 1/0").execute(&mut **tx).await;
            assert!(failed.is_err(), "division by zero fails");
        }
        (self.behave)(event, call)
    }
}

/// A running consumer and the switch that stops it.
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<outbox_lapin::Result<()>>,
}

impl Running {
    fn start<D: InboxDatabase, H: EventHandler<D::Tx>>(consumer: InboxConsumer<D, H>) -> Running {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(consumer.run(async {
            let _ = stopped.await;
        }));
        Running { stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("the consumer stops")
            .unwrap()
            .expect("run returns Ok after shutdown");
    }
}

/// `n` events, alternating between aggregates `o-1` and `o-2`, numbered
/// from 1 within each.
fn events(n: u32) -> Vec<EventEnvelope> {
    (0..n)
        .map(|i| placed(if i % 2 == 0 { "o-1" } else { "o-2" }, i / 2 + 1))
        .collect()
}

/// Counters and histogram samples set through the `metrics` facade, by name
/// and `consumer` label: a recorder of this test binary's own, installed
/// once (consumer names are unique per test, so tests do not mix).
#[derive(Default)]
struct Recorded {
    counters: Mutex<HashMap<(String, String), Arc<AtomicU64>>>,
    histograms: Mutex<HashMap<(String, String), Arc<Samples>>>,
}

#[derive(Default)]
struct Samples(Mutex<Vec<f64>>);

impl metrics::HistogramFn for Samples {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

impl Recorded {
    fn installed() -> &'static Recorded {
        static RECORDED: std::sync::OnceLock<&'static Recorded> = std::sync::OnceLock::new();
        RECORDED.get_or_init(|| {
            let recorded: &'static Recorded = Box::leak(Box::default());
            metrics::set_global_recorder(Recorder(recorded))
                .expect("no other metrics recorder in this test binary");
            recorded
        })
    }

    fn counter(&self, name: &str, consumer: &str) -> u64 {
        self.counters
            .lock()
            .unwrap()
            .get(&(name.to_owned(), consumer.to_owned()))
            .map_or(0, |value| value.load(Ordering::Relaxed))
    }

    fn samples(&self, name: &str, consumer: &str) -> Vec<f64> {
        self.histograms
            .lock()
            .unwrap()
            .get(&(name.to_owned(), consumer.to_owned()))
            .map(|samples| samples.0.lock().unwrap().clone())
            .unwrap_or_default()
    }
}

fn key_of(key: &metrics::Key) -> (String, String) {
    let consumer = key
        .labels()
        .find(|label| label.key() == "consumer")
        .map(|label| label.value().to_owned())
        .unwrap_or_default();
    (key.name().to_owned(), consumer)
}

struct Recorder(&'static Recorded);

impl metrics::Recorder for Recorder {
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
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let value = self
            .0
            .counters
            .lock()
            .unwrap()
            .entry(key_of(key))
            .or_default()
            .clone();
        metrics::Counter::from_arc(value)
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        let samples = self
            .0
            .histograms
            .lock()
            .unwrap()
            .entry(key_of(key))
            .or_default()
            .clone();
        metrics::Histogram::from_arc(samples)
    }
}

#[tokio::test]
async fn a_batch_applies_its_events_in_one_transaction_in_order() {
    let recorded = Recorded::installed();
    let env = Env::new("one_tx").await;
    let sent = events(10);
    // All waiting before the consumer starts: they arrive together.
    for event in &sent {
        env.broker.publish(event).await;
    }
    let handler = Effects::new(&env);
    let consumer = env
        .broker
        .consumer(env.db.clone(), handler.clone())
        .prefetch(10)
        .batch(10, Duration::from_secs(1))
        .build()
        .unwrap();
    let running = Running::start(consumer);
    env.wait_effects(10).await;
    running.stop().await;

    assert_eq!(env.transactions().await, 1, "one transaction for the ten");
    for event in &sent {
        assert_eq!(env.effects(event.id).await, 1);
    }
    assert_eq!(env.inbox_rows().await, 10);
    assert_eq!(handler.total_calls(), 10);
    assert_eq!(env.order_of("o-1").await, [1, 2, 3, 4, 5]);
    assert_eq!(env.order_of("o-2").await, [1, 2, 3, 4, 5]);
    assert_eq!(env.broker.ready(env.broker.queue()).await, 0, "all acked");
    let consumer = env.broker.consumer_name();
    assert_eq!(recorded.samples(BATCH_SIZE, &consumer), [10.0]);
    assert_eq!(recorded.counter(PROCESSED_TOTAL, &consumer), 10);
    assert_eq!(recorded.counter(BATCH_FAILURES_TOTAL, &consumer), 0);
}

#[tokio::test]
async fn duplicates_in_a_batch_and_in_the_inbox_are_skipped() {
    let recorded = Recorded::installed();
    let env = Env::new("duplicates").await;
    let handler = Effects::new(&env);
    let consumer_name = env.broker.consumer_name();
    // `known` was applied before: its inbox entry is committed.
    let known = placed("o-1", 1);
    let mut tx = env.db.begin().await.unwrap();
    let outcome = env
        .db
        .receive(&mut tx, &consumer_name, known.id)
        .await
        .unwrap();
    assert_eq!(outcome, InboxOutcome::FirstTime);
    env.db.commit(tx).await.unwrap();

    let twice = placed("o-1", 2);
    let other = placed("o-2", 1);
    for event in [&known, &twice, &twice, &other] {
        env.broker.publish(event).await;
    }
    let consumer = env
        .broker
        .consumer(env.db.clone(), handler.clone())
        .prefetch(4)
        .batch(4, Duration::from_secs(1))
        .build()
        .unwrap();
    let running = Running::start(consumer);
    env.wait_effects(2).await;
    env.broker.wait_ready(env.broker.queue(), 0).await;
    running.stop().await;

    assert_eq!(env.effects(known.id).await, 0, "known: handler not run");
    assert_eq!(env.effects(twice.id).await, 1, "twice: applied once");
    assert_eq!(env.effects(other.id).await, 1);
    assert_eq!(handler.calls(known.id), 0);
    assert_eq!(handler.calls(twice.id), 1, "the second copy never ran");
    assert_eq!(env.transactions().await, 1, "still one batch");
    assert_eq!(env.inbox_rows().await, 3);
    assert_eq!(
        env.broker.ready(env.broker.queue()).await,
        0,
        "every copy acked (an unacked one is back in the queue after the stop)"
    );
    assert_eq!(recorded.counter(PROCESSED_TOTAL, &consumer_name), 2);
    assert_eq!(recorded.counter(DUPLICATES_TOTAL, &consumer_name), 2);
}

#[tokio::test]
async fn a_poison_event_fails_alone_and_the_rest_of_its_batch_is_applied() {
    let recorded = Recorded::installed();
    let env = Env::new("poison").await;
    let sent = events(5);
    let poison = sent[2].id;
    for event in &sent {
        env.broker.publish(event).await;
    }
    let mut handler = Effects::new(&env);
    handler.behave = Arc::new(move |event, call| {
        if event.id == poison {
            Err(HandlerError::new(format!("poison, call {call}")))
        } else {
            Ok(())
        }
    });
    let consumer = env
        .broker
        .consumer(env.db.clone(), handler.clone())
        .prefetch(5)
        .batch(5, Duration::from_secs(1))
        .max_attempts(2)
        .retry_delay(Duration::from_millis(100))
        .build()
        .unwrap();
    let running = Running::start(consumer);
    let dead = env.broker.dead_letters(1).await;
    env.wait_effects(4).await;
    running.stop().await;

    for event in &sent {
        let expected = i64::from(event.id != poison);
        assert_eq!(env.effects(event.id).await, expected, "{}", event.id);
    }
    assert_eq!(
        env.inbox_rows().await,
        4,
        "the poison one's entry rolled back"
    );
    // Its two attempts, as without batching, plus the rolled-back batch.
    assert_eq!(handler.calls(poison), 3);
    let headers = dead[0].properties.headers().as_ref().unwrap();
    assert_eq!(
        dead[0].properties.message_id().as_ref().unwrap().as_str(),
        poison.to_string()
    );
    assert_eq!(header_i64(headers, ATTEMPT_HEADER), Some(2));
    assert_eq!(
        header_str(headers, DEAD_REASON_HEADER),
        Some("poison, call 3"),
        "dead-lettered on its last attempt"
    );
    assert_eq!(env.broker.ready(env.broker.queue()).await, 0);
    let consumer = env.broker.consumer_name();
    assert_eq!(recorded.counter(BATCH_FAILURES_TOTAL, &consumer), 1);
    assert_eq!(
        recorded.samples(BATCH_SIZE, &consumer),
        [5.0, 1.0],
        "then its retry alone"
    );
}

#[tokio::test]
async fn a_panic_in_a_batch_rolls_it_back_and_each_event_is_applied_once() {
    let env = Env::new("panic").await;
    let sent = events(6);
    let panics = sent[1].id;
    for event in &sent {
        env.broker.publish(event).await;
    }
    let mut handler = Effects::new(&env);
    handler.behave = Arc::new(move |event, call| {
        assert!(!(event.id == panics && call == 1), "panicking on purpose");
        Ok(())
    });
    let consumer = env
        .broker
        .consumer(env.db.clone(), handler.clone())
        .prefetch(6)
        .batch(6, Duration::from_secs(1))
        .build()
        .unwrap();
    let running = Running::start(consumer);
    env.wait_effects(6).await;
    env.broker.wait_ready(env.broker.queue(), 0).await;
    running.stop().await;

    for event in &sent {
        assert_eq!(env.effects(event.id).await, 1, "{}", event.id);
    }
    assert_eq!(handler.calls(panics), 2, "the panic, then alone");
    assert_eq!(handler.calls(sent[0].id), 2, "rolled back once, then alone");
    assert_eq!(handler.calls(sent[2].id), 1, "never reached in the batch");
    assert_eq!(env.transactions().await, 6, "replayed one at a time");
    assert_eq!(
        env.broker.ready(env.broker.dlq()).await,
        0,
        "no dead letter"
    );
    assert_eq!(env.broker.ready(env.broker.queue()).await, 0);
}

#[tokio::test]
async fn a_handler_that_swallows_a_failed_statement_last_in_a_batch_loses_nothing() {
    // Its `Ok` leaves PostgreSQL's transaction aborted: the batch's commit
    // must fail (a real COMMIT of a healthy transaction, or an error),
    // never ack the others with their effects rolled back.
    let env = Env::new("swallow").await;
    let sent = events(4);
    let swallows = sent[3].id;
    for event in &sent {
        env.broker.publish(event).await;
    }
    let mut handler = Effects::new(&env);
    handler.swallow = Some(swallows);
    let consumer = env
        .broker
        .consumer(env.db.clone(), handler.clone())
        .prefetch(4)
        .batch(4, Duration::from_secs(1))
        .max_attempts(1)
        .build()
        .unwrap();
    let running = Running::start(consumer);
    let dead = env.broker.dead_letters(1).await;
    env.wait_effects(3).await;
    running.stop().await;

    for event in &sent {
        let expected = i64::from(event.id != swallows);
        assert_eq!(env.effects(event.id).await, expected, "{}", event.id);
    }
    assert_eq!(
        dead[0].properties.message_id().as_ref().unwrap().as_str(),
        swallows.to_string()
    );
    assert_eq!(handler.calls(swallows), 2, "in the batch, then alone");
    assert_eq!(env.broker.ready(env.broker.queue()).await, 0);
}

#[tokio::test]
async fn batches_with_concurrency_keep_each_aggregate_in_order() {
    let env = Env::new("concurrency").await;
    let aggregates = ["o-1", "o-2", "o-3", "o-4", "o-5", "o-6"];
    let mut sent = Vec::new();
    for n in 1..=8 {
        for aggregate in aggregates {
            sent.push(placed(aggregate, n));
        }
    }
    for event in &sent {
        env.broker.publish(event).await;
    }
    let handler = Effects::new(&env);
    let consumer = env
        .broker
        .consumer(env.db.clone(), handler.clone())
        .concurrency(3)
        .prefetch(48)
        .batch(8, Duration::from_millis(20))
        .build()
        .unwrap();
    let running = Running::start(consumer);
    env.wait_effects(48).await;
    env.broker.wait_ready(env.broker.queue(), 0).await;
    running.stop().await;

    for event in &sent {
        assert_eq!(env.effects(event.id).await, 1, "{}", event.id);
    }
    for aggregate in aggregates {
        assert_eq!(
            env.order_of(aggregate).await,
            (1..=8).collect::<Vec<_>>(),
            "{aggregate}"
        );
    }
    assert!(
        env.transactions().await < 48,
        "batched: {} transactions for 48 events",
        env.transactions().await
    );
    // Individual acks: a `multiple` ack from one worker would have acked
    // another's tags, and their own acks then closed the channel.
    assert_eq!(env.broker.ready(env.broker.queue()).await, 0, "all acked");
}

#[tokio::test]
async fn shutdown_mid_batch_rolls_back_and_loses_nothing() {
    let env = Env::new("shutdown").await;
    let sent = events(5);
    for event in &sent {
        env.broker.publish(event).await;
    }
    let started = Arc::new(AtomicBool::new(false));
    let mut slow = Effects::new(&env);
    slow.delay = Duration::from_millis(300);
    let seen = started.clone();
    slow.behave = Arc::new(move |_, _| {
        seen.store(true, Ordering::SeqCst);
        Ok(())
    });
    let consumer = env
        .broker
        .consumer(env.db.clone(), slow.clone())
        .prefetch(5)
        .batch(5, Duration::from_secs(1))
        .build()
        .unwrap();
    let running = Running::start(consumer);
    eventually("the batch's first handler call finished")
        .within(WAIT)
        .until(|| async { started.load(Ordering::SeqCst) })
        .await;
    running.stop().await;

    assert!(slow.total_calls() < 5, "stopped before the batch's end");
    assert_eq!(
        env.count("SELECT count(*) AS n FROM {schema}.effects")
            .await,
        0,
        "rolled back"
    );
    assert_eq!(env.inbox_rows().await, 0);
    env.broker.wait_ready(env.broker.queue(), 5).await;

    // The next consumer applies all five, once each.
    let handler = Effects::new(&env);
    let consumer = env
        .broker
        .consumer(env.db.clone(), handler)
        .prefetch(5)
        .batch(5, Duration::from_millis(50))
        .build()
        .unwrap();
    let running = Running::start(consumer);
    env.wait_effects(5).await;
    running.stop().await;
    for event in &sent {
        assert_eq!(env.effects(event.id).await, 1);
    }
    assert_eq!(env.inbox_rows().await, 5);
}

#[tokio::test]
async fn a_lone_message_on_an_idle_queue_waits_at_most_max_wait() {
    let env = Env::new("lone").await;
    let max_wait = Duration::from_millis(300);
    let handler = Effects::new(&env);
    let consumer = env
        .broker
        .consumer(env.db.clone(), handler)
        .prefetch(100)
        .batch(100, max_wait)
        .build()
        .unwrap();
    let running = Running::start(consumer);
    // Idle first: the consumer is subscribed and waiting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lone = placed("o-1", 1);
    let published = Instant::now();
    env.broker.publish(&lone).await;
    env.wait_effects(1).await;
    let took = published.elapsed();
    running.stop().await;

    // A full batch never comes: only `max_wait` (plus a generous margin
    // for a busy machine) stands between the message and its commit.
    assert!(
        took < max_wait + Duration::from_secs(2),
        "applied {took:?} after publishing"
    );
    assert_eq!(env.effects(lone.id).await, 1);
}

#[test]
fn batch_settings_are_checked_at_build() {
    let handler = || {
        handler_fn(|_tx: &mut InboxTx, _event: &IncomingEvent| {
            Box::pin(async { Ok::<(), HandlerError>(()) })
        })
    };
    let builder = || {
        InboxConsumer::builder(
            common::amqp_url(),
            "q",
            "c",
            InMemoryInbox::new(),
            handler(),
        )
    };
    let error = builder()
        .concurrency(4)
        .prefetch(32)
        .batch(10, Duration::from_millis(5))
        .build()
        .unwrap_err();
    assert!(matches!(error, Error::Config(_)), "{error:?}");
    assert!(
        error.to_string().contains("at least 40"),
        "says what to raise prefetch to: {error}"
    );
    let error = builder()
        .batch(0, Duration::from_millis(5))
        .build()
        .unwrap_err();
    assert!(matches!(error, Error::Config(_)), "{error:?}");
    builder()
        .concurrency(4)
        .prefetch(40)
        .batch(10, Duration::ZERO)
        .build()
        .expect("prefetch = max_deliveries x concurrency is enough");
    // `Duration::MAX` meant as "always fill" would overflow the worker's
    // clock: refused at build, not a panic in a worker.
    let error = builder()
        .prefetch(40)
        .batch(10, Duration::MAX)
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("max_wait"), "{error}");
    builder()
        .prefetch(40)
        .batch(10, Duration::from_secs(60))
        .build()
        .expect("60 s is the longest max_wait");
}

#[tokio::test]
async fn a_consumer_dropped_mid_batch_loses_nothing() {
    // Cancelled, not shut down: the `run` future dropped while a batch's
    // transaction is open (the task aborted, as when a runtime shuts down).
    let env = Env::new("dropped").await;
    let sent = events(5);
    for event in &sent {
        env.broker.publish(event).await;
    }
    let started = Arc::new(AtomicBool::new(false));
    let mut slow = Effects::new(&env);
    slow.delay = Duration::from_millis(300);
    let seen = started.clone();
    slow.behave = Arc::new(move |_, _| {
        seen.store(true, Ordering::SeqCst);
        Ok(())
    });
    let consumer = env
        .broker
        .consumer(env.db.clone(), slow.clone())
        .prefetch(5)
        .batch(5, Duration::from_secs(1))
        .build()
        .unwrap();
    let running = Running::start(consumer);
    eventually("the batch's first handler call finished")
        .within(WAIT)
        .until(|| async { started.load(Ordering::SeqCst) })
        .await;
    running.task.abort();
    let _ = running.task.await;

    // The broker has the five back once the dropped consumer's connection
    // is gone; the transaction was rolled back.
    env.broker.wait_ready(env.broker.queue(), 5).await;
    assert_eq!(
        env.count("SELECT count(*) AS n FROM {schema}.effects")
            .await,
        0
    );
    let handler = Effects::new(&env);
    let consumer = env
        .broker
        .consumer(env.db.clone(), handler)
        .prefetch(5)
        .batch(5, Duration::from_millis(50))
        .build()
        .unwrap();
    let running = Running::start(consumer);
    env.wait_effects(5).await;
    running.stop().await;
    for event in &sent {
        assert_eq!(env.effects(event.id).await, 1);
    }
}
