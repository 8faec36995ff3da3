//! The relay end to end on MariaDB: MariaDB outbox → relays → RabbitMQ,
//! through the facade, against the real servers; the inbox consumer and
//! its dead letters too. Each test owns a MariaDB database and an
//! exchange/queue pair.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions};
use lapin::types::FieldTable;
use outbox::mysql::{self, MysqlSettings};
use outbox::rabbitmq::LapinPublisher;
use outbox::{DomainEvent, Relay, RetryPolicy};
use outbox_testkit::amqp::TestBroker;
use outbox_testkit::eventually::eventually;
use outbox_testkit::mysql::TestMysqlDatabase;
use outbox_testkit::names;
use outbox_testkit::urls::{amqp_url, mysql_url};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[domain_event(aggregate = "order")]
struct OrderPlaced {
    #[aggregate_id]
    order: String,
    n: u32,
}

/// 3,000 events of 30 aggregates, recorded while two relays run, arrive
/// once each and in order per aggregate; the outbox ends empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_deliver_everything_once_in_order_per_aggregate() {
    let name = names::unique("my", "relays");
    let db = TestMysqlDatabase::create(&mysql_url(), &name).await;
    mysql::migrate_url(db.url()).await.unwrap();
    let broker = TestBroker::new(&name).await;
    let exchange = broker.topic_exchange(&broker.named("x")).await;
    let queue = broker.queue(&broker.named("q")).await;
    broker.bind(&queue, &exchange, "order.*").await;

    let received: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let mut consumer = broker
        .channel()
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let sink = Arc::clone(&received);
    tokio::spawn(async move {
        while let Some(Ok(delivery)) = consumer.next().await {
            let event: OrderPlaced = serde_json::from_slice(&delivery.data).unwrap();
            sink.lock().unwrap().push((event.order, event.n));
            let _ = delivery.ack(BasicAckOptions::default()).await;
        }
    });

    let pool = mysql::pool(db.url(), 8).unwrap();
    let settings = MysqlSettings::default();
    let mut relays = Vec::new();
    for i in 0..2 {
        let publisher = LapinPublisher::builder(amqp_url())
            .exchange(&exchange)
            .source("/tests")
            .connection_name(format!("{name}.relay{i}"))
            .build()
            .unwrap();
        let relay = Relay::builder(settings.store(pool.clone()), publisher)
            .batch_size(50)
            .poll_interval(Duration::from_millis(20))
            .retry(RetryPolicy::default())
            .build()
            .unwrap();
        let handle = relay.handle();
        relays.push((handle, tokio::spawn(relay.run())));
    }

    const AGGREGATES: u32 = 30;
    const EACH: u32 = 100;
    for n in 0..EACH {
        let mut tx = outbox::mysql::MysqlTransaction::begin(&pool).await.unwrap();
        let events: Vec<OrderPlaced> = (0..AGGREGATES)
            .map(|a| OrderPlaced {
                order: format!("o-{a}"),
                n,
            })
            .collect();
        mysql::record_all(&mut tx, &events).await.unwrap();
        tx.commit().await.unwrap();
    }

    let total = (AGGREGATES * EACH) as usize;
    eventually("every event received")
        .within(Duration::from_secs(60))
        .equals(total, || {
            let got = received.lock().unwrap().len();
            async move { got.min(total) }
        })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = received.lock().unwrap().clone();
    assert_eq!(got.len(), total, "each event once");
    let mut last: HashMap<String, u32> = HashMap::new();
    for (order, n) in got {
        if let Some(previous) = last.insert(order.clone(), n) {
            assert_eq!(n, previous + 1, "{order}: {n} after {previous}");
        } else {
            assert_eq!(n, 0, "{order} starts at its first event");
        }
    }
    let mut conn = mysql::connect(db.url()).await.unwrap();
    assert_eq!(
        outbox_testkit::mysql::count(&mut conn, "SELECT COUNT(*) AS n FROM outbox_events").await,
        0
    );
    for (handle, task) in relays {
        handle.shutdown();
        task.await.unwrap();
    }
}

