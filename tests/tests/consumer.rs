//! The inbox consumer end to end, through the `outbox` facade: RabbitMQ
//! (`outbox::rabbitmq`) and PostgreSQL (`outbox::postgres`). A handler's
//! effect is a row in a table of the test's own schema, written on the
//! consumer's transaction: exactly once under duplicates and a crash between
//! commit and ack, never after failures; events the handler records carry
//! the causation and correlation of the incoming one.
//!
//! Each test migrates its own PostgreSQL schema and declares its own
//! exchange and queues; both are dropped when the test ends, also when it
//! fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use outbox_testkit::amqp::{TestBroker, close_connection};
use outbox_testkit::eventually::eventually;
use outbox_testkit::names;
use outbox_testkit::pg::{self, TestSchema};
use outbox_testkit::urls::{amqp_url, database_url};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel::sql_types::Text;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use lapin::message::BasicGetMessage;
use lapin::options::BasicGetOptions;
use outbox::postgres::{Outbox, PgInbox, PgInboxDatabase, PgTransaction};
use outbox::rabbitmq::{
    DEAD_REASON_HEADER, EventHandler, HandlerError, InboxConsumer, IncomingEvent, QueueTopology,
    wire,
};
use outbox::{DomainEvent, EventEnvelope, Headers, InboxDatabase, InboxOutcome};
use outbox_tests::events::OrderPlaced;
use serde::Serialize;
use tokio::sync::oneshot;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(30);

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "loyalty")]
struct PointsAwarded {
    #[aggregate_id]
    customer: String,
    points: i64,
}

fn order_placed() -> EventEnvelope {
    EventEnvelope::from_event(&OrderPlaced {
        order_id: Uuid::now_v7(),
        total_cents: 1250,
    })
    .unwrap()
}

/// The test's schema (migrated, plus an `effects` table) and broker objects;
/// all dropped on drop, also while the test unwinds.
struct Env {
    schema: String,
    pool: Pool<AsyncPgConnection>,
    exchange: String,
    topology: QueueTopology,
    broker: TestBroker,
    _schema: TestSchema,
}

impl Env {
    async fn new(test: &str) -> Env {
        let guard = TestSchema::reserve(&database_url(), names::unique("t_consumer", test));
        let schema = guard.name().to_owned();
        let mut conn = outbox::postgres::connect(&database_url())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        outbox::postgres::migrate(&mut conn, &schema).await.unwrap();
        guard
            .run("CREATE TABLE {schema}.effects (event_id uuid PRIMARY KEY, note text NOT NULL)")
            .await;
        let pool = outbox::postgres::pool(&database_url(), 4).unwrap();

        let broker = TestBroker::new(names::unique("test_e2e_consumer", test)).await;
        let exchange = broker.named("x");
        let topology = QueueTopology::new(broker.named("q"))
            .exchange(&exchange)
            .bind("order.*");
        broker.delete_queue_on_drop(topology.queue_name());
        broker.delete_queue_on_drop(topology.dead_letter_queue_name().unwrap());
        broker.delete_exchange_on_drop(&exchange);
        broker.delete_exchange_on_drop(topology.dead_letter_exchange_name().unwrap());
        topology.declare(broker.channel()).await.unwrap();
        Env {
            schema,
            pool,
            exchange,
            topology,
            broker,
            _schema: guard,
        }
    }

    fn queue(&self) -> &str {
        self.topology.queue_name()
    }

    fn consumer_name(&self) -> String {
        format!("{}.consumer", self.exchange)
    }

    fn database(&self) -> PgInboxDatabase {
        PgInboxDatabase::new(self.pool.clone(), PgInbox::new(&self.schema).unwrap())
    }

    async fn publish(&self, envelope: &EventEnvelope) {
        let confirm = self
            .broker
            .publish(
                &self.exchange,
                &envelope.event_type,
                envelope.payload.as_bytes(),
                wire::properties(envelope, "/tests"),
            )
            .await;
        assert_eq!(confirm, lapin::Confirmation::Ack(None));
    }

    async fn ready(&self, queue: &str) -> u32 {
        self.broker.ready(queue).await
    }

    async fn dead_letter(&self) -> BasicGetMessage {
        let queue = self.topology.dead_letter_queue_name().unwrap();
        eventually("a dead letter arrived")
            .within(WAIT)
            .some(|| async {
                self.broker
                    .channel()
                    .basic_get(queue.into(), BasicGetOptions { no_ack: true })
                    .await
                    .unwrap()
            })
            .await
    }

