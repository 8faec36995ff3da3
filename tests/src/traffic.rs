//! Traffic of a scenario: producers that commit business rows with their
//! events (and roll some back on purpose), the verifying tap that records
//! every message the relay got to the broker, and the inbox consumer whose
//! effects must happen exactly once.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use diesel::sql_types::{Integer, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use outbox::DomainEvent;
use outbox::postgres::{Outbox, PgInbox, PgInboxDatabase, PgTransaction};
use outbox::rabbitmq::{EventHandler, HandlerError, InboxConsumer, IncomingEvent};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::Scenario;

/// The event every producer records: the `seq`-th event of `aggregate`.
#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[domain_event(aggregate = "fault", event_type = "fault.tick")]
pub struct Tick {
    /// Aggregate id (`p<producer>-a<n>`).
    #[aggregate_id]
    pub aggregate: String,
    /// Increases with every transaction of the aggregate, committed or not.
    pub seq: i32,
}

/// The same event under an event type the scenario may leave unbound
/// (`fault.late`): its payload reads as a [`Tick`].
#[derive(Debug, Serialize, Deserialize, DomainEvent)]
#[domain_event(aggregate = "fault", event_type = "fault.late")]
pub struct Late {
    /// Aggregate id.
    #[aggregate_id]
    pub aggregate: String,
    /// As [`Tick::seq`].
    pub seq: i32,
}

impl From<&Tick> for Late {
    fn from(tick: &Tick) -> Late {
        Late {
            aggregate: tick.aggregate.clone(),
            seq: tick.seq,
        }
    }
}

/// How the producers run.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// Concurrent producers (each with its own connection).
    pub producers: usize,
    /// Aggregates per producer; a producer cycles through its own.
    pub aggregates: usize,
    /// Pause between two transactions of one producer.
    pub interval: Duration,
    /// Every `rollback_every`-th transaction records its events and rolls
    /// back on purpose (0: never).
    pub rollback_every: usize,
    /// The first `late_producers` producers record the events of every
    /// third transaction on their first two aggregates as [`Late`] (event
    /// type `fault.late`) instead of [`Tick`]s.
    pub late_producers: usize,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            producers: 3,
            aggregates: 10,
            interval: Duration::from_millis(10),
            rollback_every: 7,
            late_producers: 0,
        }
    }
}

/// What the producers did.
#[derive(Debug, Default, Clone)]
pub struct Produced {
    /// Transactions that committed.
    pub committed_transactions: usize,
    /// Event ids of transactions rolled back on purpose.
    pub rolled_back: Vec<Uuid>,
    /// Transactions that failed (connection lost, database down); the
    /// outcome of a failed COMMIT is unknown to the producer, the `orders`
    /// table tells.
    pub failed: usize,
}

/// Running producers; [`stop`](Self::stop) ends them and returns what they
/// did.
#[derive(Debug)]
pub struct Producers {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<Produced>>,
}

#[derive(Debug)]
enum TxError {
    RollBack(Vec<Uuid>),
    Failed(String),
}

impl From<diesel::result::Error> for TxError {
    fn from(e: diesel::result::Error) -> Self {
        TxError::Failed(e.to_string())
    }
}

impl From<outbox::postgres::Error> for TxError {
    fn from(e: outbox::postgres::Error) -> Self {
        TxError::Failed(e.to_string())
    }
}

impl Producers {
    /// Starts the producers on the scenario's database. Each transaction
    /// inserts 1–3 `orders` rows and records their [`Tick`]s through
    /// [`Outbox::record_all`]; connection failures are counted and the
    /// producer reconnects.
    pub fn start(scenario: &Scenario, config: ProducerConfig) -> Producers {
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..config.producers)
            .map(|p| {
                let url = scenario.servers.database_url.clone();
                let schema = scenario.schema.clone();
                let config = config.clone();
                let stop = Arc::clone(&stop);
                tokio::spawn(produce(p, url, schema, config, stop))
            })
            .collect();
        Producers { stop, tasks }
    }

    /// Stops the producers after their current transaction.
    pub async fn stop(self) -> Produced {
        AtomicBool::store(&self.stop, true, Ordering::Relaxed);
        let mut total = Produced::default();
        for task in self.tasks {
            let Ok(produced) = task.await else {
                panic!("a producer panicked");
            };
            total.committed_transactions += produced.committed_transactions;
            total.rolled_back.extend(produced.rolled_back);
            total.failed += produced.failed;
        }
        total
    }
}

