//! The relay end to end: PostgreSQL outbox → relay → RabbitMQ, through the
//! facade, against the real servers. Each test owns a PostgreSQL schema and
//! an exchange/queue pair.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use outbox_testkit::eventually::eventually;
use outbox_testkit::pg;
use outbox_testkit::urls::{amqp_url, database_url};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::{Connection as _, PgConnection, RunQueryDsl as _};
use diesel_async::AsyncConnection as _;
use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions};
use lapin::types::FieldTable;
use outbox::rabbitmq::LapinPublisher;
use outbox::{DomainEvent, RetryPolicy};
use outbox_tests::Pipeline;
use serde::Serialize;
use uuid::Uuid;

#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
struct OrderPlaced {
    #[aggregate_id]
    order: String,
    n: u32,
}

/// A schema, an exchange and a queue bound to it with `order.*`, relays
/// with batches of 100 that pause 50–500 ms; all removed on drop (also
/// when the test panics).
struct Env(Pipeline);

impl std::ops::Deref for Env {
    type Target = Pipeline;

    fn deref(&self) -> &Pipeline {
        &self.0
    }
}

impl Env {
    async fn new(test: &str) -> Env {
        Env(Pipeline::new("relay", test, "order.*")
            .await
            .pause(Duration::from_millis(50), Duration::from_millis(500)))
    }

    async fn record(&self, events: &[(String, u32)]) -> Vec<Uuid> {
        let mut conn = outbox::postgres::connect(&database_url()).await.unwrap();
        let mut ids = Vec::new();
        for chunk in events.chunks(1000) {
            let batch: Vec<OrderPlaced> = chunk
                .iter()
                .map(|(order, n)| OrderPlaced {
                    order: order.clone(),
                    n: *n,
                })
                .collect();
            let chunk_ids = conn
                .transaction::<_, outbox::postgres::Error, _>(async |conn| {
                    self.outbox.record_all(conn, &batch).await
                })
                .await
                .unwrap();
            ids.extend(chunk_ids);
        }
        ids
    }

    /// Collects every message id arriving on the queue, in arrival order.
    async fn collect(&self) -> Arc<Mutex<Vec<Uuid>>> {
        let received: Arc<Mutex<Vec<Uuid>>> = Arc::default();
        let mut consumer = self
            .channel
            .basic_consume(
                self.queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        let sink = Arc::clone(&received);
        tokio::spawn(async move {
            while let Some(Ok(delivery)) = consumer.next().await {
                let id = delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .and_then(|id| Uuid::parse_str(id.as_str()).ok())
                    .expect("every message has a UUID message_id");
                sink.lock().unwrap().push(id);
                let _ = delivery.ack(BasicAckOptions::default()).await;
            }
        });
        received
    }

    fn sql_count(&self, filter: &str) -> i64 {
        pg::count_sync(
            &mut PgConnection::establish(&database_url()).unwrap(),
            &format!(
                "SELECT count(*) AS n FROM \"{}\".outbox_events {filter}",
                self.schema
            ),
        )
    }

    fn row(&self, id: Uuid) -> (String, i32, Option<String>) {
        #[derive(diesel::QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Text)]
            status: String,
            #[diesel(sql_type = diesel::sql_types::Integer)]
            attempts: i32,
            #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
            last_error: Option<String>,
        }
        let mut conn = PgConnection::establish(&database_url()).unwrap();
        let row: Row = diesel::sql_query(format!(
            "SELECT status, attempts, last_error FROM \"{}\".outbox_events WHERE id = '{id}'",
            self.schema
        ))
        .get_result(&mut conn)
        .unwrap();
        (row.status, row.attempts, row.last_error)
    }
}

async fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    eventually(what)
        .within(limit)
        .until(|| std::future::ready(done()))
        .await;
}