    async fn count(&self, sql: &str) -> i64 {
        let mut conn = self.pool.get().await.unwrap();
        let sql = sql.replace("{schema}", &format!("\"{}\"", self.schema));
        pg::count(&mut conn, &sql).await
    }

    async fn effects(&self, event: Uuid) -> i64 {
        self.count(&format!(
            "SELECT count(*) AS n FROM {{schema}}.effects WHERE event_id = '{event}'"
        ))
        .await
    }

    async fn inbox_rows(&self) -> i64 {
        self.count("SELECT count(*) AS n FROM {schema}.inbox_events")
            .await
    }

    /// Waits until `sql` (a count) reaches `n`.
    async fn wait_count(&self, what: &str, sql: &str, n: i64) {
        eventually(what)
            .within(WAIT)
            .equals(n, || self.count(sql))
            .await;
    }
}

/// The handler of these tests: inserts the effect row on the consumer's
/// transaction, optionally records an outbox event, then fails for the first
/// `fail_first` calls.
struct WriteEffect {
    schema: String,
    record_event: bool,
    fail_first: usize,
    calls: Arc<AtomicUsize>,
}

impl WriteEffect {
    fn new(env: &Env) -> (Self, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let handler = WriteEffect {
            schema: env.schema.clone(),
            record_event: false,
            fail_first: 0,
            calls: calls.clone(),
        };
        (handler, calls)
    }
}

impl EventHandler<PgTransaction> for WriteEffect {
    async fn handle(
        &self,
        tx: &mut PgTransaction,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        diesel::sql_query(format!(
            "INSERT INTO \"{}\".effects (event_id, note) VALUES ($1, $2)",
            self.schema
        ))
        .bind::<diesel::sql_types::Uuid, _>(event.id)
        .bind::<Text, _>(format!("call {call}"))
        .execute(&mut **tx)
        .await?;
        if self.record_event {
            Outbox::new(&self.schema)?
                .record(
                    tx,
                    &PointsAwarded {
                        customer: "c-1".into(),
                        points: 12,
                    },
                )
                .await?;
        }
        if call <= self.fail_first {
            return Err(HandlerError::new(format!(
                "failing on purpose, call {call}"
            )));
        }
        Ok(())
    }
}

/// Runs `consumer` in a task; the returned sender stops it.
fn start<D, H>(
    consumer: InboxConsumer<D, H>,
) -> (
    oneshot::Sender<()>,
    tokio::task::JoinHandle<outbox::rabbitmq::Result<()>>,
)
where
    D: InboxDatabase,
    H: EventHandler<D::Tx>,
{
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(consumer.run(async {
        let _ = stopped.await;
    }));
    (stop, task)
}