/// On MariaDB the events behind a failing head are held and released by
/// the store itself (no trigger): o-1's first event is unroutable (nothing
/// binds its routing key yet), so its next event is held while o-2 flows;
/// once the binding appears, both of o-1's arrive, in order, and nothing is
/// left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_held_behind_an_unroutable_head_are_released_in_order() {
    let name = names::unique("my", "held");
    let db = TestMysqlDatabase::create(&mysql_url(), &name).await;
    mysql::migrate_url(db.url()).await.unwrap();
    let broker = TestBroker::new(&name).await;
    let exchange = broker.topic_exchange(&broker.named("x")).await;
    let queue = broker.queue(&broker.named("q")).await;
    broker.bind(&queue, &exchange, "order.*").await;

    let received: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let mut consumer = broker
        .channel()
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let sink = Arc::clone(&received);
    tokio::spawn(async move {
        while let Some(Ok(delivery)) = consumer.next().await {
            let event: OrderPlaced = serde_json::from_slice(&delivery.data).unwrap();
            sink.lock().unwrap().push((event.order, event.n));
            let _ = delivery.ack(BasicAckOptions::default()).await;
        }
    });

    let pool = mysql::pool(db.url(), 4).unwrap();
    let mut tx = outbox::mysql::MysqlTransaction::begin(&pool).await.unwrap();
    let events = [("o-1", 0), ("o-1", 1), ("o-2", 0)].map(|(order, n)| OrderPlaced {
        order: order.into(),
        n,
    });
    mysql::record_all(&mut tx, &events).await.unwrap();
    tx.commit().await.unwrap();

    // o-1's first event goes to `refund.issued`, which nothing binds yet.
    let publisher = LapinPublisher::builder(amqp_url())
        .exchange(&exchange)
        .source("/tests")
        .connection_name(format!("{name}.relay"))
        .routing_key(|e| {
            if e.aggregate_id == "o-1" && e.payload.contains("\"n\":0") {
                "refund.issued".into()
            } else {
                e.event_type.clone()
            }
        })
        .build()
        .unwrap();
    let relay = Relay::builder(MysqlSettings::default().store(pool.clone()), publisher)
        .batch_size(10)
        .poll_interval(Duration::from_millis(20))
        .unroutable(outbox::UnroutablePolicy::hold(
            Duration::from_secs(600),
            Duration::from_secs(1),
        ))
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());

    eventually("o-2 delivered")
        .within(Duration::from_secs(30))
        .until(|| {
            let got = received.lock().unwrap().contains(&("o-2".into(), 0));
            async move { got }
        })
        .await;
    let count = |sql: &'static str| {
        let url = db.url().to_owned();
        async move {
            let mut conn = mysql::connect(&url).await.unwrap();
            outbox_testkit::mysql::count(&mut conn, sql).await
        }
    };
    eventually("o-1's second event held")
        .within(Duration::from_secs(30))
        .until(|| {
            let held = count("SELECT COUNT(*) AS n FROM outbox_events WHERE status = 'held'");
            async move { held.await == 1 }
        })
        .await;
    assert!(
        !received.lock().unwrap().iter().any(|(o, _)| o == "o-1"),
        "nothing of o-1 before its head"
    );

    broker.bind(&queue, &exchange, "refund.*").await;
    eventually("o-1's events delivered")
        .within(Duration::from_secs(30))
        .until(|| {
            let got = received
                .lock()
                .unwrap()
                .iter()
                .filter(|(o, _)| o == "o-1")
                .count();
            async move { got == 2 }
        })
        .await;
    handle.shutdown();
    task.await.unwrap();
    let o1: Vec<u32> = received
        .lock()
        .unwrap()
        .iter()
        .filter(|(o, _)| o == "o-1")
        .map(|(_, n)| *n)
        .collect();
    assert_eq!(o1, [0, 1], "in order");
    assert_eq!(count("SELECT COUNT(*) AS n FROM outbox_events").await, 0);
}

/// Queue `q` of `broker`, bound to topic exchange `x` for `order.*`, with
/// its dead-letter exchange and queue, declared, all deleted when `broker`
/// is dropped; the exchange's name and the topology.
async fn declared_topology(broker: &TestBroker) -> (String, outbox::rabbitmq::QueueTopology) {
    let exchange = broker.named("x");
    let topology = outbox::rabbitmq::QueueTopology::new(broker.named("q"))
        .exchange(&exchange)
        .bind("order.*");
    broker.delete_queue_on_drop(topology.queue_name());
    broker.delete_queue_on_drop(topology.dead_letter_queue_name().unwrap());
    broker.delete_exchange_on_drop(&exchange);
    broker.delete_exchange_on_drop(topology.dead_letter_exchange_name().unwrap());
    topology.declare(broker.channel()).await.unwrap();
    (exchange, topology)
}

/// An inbox consumer of MariaDB, running.
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<outbox::rabbitmq::Result<()>>,
}

