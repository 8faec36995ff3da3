//! The inbox consumer on SQLite, through the facade, against RabbitMQ:
//! each test owns a database file (removed when it ends) and its exchange
//! and queues.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use outbox::DomainEvent;
use outbox::sqlite::{self, AsyncSqliteConnection};
use outbox_testkit::amqp::TestBroker;
use outbox_testkit::eventually::eventually;
use outbox_testkit::names;
use outbox_testkit::sqlite::TestSqliteFile;
use outbox_testkit::urls::amqp_url;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, DomainEvent)]
#[domain_event(aggregate = "order")]
struct OrderPlaced {
    #[aggregate_id]
    order: String,
    n: u32,
}

#[derive(diesel::QueryableByName)]
struct N {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

async fn count(conn: &mut AsyncSqliteConnection, sql: &str) -> i64 {
    diesel_async::RunQueryDsl::get_result::<N>(diesel::sql_query(sql), conn)
        .await
        .unwrap()
        .n
}

/// The inbox consumer on SQLite: the handler works in a
/// `SqliteTransaction`, a redelivered event takes effect once, and an event
/// the handler records commits with its effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_consumer_takes_a_redelivered_event_once() {
    use outbox::rabbitmq::{
        EventHandler, HandlerError, InboxConsumer, IncomingEvent, QueueTopology, wire,
    };
    use outbox::sqlite::{SqliteInbox, SqliteInboxDatabase, SqliteTransaction};

    struct Effect(Arc<std::sync::atomic::AtomicUsize>);

    impl EventHandler<SqliteTransaction> for Effect {
        async fn handle(
            &self,
            tx: &mut SqliteTransaction,
            event: &IncomingEvent,
        ) -> Result<(), HandlerError> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            diesel_async::RunQueryDsl::execute(
                diesel::sql_query("INSERT INTO effects (event_id) VALUES (?1)")
                    .bind::<diesel::sql_types::Text, _>(event.id.to_string()),
                &mut **tx,
            )
            .await?;
            sqlite::record(
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

    let name = names::unique("sq", "consumer");
    let file = TestSqliteFile::temp("sq", "consumer");
    let url = file.url();
    let mut conn = sqlite::connect(&url).await.unwrap();
    sqlite::migrate(&mut conn).await.unwrap();
    diesel_async::SimpleAsyncConnection::batch_execute(
        &mut conn,
        "CREATE TABLE effects (event_id TEXT PRIMARY KEY)",
    )
    .await
    .unwrap();
    let broker = TestBroker::new(&name).await;
    let exchange = broker.named("x");
    let topology = QueueTopology::new(broker.named("q"))
        .exchange(&exchange)
        .bind("order.*");
    broker.delete_queue_on_drop(topology.queue_name());
    broker.delete_queue_on_drop(topology.dead_letter_queue_name().unwrap());
    broker.delete_exchange_on_drop(&exchange);
    broker.delete_exchange_on_drop(topology.dead_letter_exchange_name().unwrap());
    topology.declare(broker.channel()).await.unwrap();

    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let database = SqliteInboxDatabase::new(sqlite::pool(&url, 4).unwrap(), SqliteInbox::default());
    let consumer = InboxConsumer::builder(
        amqp_url(),
        topology.queue_name(),
        format!("{name}.consumer"),
        database,
        Effect(Arc::clone(&calls)),
    )
    .build()
    .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(consumer.run(async {
        let _ = stopped.await;
    }));

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
        "SELECT count(*) AS n FROM effects WHERE event_id = '{}'",
        sentinel.id
    );
    eventually("the sentinel's effect")
        .within(Duration::from_secs(30))
        .until(|| {
            let url = url.clone();
            let sql = sentinel_effect.clone();
            async move {
                let mut conn = sqlite::connect(&url).await.unwrap();
                count(&mut conn, &sql).await == 1
            }
        })
        .await;
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the consumer stops")
        .unwrap()
        .unwrap();

    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM effects").await,
        2,
        "one effect per event"
    );
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the handler skipped the copy (a duplicate), it did not fail on it"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM inbox_events").await,
        2
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM outbox_events WHERE aggregate_id = 'chained'"
        )
        .await,
        2,
        "each handled event recorded its chained event in the same transaction"
    );
}
