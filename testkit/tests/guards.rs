//! The guards clean up after a test that panics: its schema (even with a
//! session of the test still holding locks in it), its database (on
//! PostgreSQL and on MariaDB), its exchange and queues are gone once the
//! panicking thread has unwound, inside a runtime or outside any.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use diesel_async::SimpleAsyncConnection;
use lapin::ExchangeKind;
use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use outbox_testkit::amqp::{self, TestBroker};
use outbox_testkit::mysql::{self, TestMysqlDatabase};
use outbox_testkit::names::unique;
use outbox_testkit::pg::{self, TestDatabase, TestSchema};
use outbox_testkit::urls::{amqp_url, database_url, mysql_url};

/// Whether schema `name` exists.
async fn schema_exists(name: &str) -> bool {
    let mut conn = pg::connect(&database_url()).await;
    pg::count(
        &mut conn,
        &format!("SELECT count(*) AS n FROM pg_namespace WHERE nspname = '{name}'"),
    )
    .await
        == 1
}

/// Whether database `name` exists.
async fn database_exists(name: &str) -> bool {
    let mut conn = pg::connect(&database_url()).await;
    pg::count(
        &mut conn,
        &format!("SELECT count(*) AS n FROM pg_database WHERE datname = '{name}'"),
    )
    .await
        == 1
}

