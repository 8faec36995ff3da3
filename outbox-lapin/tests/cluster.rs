//! Several broker URLs and quorum queues, against the shared RabbitMQ (a
//! single node runs quorum queues too): a URL list whose first node is
//! down still publishes and consumes, a list of dead nodes fails naming
//! each, a quorum `QueueTopology` declares quorum queues (the broker counts
//! redeliveries), and changing an existing queue's type is refused at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::{BasicGetOptions, BasicNackOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use outbox_core::testing::{InMemoryInbox, InboxTx};
use outbox_core::{PublishOutcome, Publisher};
use outbox_lapin::{
    AmqpUrls, Error, InboxConsumer, IncomingEvent, LapinPublisher, QueueTopology, QueueType,
    handler_fn,
};
use outbox_testkit::amqp::TestBroker;
use outbox_testkit::eventually::eventually;
use outbox_testkit::names;
use outbox_testkit::net::free_port;

use common::{Running, WAIT, amqp_url, placed};

/// A URL where nothing listens (a node that is down: refused at once).
fn dead_url() -> String {
    format!("amqp://guest:s3cret@127.0.0.1:{}/%2f", free_port())
}

/// This test's exchange and a quorum queue bound to it with `#` (with its
/// quorum dead-letter queue and a delivery limit), deleted on drop.
async fn quorum_broker(test: &str) -> (TestBroker, String, QueueTopology) {
    let kit = TestBroker::new(names::unique("test_cluster", test)).await;
    let exchange = kit.named("x");
    let topology = QueueTopology::new(kit.named("q"))
        .exchange(&exchange)
        .bind("#")
        .queue_type(QueueType::Quorum)
        .delivery_limit(20);
    kit.delete_queue_on_drop(topology.queue_name());
    kit.delete_queue_on_drop(topology.dead_letter_queue_name().unwrap());
    kit.delete_exchange_on_drop(&exchange);
    kit.delete_exchange_on_drop(topology.dead_letter_exchange_name().unwrap());
    topology.declare(kit.channel()).await.unwrap();
    (kit, exchange, topology)
}

#[tokio::test]
async fn a_url_list_whose_first_node_is_down_publishes_and_consumes_through_a_quorum_queue() {
    let (kit, exchange, topology) = quorum_broker("first_node_down").await;
    let urls = format!("{}, {}", dead_url(), amqp_url());

    let publisher = LapinPublisher::builder(urls.as_str())
        .exchange(&exchange)
        .source("/tests")
        .connection_name(kit.named("relay"))
        .build()
        .unwrap();
    let events: Vec<_> = (1..=5).map(|n| placed("o-1", n)).collect();
    let outcomes = publisher
        .publish(&events.iter().collect::<Vec<_>>(), None)
        .await;
    assert!(
        outcomes.iter().all(|o| matches!(o, PublishOutcome::Acked)),
        "published through the second URL: {outcomes:?}"
    );

    let seen: Arc<Mutex<Vec<uuid::Uuid>>> = Arc::default();
    let sink = Arc::clone(&seen);
    let handler = handler_fn(move |_tx: &mut InboxTx, event: &IncomingEvent| {
        sink.lock().unwrap().push(event.id);
        Box::pin(async { Ok(()) })
    });
    let consumer = InboxConsumer::builder(
        AmqpUrls::from(vec![dead_url(), amqp_url()]),
        topology.queue_name(),
        kit.named("consumer"),
        InMemoryInbox::new(),
        handler,
    )
    .declare(topology.clone())
    .build()
    .unwrap();
    let running = Running::start(consumer);
    eventually("the five events consumed")
        .within(WAIT)
        .until(|| async { seen.lock().unwrap().len() >= 5 })
        .await;
    running.stop().await;
    assert_eq!(
        *seen.lock().unwrap(),
        events.iter().map(|e| e.id).collect::<Vec<_>>(),
        "each once, in order"
    );
    assert_eq!(kit.ready(topology.queue_name()).await, 0, "all acked");
}

#[tokio::test]
async fn when_every_node_is_down_the_error_names_each_url_without_its_password() {
    let (first, second) = (dead_url(), dead_url());
    let publisher = LapinPublisher::builder([first.as_str(), second.as_str()])
        .build()
        .unwrap();
    let err = publisher.connect().await.unwrap_err();
    let Error::Unreachable { failures } = &err else {
        panic!("expected Unreachable, got {err:?}");
    };
    assert_eq!(failures.len(), 2, "{err}");
    let text = err.to_string();
    for url in [&first, &second] {
        let redacted = url.replace("s3cret", "***");
        assert!(text.contains(&redacted), "{text} names {redacted}");
    }
    assert!(!text.contains("s3cret"), "{text}");

    let empty = LapinPublisher::builder(" , ").build().unwrap_err();
    assert!(matches!(empty, Error::NoUrls), "{empty:?}");
}

#[tokio::test]
async fn a_quorum_queue_counts_redeliveries() {
    let (kit, _exchange, topology) = quorum_broker("counts_redeliveries").await;
    let queue = topology.queue_name();
    let envelope = placed("o-1", 1);
    kit.publish(
        "",
        queue,
        envelope.payload.as_bytes(),
        outbox_lapin::wire::properties(&envelope, "/tests"),
    )
    .await;
    let channel = kit.connection().create_channel().await.unwrap();
    let get = || async {
        let mut got = None;
        for _ in 0..100 {
            got = channel
                .basic_get(queue.into(), BasicGetOptions { no_ack: false })
                .await
                .unwrap();
            if got.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        got.expect("the message is in the queue")
    };
    let first = get().await;
    first
        .delivery
        .acker
        .nack(BasicNackOptions {
            requeue: true,
            ..BasicNackOptions::default()
        })
        .await
        .unwrap();
    let second = get().await;
    let count = second
        .delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get("x-delivery-count").cloned());
    assert!(
        matches!(
            count,
            Some(AMQPValue::LongLongInt(1) | AMQPValue::LongInt(1) | AMQPValue::ShortInt(1))
        ),
        "a quorum queue sets x-delivery-count on redeliveries: {count:?}"
    );
    let _ = channel.close(200, "done".into()).await;
}

#[tokio::test]
async fn redeclaring_a_classic_queue_as_quorum_fails_at_once_with_precondition_failed() {
    let kit = TestBroker::new(names::unique("test_cluster", "redeclare")).await;
    let topology = QueueTopology::new(kit.named("q")).without_dead_letter();
    kit.delete_queue_on_drop(topology.queue_name());
    topology.declare(kit.channel()).await.unwrap();

    let channel = kit.connection().create_channel().await.unwrap();
    let quorum = topology.clone().queue_type(QueueType::Quorum);
    let err = tokio::time::timeout(Duration::from_secs(10), quorum.declare(&channel))
        .await
        .expect("answered, not hung")
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, Error::Amqp { .. })
            && text.contains("PRECONDITION_FAILED")
            && text.contains(topology.queue_name()),
        "{text}"
    );

    // The queue is still classic: declaring it as classic again works.
    let channel = kit.connection().create_channel().await.unwrap();
    channel
        .queue_declare(
            topology.queue_name().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
}