async fn produce(
    producer: usize,
    url: String,
    schema: String,
    config: ProducerConfig,
    stop: Arc<AtomicBool>,
) -> Produced {
    let outbox = Outbox::new(&schema).unwrap_or_else(|e| panic!("outbox: {e}"));
    let insert =
        format!("INSERT INTO \"{schema}\".orders (event_id, aggregate, seq) VALUES ($1, $2, $3)");
    let mut produced = Produced::default();
    let mut seqs = vec![0i32; config.aggregates.max(1)];
    let mut conn: Option<AsyncPgConnection> = None;
    let mut round = 0usize;
    while !AtomicBool::load(&stop, Ordering::Relaxed) {
        let Some(c) = conn.as_mut() else {
            match AsyncPgConnection::establish(&url).await {
                Ok(c) => conn = Some(c),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
            continue;
        };
        round += 1;
        let a = round % seqs.len();
        let events: Vec<Tick> = (0..1 + round % 3)
            .map(|i| Tick {
                aggregate: format!("p{producer}-a{a}"),
                seq: seqs[a] + i as i32,
            })
            .collect();
        // Sequence numbers are spent whatever the outcome, so they grow in
        // commit order even when a COMMIT's outcome is unknown.
        seqs[a] += events.len() as i32;
        let roll_back = config.rollback_every > 0 && round.is_multiple_of(config.rollback_every);
        let late = producer < config.late_producers && a < 2 && round.is_multiple_of(3);
        let result = c
            .transaction::<_, TxError, _>(async |tx| {
                let ids = if late {
                    let events: Vec<Late> = events.iter().map(Late::from).collect();
                    outbox.record_all(tx, &events).await?
                } else {
                    outbox.record_all(tx, &events).await?
                };
                for (id, event) in ids.iter().zip(&events) {
                    diesel::sql_query(&insert)
                        .bind::<diesel::sql_types::Uuid, _>(id)
                        .bind::<Text, _>(&event.aggregate)
                        .bind::<Integer, _>(event.seq)
                        .execute(tx)
                        .await?;
                }
                if roll_back {
                    return Err(TxError::RollBack(ids));
                }
                Ok(())
            })
            .await;
        match result {
            Ok(()) => produced.committed_transactions += 1,
            Err(TxError::RollBack(ids)) => produced.rolled_back.extend(ids),
            Err(TxError::Failed(error)) => {
                tracing::debug!(producer, %error, "transaction failed; reconnecting");
                produced.failed += 1;
                conn = None;
            }
        }
        tokio::time::sleep(config.interval).await;
    }
    produced
}

/// Commits `count` [`Tick`]s of `aggregate` (with their `orders` rows) in
/// one transaction, numbered from `first_seq`; returns their ids.
pub async fn commit_burst(
    scenario: &Scenario,
    aggregate: &str,
    first_seq: i32,
    count: usize,
) -> Vec<Uuid> {
    let schema = &scenario.schema;
    let outbox = Outbox::new(schema).unwrap_or_else(|e| panic!("outbox: {e}"));
    let events: Vec<Tick> = (0..count)
        .map(|i| Tick {
            aggregate: aggregate.to_owned(),
            seq: first_seq + i32::try_from(i).unwrap_or(i32::MAX),
        })
        .collect();
    let insert = format!(
        "INSERT INTO \"{schema}\".orders (event_id, aggregate, seq) \
         SELECT * FROM unnest($1::uuid[], $2::text[], $3::int[])"
    );
    let mut conn = scenario
        .pool()
        .get()
        .await
        .unwrap_or_else(|e| panic!("no connection: {e}"));
    conn.transaction::<_, TxError, _>(async |tx| {
        let ids = outbox.record_all(tx, &events).await?;
        diesel::sql_query(&insert)
            .bind::<diesel::sql_types::Array<diesel::sql_types::Uuid>, _>(&ids)
            .bind::<diesel::sql_types::Array<Text>, _>(
                events
                    .iter()
                    .map(|e| e.aggregate.clone())
                    .collect::<Vec<_>>(),
            )
            .bind::<diesel::sql_types::Array<Integer>, _>(
                events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            )
            .execute(tx)
            .await?;
        Ok(ids)
    })
    .await
    .unwrap_or_else(|e| panic!("committing {count} events of {aggregate}: {e:?}"))
}

/// One message received by the [`Tap`].
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The event id (`message_id`).
    pub id: Uuid,
    /// From the payload.
    pub aggregate: String,
    /// From the payload.
    pub seq: i32,
    /// The broker's `redelivered` flag: the tap saw it before but its ack
    /// was lost with its connection.
    pub redelivered: bool,
}