impl Running {
    /// Consumes `queue` as `<name>.consumer`, handlers' transactions from
    /// `pool`.
    fn start<H>(
        queue: &str,
        name: &str,
        pool: &diesel_async::pooled_connection::deadpool::Pool<diesel_async::AsyncMysqlConnection>,
        handler: H,
    ) -> Running
    where
        H: outbox::rabbitmq::EventHandler<mysql::MysqlTransaction> + Send + Sync + 'static,
    {
        let database = mysql::MysqlInboxDatabase::new(pool.clone(), mysql::MysqlInbox::default());
        let consumer = outbox::rabbitmq::InboxConsumer::builder(
            amqp_url(),
            queue,
            format!("{name}.consumer"),
            database,
            handler,
        )
        .build()
        .unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(consumer.run(async {
            let _ = stopped.await;
        }));
        Running { stop, task }
    }

    /// Stops it and waits until it has.
    async fn stop(self) {
        let _ = self.stop.send(());
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the consumer stops")
            .unwrap()
            .unwrap();
    }
}

/// The inbox consumer on MariaDB: the handler works in a
/// `MysqlTransaction`, a redelivered event takes effect once, and an event
/// the handler records commits with its effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_consumer_takes_a_redelivered_event_once() {
    use outbox::mysql::MysqlTransaction;
    use outbox::rabbitmq::{EventHandler, HandlerError, IncomingEvent, wire};

    struct Effect(Arc<std::sync::atomic::AtomicUsize>);

    impl EventHandler<MysqlTransaction> for Effect {
        async fn handle(
            &self,
            tx: &mut MysqlTransaction,
            event: &IncomingEvent,
        ) -> Result<(), HandlerError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            diesel_async::RunQueryDsl::execute(
                diesel::sql_query("INSERT INTO effects (event_id) VALUES (?)")
                    .bind::<diesel::sql_types::Text, _>(event.id.to_string()),
                &mut **tx,
            )
            .await?;
            mysql::record(
                tx,
                &OrderPlaced {
                    order: "chained".into(),
                    n: 0,
                },
            )
            .await?;
            Ok(())
        }
    }

    let name = names::unique("my", "consumer");
    let db = TestMysqlDatabase::create(&mysql_url(), &name).await;
    let mut conn = mysql::connect(db.url()).await.unwrap();
    mysql::migrate(&mut conn).await.unwrap();
    diesel_async::SimpleAsyncConnection::batch_execute(
        &mut conn,
        "CREATE TABLE effects (event_id CHAR(36) PRIMARY KEY)",
    )
    .await
    .unwrap();
    let broker = TestBroker::new(&name).await;
    let (exchange, topology) = declared_topology(&broker).await;

    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let pool = mysql::pool(db.url(), 4).unwrap();
    let consumer = Running::start(
        topology.queue_name(),
        &name,
        &pool,
        Effect(Arc::clone(&calls)),
    );

    let event = outbox::EventEnvelope::from_event(&OrderPlaced {
        order: "o-1".into(),
        n: 0,
    })
    .unwrap();
    let sentinel = outbox::EventEnvelope::from_event(&OrderPlaced {
        order: "o-2".into(),
        n: 0,
    })
    .unwrap();
    for envelope in [&event, &event, &sentinel] {
        let confirm = broker
            .publish(
                &exchange,
                &envelope.event_type,
                envelope.payload.as_bytes(),
                wire::properties(envelope, "/tests"),
            )
            .await;
        assert_eq!(confirm, lapin::Confirmation::Ack(None));
    }
    let sentinel_effect = format!(
        "SELECT COUNT(*) AS n FROM effects WHERE event_id = '{}'",
        sentinel.id
    );
    eventually("the sentinel's effect")
        .within(Duration::from_secs(30))
        .until(|| {
            let url = db.url().to_owned();
            let sql = sentinel_effect.clone();
            async move {
                let mut conn = mysql::connect(&url).await.unwrap();
                outbox_testkit::mysql::count(&mut conn, &sql).await == 1
            }
        })
        .await;
    consumer.stop().await;

    assert_eq!(
        outbox_testkit::mysql::count(&mut conn, "SELECT COUNT(*) AS n FROM effects").await,
        2,
        "one effect per event"
    );
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the handler skipped the copy (a duplicate), it did not fail on it"
    );
    assert_eq!(
        outbox_testkit::mysql::count(&mut conn, "SELECT COUNT(*) AS n FROM inbox_events").await,
        2
    );
    assert_eq!(
        outbox_testkit::mysql::count(
            &mut conn,
            "SELECT COUNT(*) AS n FROM outbox_events WHERE aggregate_id = 'chained'"
        )
        .await,
        2,
        "each handled event recorded its chained event in the same transaction"
    );
}

