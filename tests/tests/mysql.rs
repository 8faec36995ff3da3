//! The relay end to end on MariaDB: MariaDB outbox → relays → RabbitMQ,
//! through the facade, against the real servers. Each test owns a MariaDB
//! database and an exchange/queue pair.
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