/// The verifying consumer: records every message on the scenario's tap
/// queue, in arrival order, acking each after recording it; reconnects when
/// its connection is lost (a broker outage).
#[derive(Debug)]
pub struct Tap {
    received: Arc<Mutex<Vec<Delivery>>>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Tap {
    /// Starts consuming the scenario's tap queue.
    pub fn start(scenario: &Scenario) -> Tap {
        let received: Arc<Mutex<Vec<Delivery>>> = Arc::default();
        let (stop, mut stopped) = oneshot::channel::<()>();
        let url = scenario.servers.amqp_url.clone();
        let queue = scenario.tap_queue.clone();
        let name = format!("{}.tap", scenario.name);
        let sink = Arc::clone(&received);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => return,
                    () = consume(&url, &queue, &name, &sink) => {}
                }
                tokio::select! {
                    _ = &mut stopped => return,
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
        });
        Tap {
            received,
            stop: Some(stop),
            task,
        }
    }

    /// Every message so far, in arrival order.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.received.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// The distinct event ids so far.
    pub fn unique_ids(&self) -> HashSet<Uuid> {
        self.received
            .lock()
            .map(|r| r.iter().map(|d| d.id).collect())
            .unwrap_or_default()
    }

    /// Stops consuming.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for Tap {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Consumes until the connection or the consumer ends.