async fn stop(
    running: (
        oneshot::Sender<()>,
        tokio::task::JoinHandle<outbox::rabbitmq::Result<()>>,
    ),
) {
    let _ = running.0.send(());
    tokio::time::timeout(WAIT, running.1)
        .await
        .expect("the consumer stops")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_duplicate_delivery_takes_effect_once() {
    let env = Env::new("duplicate").await;
    let (handler, calls) = WriteEffect::new(&env);
    let consumer = InboxConsumer::builder(
        amqp_url(),
        env.queue(),
        env.consumer_name(),
        env.database(),
        handler,
    )
    .build()
    .unwrap();
    let running = start(consumer);

    let event = order_placed();
    let sentinel = order_placed();
    env.publish(&event).await;
    env.publish(&event).await;
    env.publish(&sentinel).await;
    env.wait_count(
        "sentinel effect",
        &format!(
            "SELECT count(*) AS n FROM {{schema}}.effects WHERE event_id = '{}'",
            sentinel.id
        ),
        1,
    )
    .await;
    stop(running).await;

    assert_eq!(
        env.effects(event.id).await,
        1,
        "one effect for two deliveries"
    );
    assert_eq!(
        AtomicUsize::load(&calls, Ordering::SeqCst),
        2,
        "the handler skipped the copy"
    );
    assert_eq!(env.inbox_rows().await, 2);
    assert_eq!(env.ready(env.queue()).await, 0, "the copy was acked");
}

#[tokio::test]
async fn a_handler_failing_every_time_leaves_no_effect_and_is_dead_lettered() {
    let env = Env::new("always_fails").await;
    let (mut handler, calls) = WriteEffect::new(&env);
    handler.fail_first = usize::MAX;
    let consumer = InboxConsumer::builder(
        amqp_url(),
        env.queue(),
        env.consumer_name(),
        env.database(),
        handler,
    )
    .max_attempts(3)
    .retry_delay(Duration::from_millis(200))
    .build()
    .unwrap();
    let running = start(consumer);

    let event = order_placed();
    env.publish(&event).await;
    let dead = env.dead_letter().await;
    stop(running).await;

    assert_eq!(
        AtomicUsize::load(&calls, Ordering::SeqCst),
        3,
        "max_attempts calls"
    );
    assert_eq!(env.effects(event.id).await, 0, "every attempt rolled back");
    assert_eq!(env.inbox_rows().await, 0, "inbox entries rolled back too");
    let reason = wire::header_str(
        dead.properties.headers().as_ref().unwrap(),
        DEAD_REASON_HEADER,
    )
    .unwrap()
    .to_owned();
    assert_eq!(reason, "failing on purpose, call 3");
    assert_eq!(dead.data, event.payload.as_bytes());
    assert_eq!(env.ready(env.queue()).await, 0);
}

/// A [`PgInboxDatabase`] that, once armed, has the broker close the
/// consumer's connection right after a commit: the crash between commit and
/// ack. It also records what the inbox said each time.
struct CrashAfterCommit {
    inner: PgInboxDatabase,
    connection_name: String,
    armed: Arc<std::sync::atomic::AtomicBool>,
    outcomes: Arc<Mutex<Vec<(Uuid, InboxOutcome)>>>,
}

impl InboxDatabase for CrashAfterCommit {
    type Tx = PgTransaction;
    type Error = outbox::postgres::Error;

    async fn begin(&self) -> Result<PgTransaction, Self::Error> {
        self.inner.begin().await
    }

    async fn receive(
        &self,
        tx: &mut PgTransaction,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<InboxOutcome, Self::Error> {
        let outcome = self.inner.receive(tx, consumer, event_id).await?;
        self.outcomes.lock().unwrap().push((event_id, outcome));
        Ok(outcome)
    }

    async fn commit(&self, tx: PgTransaction) -> Result<(), Self::Error> {
        self.inner.commit(tx).await?;
        if self.armed.swap(false, Ordering::SeqCst) {
            let name = self.connection_name.clone();
            tokio::task::spawn_blocking(move || {
                // The crash between commit and ack.
                assert_eq!(
                    close_connection(&name),
                    1,
                    "the consumer's connection is listed"
                );
            })
            .await
            .unwrap();
            // Let the client see the close before the consumer tries to ack.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_redelivery_after_commit_but_before_ack_is_a_duplicate() {
    let env = Env::new("crash_after_commit").await;
    let (handler, calls) = WriteEffect::new(&env);
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let database = CrashAfterCommit {
        inner: env.database(),
        connection_name: env.consumer_name(),
        armed: Arc::new(true.into()),
        outcomes: outcomes.clone(),
    };
    let consumer = InboxConsumer::builder(
        amqp_url(),
        env.queue(),
        env.consumer_name(),
        database,
        handler,
    )
    .build()
    .unwrap();
    let running = start(consumer);

    let event = order_placed();
    env.publish(&event).await;
    let deadline = Instant::now() + WAIT;
    while outcomes.lock().unwrap().len() < 2 {
        assert!(
            Instant::now() < deadline,
            "no redelivery after the lost ack: {:?}",
            outcomes.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The consumer is connected again and has acked the redelivery.
    let deadline = Instant::now() + WAIT;
    while env.ready(env.queue()).await != 0 {
        assert!(Instant::now() < deadline, "the redelivery was not acked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop(running).await;

    assert_eq!(
        *outcomes.lock().unwrap(),
        [
            (event.id, InboxOutcome::FirstTime),
            (event.id, InboxOutcome::Duplicate)
        ],
        "redelivered after the crash, recognised by the inbox"
    );
    assert_eq!(
        AtomicUsize::load(&calls, Ordering::SeqCst),
        1,
        "the handler ran once"
    );
    assert_eq!(env.effects(event.id).await, 1);
}

#[tokio::test]
async fn a_redelivery_to_a_restarted_consumer_is_a_duplicate() {
    let env = Env::new("restart").await;
    let event = order_placed();
    let sentinel = order_placed();
    let effect_of =
        |id: Uuid| format!("SELECT count(*) AS n FROM {{schema}}.effects WHERE event_id = '{id}'");

    // A first consumer process handles the event and commits it.
    let (handler, first_calls) = WriteEffect::new(&env);
    let consumer = InboxConsumer::builder(
        amqp_url(),
        env.queue(),
        env.consumer_name(),
        env.database(),
        handler,
    )
    .build()
    .unwrap();
    let running = start(consumer);
    env.publish(&event).await;
    env.wait_count("the first effect", &effect_of(event.id), 1)
        .await;
    stop(running).await;

    // The same message id again (a producer retry, a replay) reaches a new
    // consumer process, followed by a sentinel handled after it, in order.
    let (handler, second_calls) = WriteEffect::new(&env);
    let consumer = InboxConsumer::builder(
        amqp_url(),
        env.queue(),
        env.consumer_name(),
        env.database(),
        handler,
    )
    .build()
    .unwrap();
    let running = start(consumer);
    env.publish(&event).await;
    env.publish(&sentinel).await;
    env.wait_count("the sentinel effect", &effect_of(sentinel.id), 1)
        .await;
    stop(running).await;

    assert_eq!(AtomicUsize::load(&first_calls, Ordering::SeqCst), 1);
    assert_eq!(
        AtomicUsize::load(&second_calls, Ordering::SeqCst),
        1,
        "the restarted consumer ran the handler for the sentinel only"
    );
    assert_eq!(env.effects(event.id).await, 1);
    assert_eq!(env.inbox_rows().await, 2);
    assert_eq!(env.ready(env.queue()).await, 0, "the copy was acked");
}

#[tokio::test]
async fn events_recorded_by_the_handler_carry_causation_correlation_and_trace() {
    #[derive(QueryableByName)]
    struct Recorded {
        #[diesel(sql_type = Text)]
        event_type: String,
        #[diesel(sql_type = Text)]
        headers: String,
    }

    let env = Env::new("causation").await;
    let (mut handler, calls) = WriteEffect::new(&env);
    handler.record_event = true;
    handler.fail_first = 1; // the first recording is rolled back
    let consumer = InboxConsumer::builder(
        amqp_url(),
        env.queue(),
        env.consumer_name(),
        env.database(),
        handler,
    )
    .retry_delay(Duration::from_millis(100))
    .build()
    .unwrap();
    let running = start(consumer);

    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let incoming = order_placed()
        .with_correlation_id("corr-42")
        .with_traceparent(traceparent)
        .with_causation_id("the-cause-of-the-incoming-event");
    env.publish(&incoming).await;
    env.wait_count(
        "the recorded event",
        "SELECT count(*) AS n FROM {schema}.outbox_events",
        1,
    )
    .await;
    env.wait_count(
        "the committed effect",
        "SELECT count(*) AS n FROM {schema}.effects",
        1,
    )
    .await;
    stop(running).await;
    assert_eq!(AtomicUsize::load(&calls, Ordering::SeqCst), 2);

    let mut conn = env.pool.get().await.unwrap();
    let rows: Vec<Recorded> = diesel::sql_query(format!(
        "SELECT event_type, headers::text AS headers FROM \"{}\".outbox_events",
        env.schema
    ))
    .load(&mut *conn)
    .await
    .unwrap();
    assert_eq!(rows.len(), 1, "the failed attempt's event was rolled back");
    assert_eq!(rows[0].event_type, "loyalty.points_awarded");
    let headers: std::collections::BTreeMap<String, String> =
        serde_json::from_str(&rows[0].headers).unwrap();
    let incoming_id = incoming.id.to_string();
    assert_eq!(
        headers.get(Headers::CAUSATION_ID).map(String::as_str),
        Some(incoming_id.as_str()),
        "caused by the incoming event, not by its cause"
    );
    assert_eq!(
        headers.get(Headers::CORRELATION_ID).map(String::as_str),
        Some("corr-42")
    );
    assert_eq!(
        headers.get(Headers::TRACEPARENT).map(String::as_str),
        Some(traceparent)
    );
}

/// How [`Misbehaving`] treats its transaction.
#[derive(Clone, Copy)]
enum Misbehaviour {
    /// A nested transaction (savepoint) whose future a timeout cancels
    /// mid-way: diesel's depth stays at 2.
    CancelledNestedTransaction,
    /// A statement that fails, its error ignored: PostgreSQL aborted the
    /// transaction and would turn `COMMIT` into `ROLLBACK` without an error.
    SwallowedDatabaseError,
}

/// Writes the effect row, then misbehaves on its transaction and returns
/// `Ok` anyway, for the first `times` calls; behaves after that.
struct Misbehaving {
    effect: WriteEffect,
    how: Misbehaviour,
    times: usize,
}

impl EventHandler<PgTransaction> for Misbehaving {
    async fn handle(
        &self,
        tx: &mut PgTransaction,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        self.effect.handle(tx, event).await?;
        if AtomicUsize::load(&self.effect.calls, Ordering::SeqCst) > self.times {
            return Ok(());
        }
        let conn: &mut AsyncPgConnection = tx;
        match self.how {
            Misbehaviour::CancelledNestedTransaction => {
                let schema = self.effect.schema.clone();
                let id = event.id;
                let nested = tokio::time::timeout(
                    Duration::from_millis(200),
                    diesel_async::AsyncConnection::transaction::<_, diesel::result::Error, _>(
                        conn,
                        async move |conn| {
                            diesel::sql_query(format!(
                                "UPDATE \"{schema}\".effects SET note = 'nested' \
                                 WHERE event_id = $1"
                            ))
                            .bind::<diesel::sql_types::Uuid, _>(id)
                            .execute(conn)
                            .await?;
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                            Ok(())
                        },
                    ),
                )
                .await;
                assert!(nested.is_err(), "the nested transaction was cancelled");
            }
            Misbehaviour::SwallowedDatabaseError => {
                let failed = diesel::sql_query("SELECT 1 / 0").execute(conn).await;
                assert!(failed.is_err(), "division by zero fails");
            }
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_nested_transaction_left_open_is_a_failed_attempt_not_an_ack() {
    let env = Env::new("nested_open").await;
    let (effect, calls) = WriteEffect::new(&env);
    let handler = Misbehaving {
        effect,
        how: Misbehaviour::CancelledNestedTransaction,
        times: 1,
    };
    let consumer = InboxConsumer::builder(
        amqp_url(),
        env.queue(),
        env.consumer_name(),
        env.database(),
        handler,
    )
    .max_attempts(3)
    .retry_delay(Duration::from_millis(100))
    .build()
    .unwrap();
    let running = start(consumer);

    let event = order_placed();
    env.publish(&event).await;
    // Acked after the first call, the event would be lost: no effect, ever.
    env.wait_count(
        "the effect of the retried attempt",
        &format!(
            "SELECT count(*) AS n FROM {{schema}}.effects WHERE event_id = '{}'",
            event.id
        ),
        1,
    )
    .await;
    stop(running).await;

    assert_eq!(
        AtomicUsize::load(&calls, Ordering::SeqCst),
        2,
        "the first attempt was not committed, the second was"
    );
    assert_eq!(env.inbox_rows().await, 1);
    assert_eq!(
        env.count("SELECT count(*) AS n FROM {schema}.effects WHERE note = 'call 2'")
            .await,
        1,
        "the effect is the second attempt's"
    );
    assert_eq!(env.ready(env.queue()).await, 0);
}

#[tokio::test]
async fn an_aborted_transaction_is_a_failed_attempt_and_dead_lettered_in_the_end() {
    let env = Env::new("aborted").await;
    let (effect, calls) = WriteEffect::new(&env);
    let handler = Misbehaving {
        effect,
        how: Misbehaviour::SwallowedDatabaseError,
        times: usize::MAX,
    };
    let consumer = InboxConsumer::builder(
        amqp_url(),
        env.queue(),
        env.consumer_name(),
        env.database(),
        handler,
    )
    .max_attempts(2)
    .retry_delay(Duration::from_millis(100))
    .build()
    .unwrap();
    let running = start(consumer);

    let event = order_placed();
    env.publish(&event).await;
    // Acked after the first call, the event would be lost: no dead letter.
    let dead = env.dead_letter().await;
    stop(running).await;

    assert_eq!(
        AtomicUsize::load(&calls, Ordering::SeqCst),
        2,
        "max_attempts calls"
    );
    assert_eq!(env.effects(event.id).await, 0, "every attempt rolled back");
    assert_eq!(env.inbox_rows().await, 0, "inbox entries rolled back too");
    let reason = wire::header_str(
        dead.properties.headers().as_ref().unwrap(),
        DEAD_REASON_HEADER,
    )
    .unwrap()
    .to_owned();
    assert!(
        reason.contains("cannot commit") && reason.contains("aborted"),
        "{reason}"
    );
    assert_eq!(dead.data, event.payload.as_bytes());
}