/// A message the handler refuses for good is dead-lettered and recorded in
/// MariaDB; `outbox::mysql::MysqlDeadLetters` lists it, and a replay of
/// the dead-letter queue through `outbox::admin::DeadLetters` moves it
/// back to its queue, marks its record replayed and audits the replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_recorded_listed_and_replayed_through_the_facade() {
    use outbox::admin::{Caller, DeadLetterQuery, DeadLetterStore as _, DeadLetters, DlqReplay};
    use outbox::mysql::{MysqlDeadLetters, MysqlTransaction};
    use outbox::rabbitmq::{DeadLetterQueues, EventHandler, HandlerError, IncomingEvent, wire};

    struct Refuse;

    impl EventHandler<MysqlTransaction> for Refuse {
        async fn handle(
            &self,
            _tx: &mut MysqlTransaction,
            _event: &IncomingEvent,
        ) -> Result<(), HandlerError> {
            Err(HandlerError::permanent("stock for row 17 missing"))
        }
    }

    let name = names::unique("my", "dlq");
    let db = TestMysqlDatabase::create(&mysql_url(), &name).await;
    let mut conn = mysql::connect(db.url()).await.unwrap();
    mysql::migrate(&mut conn).await.unwrap();
    let broker = TestBroker::new(&name).await;
    let (exchange, topology) = declared_topology(&broker).await;
    let queue = topology.queue_name().to_owned();
    let dead = topology.dead_letter_queue_name().unwrap().to_owned();

    let pool = mysql::pool(db.url(), 4).unwrap();
    let consumer = Running::start(&queue, &name, &pool, Refuse);
    let event = outbox::EventEnvelope::from_event(&OrderPlaced {
        order: "o-1".into(),
        n: 0,
    })
    .unwrap();
    let confirm = broker
        .publish(
            &exchange,
            &event.event_type,
            event.payload.as_bytes(),
            wire::properties(&event, "/tests"),
        )
        .await;
    assert_eq!(confirm, lapin::Confirmation::Ack(None));
    let letters = MysqlDeadLetters::new(pool.clone());
    let page = eventually("the dead letter's record")
        .within(Duration::from_secs(30))
        .some(|| {
            let letters = letters.clone();
            async move {
                let page = letters.list(&DeadLetterQuery::new()).await.unwrap();
                (!page.items.is_empty()).then_some(page)
            }
        })
        .await;
    eventually("the message in the dead-letter queue")
        .within(Duration::from_secs(30))
        .until(|| {
            let (broker, dead) = (&broker, &dead);
            async move { broker.ready(dead).await == 1 }
        })
        .await;
    // Stopped, so that the replayed message is not refused again.
    consumer.stop().await;
    assert_eq!(page.items.len(), 1);
    let record = &page.items[0];
    assert_eq!(record.letter.event_id, Some(event.id));
    assert_eq!(record.letter.queue, queue);
    assert!(
        record.letter.reason.contains("stock for row 17 missing"),
        "{record:?}"
    );
    assert_eq!(record.letter.payload, event.payload);

    let admin = DeadLetters::new(letters.clone(), DeadLetterQueues::new(amqp_url()));
    let groups = admin.groups(None).await.unwrap();
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].count, 1);
    let outcome = admin
        .replay(&Caller::operator("alice"), &DlqReplay::new(&dead), &|_| {})
        .await
        .unwrap();
    assert_eq!(outcome.report.replayed, 1, "{outcome:?}");
    assert_eq!(outcome.marked, 1, "{outcome:?}");
    assert_eq!(broker.ready(&queue).await, 1, "back in its queue");
    assert_eq!(broker.ready(&dead).await, 0);
    let open = letters.list(&DeadLetterQuery::new()).await.unwrap();
    assert!(open.items.is_empty(), "{open:?}");
    let shown = letters.show(record.id).await.unwrap().unwrap();
    assert!(shown.replayed_at.is_some() && shown.purged_at.is_none());
    assert_eq!(
        outbox_testkit::mysql::count(
            &mut conn,
            "SELECT COUNT(*) AS n FROM outbox_audit \
             WHERE action = 'dlq_replay' AND identity = 'alice' AND count = 1 \
             AND outcome LIKE 'done%' AND finished_at IS NOT NULL"
        )
        .await,
        1
    );
}