/// Whether queue `name` exists (a passive declare on a channel of its
/// own: a missing queue closes the channel).
async fn queue_exists(name: &str) -> bool {
    let conn = amqp::connect(&amqp_url(), "testkit.probe").await;
    let channel = conn.create_channel().await.unwrap();
    let exists = channel
        .queue_declare(
            name.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .is_ok();
    let _ = conn.close(200, "probed".into()).await;
    exists
}

/// Whether exchange `name` exists.
async fn exchange_exists(name: &str) -> bool {
    let conn = amqp::connect(&amqp_url(), "testkit.probe").await;
    let channel = conn.create_channel().await.unwrap();
    let exists = channel
        .exchange_declare(
            name.into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                passive: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .is_ok();
    let _ = conn.close(200, "probed".into()).await;
    exists
}

/// What a panicking test made.
#[derive(Debug, Default, Clone)]
struct Made {
    schema: String,
    database: String,
    queues: Vec<String>,
    exchanges: Vec<String>,
}

/// Runs `test` on a thread of its own with a runtime of the given flavour,
/// as `#[tokio::test]` does; returns what it made, after it panicked.
fn panicking_test(
    multi_thread: bool,
    test: impl AsyncFnOnce(std::sync::Arc<std::sync::Mutex<Made>>) + Send + 'static,
) -> Made {
    let made = std::sync::Arc::new(std::sync::Mutex::new(Made::default()));
    let seen = std::sync::Arc::clone(&made);
    let outcome = std::thread::spawn(move || {
        let runtime = if multi_thread {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
        } else {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        }
        .unwrap();
        runtime.block_on(test(seen));
    })
    .join();
    assert!(outcome.is_err(), "the test panicked");
    made.lock().unwrap().clone()
}

/// The body of the panicking test: a schema with a table, a session that
/// holds a lock on it in an open transaction (as a relay's claim does), a
/// database, a broker guard with an exchange, a queue bound to it, a queue
/// declared elsewhere and adopted; then a panic with all of them alive.
async fn make_everything_then_panic(made: std::sync::Arc<std::sync::Mutex<Made>>) {
    let schema = TestSchema::new("t_kit", "panics").await;
    schema.run("CREATE TABLE {schema}.claims (id int)").await;
    schema.run("INSERT INTO {schema}.claims VALUES (1)").await;
    let database = TestDatabase::create(&database_url(), unique("t_kit_db", "panics")).await;
    let broker = TestBroker::new(unique("test_kit", "panics")).await;
    let exchange = broker.topic_exchange(&broker.named("x")).await;
    let queue = broker.queue(&broker.named("q")).await;
    broker.bind(&queue, &exchange, "#").await;
    // Declared with another channel (as a QueueTopology would), adopted.
    let adopted = broker.named("adopted");
    broker
        .connection()
        .create_channel()
        .await
        .unwrap()
        .queue_declare(
            adopted.as_str().into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    broker.delete_queue_on_drop(&adopted);
    *made.lock().unwrap() = Made {
        schema: schema.name().to_owned(),
        database: database.name().to_owned(),
        queues: vec![queue.clone(), adopted.clone()],
        exchanges: vec![exchange.clone()],
    };
    // A session of the test holding a row lock, its transaction open: its
    // task cannot end it while the guard's drop blocks the runtime.
    let mut holder = pg::connect(&database_url()).await;
    holder
        .batch_execute(&schema.sql("BEGIN; SELECT * FROM {schema}.claims FOR UPDATE"))
        .await
        .unwrap();
    let (locked, lock_held) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _ = locked.send(());
        // Holds the connection (and its lock) until the runtime drops it.
        std::future::pending::<()>().await;
        drop(holder);
    });
    lock_held.await.unwrap();
    assert!(schema_exists(schema.name()).await);
    assert!(queue_exists(&queue).await && queue_exists(&adopted).await);
    assert!(exchange_exists(&exchange).await);
    panic!("the test fails with everything still in use");
}

async fn assert_all_gone(made: &Made) {
    assert!(!made.schema.is_empty(), "the test made its schema");
    assert!(
        !schema_exists(&made.schema).await,
        "schema {} left behind",
        made.schema
    );
    assert!(
        !database_exists(&made.database).await,
        "database {} left behind",
        made.database
    );
    for queue in &made.queues {
        assert!(!queue_exists(queue).await, "queue {queue} left behind");
    }
    for exchange in &made.exchanges {
        assert!(
            !exchange_exists(exchange).await,
            "exchange {exchange} left behind"
        );
    }
}

#[tokio::test]
async fn a_panicking_test_on_a_current_thread_runtime_leaves_nothing_behind() {
    let made = tokio::task::spawn_blocking(|| panicking_test(false, make_everything_then_panic))
        .await
        .unwrap();
    assert_all_gone(&made).await;
}

#[tokio::test]
async fn a_panicking_test_on_a_multi_thread_runtime_leaves_nothing_behind() {
    let made = tokio::task::spawn_blocking(|| panicking_test(true, make_everything_then_panic))
        .await
        .unwrap();
    assert_all_gone(&made).await;
}

#[test]
fn guards_dropped_outside_any_runtime_clean_up() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (schema, broker, queue) = runtime.block_on(async {
        let schema = TestSchema::new("t_kit", "no_runtime").await;
        let broker = TestBroker::new(unique("test_kit", "no_runtime")).await;
        let queue = broker.queue(&broker.named("q")).await;
        (schema, broker, queue)
    });
    let name = schema.name().to_owned();
    drop(runtime);
    // No runtime here at all.
    drop(schema);
    drop(broker);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        assert!(!schema_exists(&name).await, "schema {name} left behind");
        assert!(!queue_exists(&queue).await, "queue {queue} left behind");
    });
}

#[tokio::test]
async fn a_reserved_schema_created_by_the_test_is_dropped_too() {
    let name = {
        let schema = TestSchema::reserve(&database_url(), unique("t_kit", "reserved"));
        assert!(
            !schema_exists(schema.name()).await,
            "reserve creates nothing"
        );
        schema.run("CREATE SCHEMA {schema}").await;
        assert!(schema_exists(schema.name()).await);
        schema.name().to_owned()
    };
    assert!(!schema_exists(&name).await, "schema {name} left behind");
}

