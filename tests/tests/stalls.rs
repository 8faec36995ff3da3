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

use lapin::options::{BasicGetOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use outbox::rabbitmq::LapinPublisher;
use outbox::{DomainEvent, EventEnvelope, PublishOutcome, Publisher};
use outbox_tests::{PrivateRabbit, connect_amqp};
use uuid::Uuid;

fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

async fn private_rabbit() -> Arc<PrivateRabbit> {
    Arc::new(
        tokio::task::spawn_blocking(PrivateRabbit::start)
            .await
            .unwrap(),
    )
}

/// The node stopped with SIGSTOP (its sockets stay open, nothing answers,
/// not even heartbeats); continued on drop, also when the test fails.
struct Frozen {
    pid: String,
}

impl Frozen {
    fn new(rabbit: &PrivateRabbit) -> Frozen {
        let pid = rabbit
            .ctl(&["eval", "os:getpid()."])
            .trim()
            .trim_matches('"')
            .to_owned();
        assert!(
            pid.chars().all(|c| c.is_ascii_digit()) && !pid.is_empty(),
            "the node's OS pid: {pid:?}"
        );
        signal(&pid, "-STOP");
        Frozen { pid }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(&self.pid, "-CONT");
    }
}

fn signal(pid: &str, which: &str) {
    let status = std::process::Command::new("kill")
        .args([which, pid])
        .status()
        .unwrap();
    assert!(status.success(), "kill {which} {pid}");
}

/// The exchange (declared by the publisher) and a queue bound to it for
/// `binding`, on the private node.
struct Topology {
    _conn: Connection,
    channel: Channel,
    exchange: String,
    queue: String,
}

impl Topology {
    async fn new(rabbit: &PrivateRabbit, test: &str, binding: &str) -> Topology {
        let conn = connect_amqp(&rabbit.url(), &format!("{test}.setup")).await;
        let channel = conn.create_channel().await.unwrap();
        let exchange = format!("{test}.x");
        let queue = format!("{test}.q");
        channel
            .exchange_declare(
                exchange.as_str().into(),
                lapin::ExchangeKind::Topic,
                lapin::options::ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                binding.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        Topology {
            _conn: conn,
            channel,
            exchange,
            queue,
        }
    }

    /// The ids of every message in the queue (taken).
    async fn delivered(&self) -> HashSet<Uuid> {
        let mut ids = HashSet::new();
        while let Some(message) = self
            .channel
            .basic_get(self.queue.as_str().into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
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
    assert_eq!(publisher.publish(&[&warm]).await, [PublishOutcome::Acked]);

    let frozen = Frozen::new(&rabbit);
    // Several batches at once, as the relay's loops do: one takes the idle
    // channel, the others need new channels (channel.open is never
    // answered); a large one fills the socket buffers, so basic_publish
    // itself blocks.
    let small: Vec<EventEnvelope> = (1..4).map(|n| envelope(n, 10)).collect();
    let large: Vec<EventEnvelope> = (10..410).map(|n| envelope(n, 64 * 1024)).collect();
    let publishing = async {
        let smalls = futures_util::future::join_all(small.iter().map(|e| {
            let publisher = publisher.clone();
            async move { publisher.publish(&[e]).await }
        }));
        let large_refs: Vec<&EventEnvelope> = large.iter().collect();
        tokio::join!(smalls, publisher.publish(&large_refs))
    };
    // The node stays frozen for 30 s; every call must be back well before.
    let (smalls, large_outcomes) = tokio::time::timeout(Duration::from_secs(20), publishing)
        .await
        .expect("publishes to a frozen broker return within their timeouts, not after the thaw");
    let outcomes: Vec<&PublishOutcome> = smalls.iter().flatten().chain(&large_outcomes).collect();
    assert!(
        outcomes.iter().all(|o| **o != PublishOutcome::Acked),
        "nothing is confirmed by a frozen broker"
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    drop(frozen);

    // Once it answers again, publishing works again (after the connection
    // the publisher dropped is replaced).
    let after = envelope(1000, 10);
    let mut acked = false;
    for _ in 0..60 {
        if publisher.publish(&[&after]).await == [PublishOutcome::Acked] {
            acked = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(acked, "the publisher recovers after the thaw");
    assert!(topology.delivered().await.contains(&after.id));
}