fn interleaved(aggregates: usize, per: usize) -> Vec<(String, u32)> {
    (0..per)
        .flat_map(|n| (0..aggregates).map(move |a| (format!("o-{a}"), n as u32)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_events_are_relayed_and_each_received() {
    let env = Env::new("ten_k").await;
    let ids = env.record(&interleaved(1000, 10)).await;
    let received = env.collect().await;
    let (handle, task) = env.start(env.publisher().build().unwrap(), RetryPolicy::default());
    wait_until("10,000 events received", Duration::from_secs(240), || {
        received.lock().unwrap().len() >= 10_000
    })
    .await;
    wait_until("all marked sent", Duration::from_secs(30), || {
        env.sql_count("WHERE status = 'sent'") == 10_000
    })
    .await;
    handle.shutdown();
    task.await.unwrap();
    let received = received.lock().unwrap().clone();
    let unique: HashSet<Uuid> = received.iter().copied().collect();
    assert_eq!(
        unique,
        ids.iter().copied().collect::<HashSet<_>>(),
        "every event received"
    );
    assert_eq!(received.len(), 10_000, "no duplicates without faults");
    // Per-aggregate order on the wire.
    let position: HashMap<Uuid, usize> = received
        .iter()
        .enumerate()
        .map(|(i, id)| (*id, i))
        .collect();
    let events = interleaved(1000, 10);
    let mut by_aggregate: HashMap<&str, Vec<usize>> = HashMap::new();
    for ((aggregate, _), id) in events.iter().zip(&ids) {
        by_aggregate
            .entry(aggregate)
            .or_default()
            .push(position[id]);
    }
    for (aggregate, positions) in by_aggregate {
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "order broken for {aggregate}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unroutable_event_spends_its_attempts_and_ends_dead_when_told_to() {
    let env = Env::new("unroutable").await;
    // Routing key `refund.issued` matches no binding (the queue binds `order.*`).
    let ids = env.record(&[("o-1".into(), 1)]).await;
    let publisher = env
        .publisher()
        .routing_key(|_| "refund.issued".into())
        .build()
        .unwrap();
    let retry = Pipeline::quick_retries(3);
    let received = env.collect().await;
    let (handle, task) = env.start_with(publisher, retry, outbox::UnroutablePolicy::SpendAttempts);
    wait_until("the event is dead", Duration::from_secs(30), || {
        env.row(ids[0]).0 == "dead"
    })
    .await;
    handle.shutdown();
    task.await.unwrap();
    let (status, attempts, last_error) = env.row(ids[0]);
    assert_eq!(status, "dead");
    assert_eq!(attempts, 3);
    let last_error = last_error.unwrap();
    assert!(last_error.contains("NO_ROUTE"), "{last_error}");
    assert!(received.lock().unwrap().is_empty());
}

/// A missing binding is a configuration fault, not a bad message: by
/// default the relay holds unroutable events (no attempt spent, visible in
/// the store-wide stats), the rest flow, and once the binding appears the
/// held events are delivered in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_events_are_held_without_attempts_until_their_binding_appears() {
    let env = Env::new("unroutable_hold").await;
    // o-1's events go to `refund.issued`, which nothing binds yet.
    let publisher = env
        .publisher()
        .routing_key(|e| {
            if e.aggregate_id == "o-1" {
                "refund.issued".into()
            } else {
                e.event_type.clone()
            }
        })
        .build()
        .unwrap();
    let ids = env
        .record(&[("o-1".into(), 1), ("o-1".into(), 2), ("o-2".into(), 1)])
        .await;
    let received = env.collect().await;
    let (handle, task) = env.start_with(
        publisher,
        Pipeline::quick_retries(2),
        outbox::UnroutablePolicy::hold(Duration::from_secs(600), Duration::from_secs(1)),
    );
    wait_until("o-2 delivered", Duration::from_secs(30), || {
        received.lock().unwrap().contains(&ids[2])
    })
    .await;
    // Several tries (one a second at most) spend nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (status, attempts, last_error) = env.row(ids[0]);
    assert_eq!(
        (status.as_str(), attempts),
        ("retry", 0),
        "held, no attempt spent"
    );
    assert!(last_error.unwrap().contains("NO_ROUTE"));
    assert_eq!(
        env.row(ids[1]).0,
        "held",
        "o-1's next event waits behind it"
    );
    let stats = outbox::OutboxStore::stats(&env.store()).await.unwrap();
    assert_eq!(stats.unroutable, 1, "the store-wide unroutable count");
    assert!(!received.lock().unwrap().contains(&ids[0]));

    env.broker.bind(&env.queue, &env.exchange, "refund.*").await;
    wait_until("o-1's events delivered", Duration::from_secs(30), || {
        let got = received.lock().unwrap();
        got.contains(&ids[0]) && got.contains(&ids[1])
    })
    .await;
    handle.shutdown();
    task.await.unwrap();
    let got = received.lock().unwrap().clone();
    let first = |id| got.iter().position(|g| *g == id).unwrap();
    assert!(first(ids[0]) < first(ids[1]), "in order");
    assert_eq!(
        env.row(ids[0]).1,
        0,
        "delivered without spending an attempt"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_exchange_costs_attempts_only_for_its_events() {
    let env = Env::new("missing_x").await;
    let ids = env.record(&interleaved(20, 3)).await;
    let ghost = format!("{}.ghost", env.exchange);
    let publisher = env
        .publisher()
        .exchange_for(move |e| (e.aggregate_id == "o-7").then(|| ghost.clone()))
        .build()
        .unwrap();
    let retry = Pipeline::quick_retries(2);
    let received = env.collect().await;
    let (handle, task) = env.start(publisher, retry);
    wait_until("57 events received", Duration::from_secs(60), || {
        received.lock().unwrap().len() >= 57
    })
    .await;
    wait_until("o-7's head is dead", Duration::from_secs(30), || {
        env.sql_count("WHERE status = 'dead'") == 1
    })
    .await;
    handle.shutdown();
    task.await.unwrap();
    let events = interleaved(20, 3);
    for ((aggregate, n), id) in events.iter().zip(&ids) {
        let (status, attempts, last_error) = env.row(*id);
        match (aggregate.as_str(), n) {
            ("o-7", 0) => {
                assert_eq!((status.as_str(), attempts), ("dead", 2));
                assert!(last_error.unwrap().contains("404"));
            }
            ("o-7", _) => assert_eq!((status.as_str(), attempts), ("held", 0), "held back"),
            _ => assert_eq!((status.as_str(), attempts), ("sent", 0), "{aggregate} {n}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_connection_closes_lose_nothing_and_mark_nothing_unconfirmed() {
    let env = Arc::new(Env::new("conn_close").await);
    let received = env.collect().await;
    let (handle, task) = env.start(env.publisher().build().unwrap(), RetryPolicy::default());
    // Producers keep committing while the relay's connection is closed
    // under it, three times.
    let faulting = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let producer = {
        let env = Arc::clone(&env);
        let faulting = Arc::clone(&faulting);
        tokio::spawn(async move {
            let mut ids = Vec::new();
            let mut round = 0u32;
            while faulting.load(Ordering::Relaxed) {
                let events: Vec<(String, u32)> =
                    (0..50).map(|a| (format!("o-{a}"), round)).collect();
                ids.extend(env.record(&events).await);
                round += 1;
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            ids
        })
    };
    let relay_name = format!("{}.relay", env.name);
    let mut faults = 0;
    let started = Instant::now();
    while faults < 3 && started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let name = relay_name.clone();
        faults +=
            tokio::task::spawn_blocking(move || outbox_testkit::amqp::close_connections(&name))
                .await
                .unwrap();
    }
    faulting.store(false, Ordering::Relaxed);
    let ids = producer.await.unwrap();
    assert_eq!(faults, 3, "faults were injected");
    let total = ids.len() as i64;
    wait_until("every event sent", Duration::from_secs(120), || {
        env.sql_count("WHERE status = 'sent'") == total
    })
    .await;
    handle.shutdown();
    task.await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await; // let the last deliveries land
    let received = received.lock().unwrap().clone();
    let unique: HashSet<Uuid> = received.iter().copied().collect();
    // Marked sent ⇒ confirmed ⇒ routed to the queue: nothing marked without it.
    for id in &ids {
        assert!(
            unique.contains(id),
            "event {id} is marked sent but never arrived"
        );
    }
    assert_eq!(unique.len(), ids.len());
    assert_eq!(
        env.sql_count("WHERE attempts > 0"),
        0,
        "connection loss spends no attempts"
    );
    assert_eq!(
        env.sql_count("WHERE suspect_count > 0 OR status = 'dead'"),
        0,
        "a connection the broker closes (320 CONNECTION_FORCED) makes nothing suspect"
    );
    println!(
        "forced closes: {faults}, events: {}, received: {}, duplicates: {}",
        ids.len(),
        received.len(),
        received.len() - unique.len()
    );
}

/// An event whose note may carry the marker that makes the test proxy cut
/// the connection it is sent on.
#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
struct OrderNoted {
    #[aggregate_id]
    order: String,
    note: String,
}

const KILL_MARKER: &str = "KILL-THE-CONNECTION";

impl Env {
    /// Healthy events of 30 aggregates (5 each, interleaved), then one
    /// poison event (its body carries the proxy's marker) of order `p` with
    /// two later events of that order, then 30 more healthy events.
    /// Returns (healthy ids, poison id, its followers).
    async fn record_poisoned(&self) -> (Vec<Uuid>, Uuid, Vec<Uuid>) {
        let mut healthy = self.record(&interleaved(30, 5)).await;
        let mut conn = outbox::postgres::connect(&database_url()).await.unwrap();
        let poison = conn
            .transaction::<_, outbox::postgres::Error, _>(async |conn| {
                let note = OrderNoted {
                    order: "p".into(),
                    note: format!("a message some proxy drops the connection on: {KILL_MARKER}"),
                };
                self.outbox.record(conn, &note).await
            })
            .await
            .unwrap();
        let followers = self.record(&[("p".into(), 1), ("p".into(), 2)]).await;
        healthy.extend(
            self.record(&(0..30).map(|a| (format!("o-{a}"), 5)).collect::<Vec<_>>())
                .await,
        );
        (healthy, poison, followers)
    }

    fn suspect_count(&self, id: Uuid) -> i64 {
        #[derive(diesel::QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Integer)]
            suspect_count: i32,
        }
        let mut conn = PgConnection::establish(&database_url()).unwrap();
        let row: Row = diesel::sql_query(format!(
            "SELECT suspect_count FROM \"{}\".outbox_events WHERE id = '{id}'",
            self.schema
        ))
        .get_result(&mut conn)
        .unwrap();
        i64::from(row.suspect_count)
    }

    /// A publisher that reaches the broker through `url` (the proxy).
    fn publisher_via(&self, url: &str, relay: &str) -> LapinPublisher {
        LapinPublisher::builder(url)
            .exchange(&self.exchange)
            .source("/tests")
            .connection_name(format!("{}.{relay}", self.name))
            .build()
            .unwrap()
    }
}

/// A message after which the connection dies (a proxy cuts it, not a
/// broker reply code) is isolated: published alone, counted in its row,
/// and parked `dead` with the reason at the suspect limit; everything else
/// flows, its aggregate's later events are held, and the connection is
/// killed a bounded number of times, with one relay or two at once.
/// Returns a summary line.
async fn poison_through_proxy(test: &str, relays: usize) -> String {
    const LIMIT: i64 = 3;
    let env = Env::new(test).await;
    let received = env.collect().await;
    let (proxy, url) = outbox_tests::KillingProxy::amqp(&amqp_url(), KILL_MARKER.as_bytes()).await;
    let (healthy, poison, followers) = env.record_poisoned().await;
    let running: Vec<_> = (0..relays)
        .map(|r| {
            env.start(
                env.publisher_via(&url, &format!("relay{r}")),
                RetryPolicy::default(),
            )
        })
        .collect();
    let total = healthy.len() as i64;
    wait_until(
        "every healthy event sent and the poison dead",
        Duration::from_secs(120),
        || {
            env.sql_count("WHERE status = 'sent'") == total
                && env.sql_count(&format!("WHERE id = '{poison}' AND status = 'dead'")) == 1
        },
    )
    .await;
    // Nothing else happens to it or its followers afterwards.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (handle, task) in running {
        handle.shutdown();
        task.await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // let the last deliveries land

    let (status, attempts, last_error) = env.row(poison);
    assert_eq!(status, "dead");
    assert_eq!(attempts, 0, "a connection's death never spends an attempt");
    let reason = last_error.unwrap();
    assert!(
        reason.contains("died 3 times") && reason.contains("alone") && reason.contains("replay"),
        "the reason says what happened and what to do: {reason}"
    );
    assert_eq!(env.suspect_count(poison), LIMIT);
    for id in &followers {
        assert_eq!(env.row(*id).0, "held", "the poison's later events wait");
    }
    assert!(
        proxy.kills() as i64 <= LIMIT + 2,
        "the poison killed {} connections (limit {LIMIT})",
        proxy.kills()
    );
    assert!(proxy.kills() >= 1, "the proxy did cut connections");
    let received: HashSet<Uuid> = received.lock().unwrap().iter().copied().collect();
    for id in &healthy {
        assert!(
            received.contains(id),
            "healthy event {id} was not delivered"
        );
    }
    assert!(!received.contains(&poison));
    for id in &followers {
        assert!(
            !received.contains(id),
            "a later event of the poison's order went out"
        );
    }
    assert_eq!(
        env.sql_count("WHERE attempts > 0"),
        0,
        "no attempt spent anywhere"
    );
    let summary = format!(
        "{relays} relay(s): proxy kills {}, connections {}, bystander suspects {}",
        proxy.kills(),
        proxy.connections(),
        env.sql_count(&format!("WHERE suspect_count > 0 AND id <> '{poison}'"))
    );
    summary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_kills_the_connection_ends_dead_and_the_rest_flows() {
    println!("{}", poison_through_proxy("poison_one", 1).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_isolate_a_connection_killing_message_together() {
    println!("{}", poison_through_proxy("poison_two", 2).await);
}