#[tokio::test]
async fn the_schema_guard_counts_and_publishes_through_the_broker_guard() {
    let schema = TestSchema::new("t_kit", "helpers").await;
    schema
        .run("CREATE TABLE {schema}.t (n int); INSERT INTO {schema}.t VALUES (1), (2)")
        .await;
    assert_eq!(
        schema.count("SELECT count(*) AS n FROM {schema}.t").await,
        2
    );
    let broker = TestBroker::new(unique("test_kit", "helpers")).await;
    let exchange = broker.topic_exchange(&broker.named("x")).await;
    let queue = broker.queue(&broker.named("q")).await;
    broker.bind(&queue, &exchange, "a.*").await;
    for body in [b"one".as_slice(), b"two"] {
        assert_eq!(
            broker
                .publish(&exchange, "a.b", body, Default::default())
                .await,
            lapin::Confirmation::Ack(None)
        );
    }
    // Unroutable: returned with the ack.
    assert!(matches!(
        broker
            .publish(&exchange, "z", b"lost", Default::default())
            .await,
        lapin::Confirmation::Ack(Some(_))
    ));
    assert_eq!(broker.ready(&queue).await, 2);
    let peeked: Vec<Vec<u8>> = broker
        .peek(&queue)
        .await
        .into_iter()
        .map(|m| m.delivery.data)
        .collect();
    assert_eq!(peeked, [b"one".to_vec(), b"two".to_vec()]);
    assert_eq!(broker.ready(&queue).await, 2, "peek leaves them there");
    let drained: Vec<Vec<u8>> = broker
        .drain(&queue)
        .await
        .into_iter()
        .map(|m| m.delivery.data)
        .collect();
    assert_eq!(drained, [b"one".to_vec(), b"two".to_vec()]);
    assert_eq!(broker.ready(&queue).await, 0);
}

#[tokio::test]
async fn connections_are_found_and_closed_by_name() {
    let name = unique("test_kit", "close");
    let conn = amqp::connect(&amqp_url(), &name).await;
    let found = outbox_testkit::eventually::eventually("the connection is listed")
        .some(|| {
            let name = name.clone();
            async move {
                tokio::task::spawn_blocking(move || amqp::connection_pid(&name))
                    .await
                    .unwrap()
            }
        })
        .await;
    assert!(found.starts_with('<'), "an Erlang pid: {found}");
    let closed = tokio::task::spawn_blocking({
        let name = name.clone();
        move || amqp::close_connection(&name)
    })
    .await
    .unwrap();
    assert_eq!(closed, 1);
    outbox_testkit::eventually::eventually("the client sees the close")
        .until(|| std::future::ready(!conn.status().connected()))
        .await;
}

/// Whether MariaDB database `name` exists.
async fn mysql_database_exists(name: &str) -> bool {
    let mut conn = mysql::connect(&mysql_url()).await;
    mysql::count(
        &mut conn,
        &format!(
            "SELECT COUNT(*) AS n FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = '{name}'"
        ),
    )
    .await
        == 1
}

/// The MariaDB guard drops its database when the test ends, even while a
/// session of the test sits in a transaction holding a lock on one of its
/// tables (which would make a plain `DROP DATABASE` wait for a year).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_database_is_dropped_with_its_guard_even_while_a_session_holds_a_lock() {
    let name = unique("t_kit_my", "guard");
    let database = TestMysqlDatabase::create(&mysql_url(), name.clone()).await;
    assert!(mysql_database_exists(&name).await);
    let mut conn = mysql::connect(database.url()).await;
    conn.batch_execute("CREATE TABLE claims (id INT PRIMARY KEY)")
        .await
        .unwrap();
    conn.batch_execute("INSERT INTO claims VALUES (1)")
        .await
        .unwrap();
    conn.batch_execute("BEGIN").await.unwrap();
    conn.batch_execute("SELECT id FROM claims FOR UPDATE")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    drop(database);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(4),
        "the drop waited for the locking session: {:?}",
        started.elapsed()
    );
    assert!(!mysql_database_exists(&name).await, "{name} left behind");
    // The killed session is gone: its next statement fails.
    assert!(conn.batch_execute("SELECT 1").await.is_err());
}

/// A panicking test leaves no MariaDB database behind.
#[test]
fn a_panicking_test_leaves_no_mysql_database_behind() {
    let name = unique("t_kit_my", "panics");
    let made = name.clone();
    let outcome = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                let _database = TestMysqlDatabase::create(&mysql_url(), made).await;
                panic!("the test fails with its database open");
            });
    })
    .join();
    assert!(outcome.is_err(), "the test panicked");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert!(
        !runtime.block_on(mysql_database_exists(&name)),
        "{name} left behind"
    );
}