async fn consume(url: &str, queue: &str, name: &str, sink: &Mutex<Vec<Delivery>>) {
    // Bounded: a broker that is starting may accept TCP and not answer.
    let connecting = Connection::connect(
        url,
        ConnectionProperties::default().with_connection_name(name.into()),
    );
    let Ok(Ok(conn)) = tokio::time::timeout(Duration::from_secs(5), connecting).await else {
        return;
    };
    let Ok(channel) = conn.create_channel().await else {
        return;
    };
    if channel
        .basic_qos(500, BasicQosOptions::default())
        .await
        .is_err()
    {
        return;
    }
    let Ok(mut consumer) = channel
        .basic_consume(
            queue.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
    else {
        return;
    };
    while let Some(Ok(delivery)) = consumer.next().await {
        let id = delivery
            .properties
            .message_id()
            .as_ref()
            .and_then(|id| Uuid::parse_str(id.as_str()).ok());
        let tick: Option<Tick> = serde_json::from_slice(&delivery.data).ok();
        let (Some(id), Some(tick)) = (id, tick) else {
            panic!(
                "the tap got a message that is not a Tick with an event id: {:?}",
                String::from_utf8_lossy(&delivery.data)
            );
        };
        if let Ok(mut sink) = sink.lock() {
            sink.push(Delivery {
                id,
                aggregate: tick.aggregate,
                seq: tick.seq,
                redelivered: delivery.redelivered,
            });
        }
        if delivery.ack(BasicAckOptions::default()).await.is_err() {
            return;
        }
    }
}

/// How the inbox consumer's handler misbehaves.
#[derive(Debug, Clone, Default)]
pub struct HandlerFaults {
    /// Sleep this long in every handler call (a slow consumer: with a small
    /// prefetch the queue backs up).
    pub slow: Duration,
    /// The first attempt of every `fail_every`-th event fails (0: never);
    /// the consumer retries it.
    pub fail_every: u32,
}

/// The scenario's inbox consumer: writes one `effects` row per event on the
/// consumer's transaction.
#[derive(Debug)]
struct WriteEffect {
    insert: String,
    consumer: String,
    faults: HandlerFaults,
    failed_once: Mutex<HashSet<Uuid>>,
}

impl EventHandler<PgTransaction> for WriteEffect {
    async fn handle(
        &self,
        tx: &mut PgTransaction,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        let tick: Tick = event.payload_as().map_err(HandlerError::permanent)?;
        if !self.faults.slow.is_zero() {
            tokio::time::sleep(self.faults.slow).await;
        }
        diesel::sql_query(&self.insert)
            .bind::<diesel::sql_types::Uuid, _>(event.id)
            .bind::<Text, _>(&self.consumer)
            .execute(&mut **tx)
            .await
            .map_err(HandlerError::new)?;
        let every = self.faults.fail_every;
        let first_attempt = || {
            self.failed_once
                .lock()
                .is_ok_and(|mut f| f.insert(event.id))
        };
        if every > 0 && tick.seq.unsigned_abs().is_multiple_of(every) && first_attempt() {
            return Err(HandlerError::new(format!(
                "failing the first attempt of {} seq {} on purpose",
                tick.aggregate, tick.seq
            )));
        }
        Ok(())
    }
}

/// A running inbox consumer.
#[derive(Debug)]
pub struct Inbox {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<outbox::rabbitmq::Result<()>>,
}

impl Inbox {
    /// Starts an [`InboxConsumer`] on the scenario's inbox queue, named
    /// `<scenario>.inbox`, with `prefetch` and the handler `faults`.
    /// Retries wait 200 ms; a message is dead-lettered after 5 failed
    /// attempts (the library's default). A database outage spends none.
    pub fn start(scenario: &Scenario, prefetch: u16, faults: HandlerFaults) -> Inbox {
        Inbox::start_concurrent(scenario, prefetch, 1, faults)
    }

    /// [`Inbox::start`] handling `concurrency` deliveries at once (of
    /// different aggregates; the scenario's pool has 8 connections).
    pub fn start_concurrent(
        scenario: &Scenario,
        prefetch: u16,
        concurrency: usize,
        faults: HandlerFaults,
    ) -> Inbox {
        let name = format!("{}.inbox", scenario.name);
        let inbox = PgInbox::new(&scenario.schema).unwrap_or_else(|e| panic!("inbox: {e}"));
        let handler = WriteEffect {
            insert: format!(
                "INSERT INTO \"{}\".effects (event_id, consumer) VALUES ($1, $2)",
                scenario.schema
            ),
            consumer: name.clone(),
            faults,
            failed_once: Mutex::default(),
        };
        let consumer = InboxConsumer::builder(
            scenario.servers.amqp_url.clone(),
            scenario.inbox_queue.clone(),
            name,
            PgInboxDatabase::new(scenario.pool(), inbox),
            handler,
        )
        .declare(scenario.inbox_topology())
        .prefetch(prefetch)
        .concurrency(concurrency)
        .max_attempts(5)
        .retry_delay(Duration::from_millis(200))
        .reconnect_backoff(Duration::from_millis(100), Duration::from_secs(1))
        .build()
        .unwrap_or_else(|e| panic!("inbox consumer: {e}"));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(consumer.run(async {
            let _ = stopped.await;
        }));
        Inbox {
            stop: Some(stop),
            task,
        }
    }

    /// Stops the consumer; panics if it had stopped with an error.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match tokio::time::timeout(Duration::from_secs(30), &mut self.task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => panic!("the inbox consumer stopped with an error: {e}"),
            Ok(Err(e)) => panic!("the inbox consumer panicked: {e}"),
            Err(_) => panic!("the inbox consumer did not stop within 30 s"),
        }
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        self.task.abort();
    }
}
