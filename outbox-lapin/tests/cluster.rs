//! Several broker URLs and quorum queues, against the shared RabbitMQ (a
//! single node runs quorum queues too): a URL list whose first node is
//! down still publishes and consumes, a list of dead nodes fails naming
//! each, a quorum `QueueTopology` declares quorum queues (the broker counts
//! redeliveries, and dead-letters past the delivery limit), retries, dead
//! letters and a replay work on them, and changing an existing queue's type
//! is refused at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::{BasicGetOptions, BasicNackOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use outbox_core::testing::{InMemoryInbox, InboxTx};
use outbox_core::{PublishOutcome, Publisher};
use outbox_lapin::{
    AmqpUrls, DeadLetterQueue, Error, HandlerError, InboxConsumer, IncomingEvent, LapinPublisher,
    QueueTopology, QueueType, handler_fn,
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
    kit.delete_exchange_on_drop(&exchange);
    declare_deleted_on_drop(&kit, &topology).await;
    (kit, exchange, topology)
}

/// Declares `topology`, its queue, dead-letter queue and dead-letter
/// exchange deleted when `kit` drops.
async fn declare_deleted_on_drop(kit: &TestBroker, topology: &QueueTopology) {
    kit.delete_queue_on_drop(topology.queue_name());
    kit.delete_queue_on_drop(topology.dead_letter_queue_name().unwrap());
    kit.delete_exchange_on_drop(topology.dead_letter_exchange_name().unwrap());
    topology.declare(kit.channel()).await.unwrap();
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

#[tokio::test]
async fn on_quorum_queues_retries_dead_letters_and_a_replay_work_as_on_classic_ones() {
    let (kit, exchange, topology) = quorum_broker("retry_dead_replay").await;
    let urls = AmqpUrls::from([dead_url().as_str(), amqp_url().as_str()]);
    let flaky = placed("o-1", 1);
    let doomed = placed("o-2", 1);
    let (flaky_id, doomed_id) = (flaky.id, doomed.id);
    let failing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let calls: Arc<Mutex<Vec<uuid::Uuid>>> = Arc::default();
    let handler = {
        let (failing, calls) = (Arc::clone(&failing), Arc::clone(&calls));
        handler_fn(move |_tx: &mut InboxTx, event: &IncomingEvent| {
            let result = {
                let mut calls = calls.lock().unwrap();
                calls.push(event.id);
                let seen = calls.iter().filter(|id| **id == event.id).count();
                if event.id == flaky_id && seen == 1 {
                    Err(HandlerError::new("fails once"))
                } else if event.id == doomed_id && failing.load(Ordering::SeqCst) {
                    Err(HandlerError::permanent("fails until fixed"))
                } else {
                    Ok(())
                }
            };
            Box::pin(async move { result })
        })
    };
    let inbox = InMemoryInbox::new();
    let consumer = InboxConsumer::builder(
        urls.clone(),
        topology.queue_name(),
        kit.named("consumer"),
        inbox.clone(),
        handler,
    )
    .declare(topology.clone())
    .retry_delay(Duration::from_millis(50))
    .build()
    .unwrap();
    let running = Running::start(consumer);
    let publisher = LapinPublisher::builder(urls.clone())
        .exchange(&exchange)
        .connection_name(kit.named("relay"))
        .build()
        .unwrap();
    let outcomes = publisher.publish(&[&flaky, &doomed], None).await;
    assert!(
        outcomes.iter().all(|o| matches!(o, PublishOutcome::Acked)),
        "{outcomes:?}"
    );
    let dlq = topology.dead_letter_queue_name().unwrap().to_owned();
    eventually("the flaky event retried and the doomed one dead-lettered")
        .within(WAIT)
        .until(|| async {
            let calls = calls.lock().unwrap().clone();
            calls.iter().filter(|id| **id == flaky_id).count() == 2
                && calls.contains(&doomed_id)
                && kit.ready(&dlq).await == 1
        })
        .await;

    failing.store(false, Ordering::SeqCst);
    let mut dead = DeadLetterQueue::connect(urls, dlq.clone()).await.unwrap();
    let report = dead.replay(None, &|_| {}).await.unwrap();
    dead.close().await.unwrap();
    assert_eq!(report.replayed, 1, "{report:?}");
    eventually("the replayed event handled")
        .within(WAIT)
        .until(|| async { inbox.len() == 2 })
        .await;
    running.stop().await;
    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls.iter().filter(|id| **id == doomed_id).count(),
        2,
        "dead-lettered at once, then handled once after the replay: {calls:?}"
    );
    assert_eq!(kit.ready(&dlq).await, 0);
    assert_eq!(kit.ready(topology.queue_name()).await, 0);
}

#[tokio::test]
async fn past_its_delivery_limit_a_message_that_keeps_coming_back_is_dead_lettered_by_the_broker() {
    let kit = TestBroker::new(names::unique("test_cluster", "delivery_limit")).await;
    let topology = QueueTopology::new(kit.named("q"))
        .queue_type(QueueType::Quorum)
        .delivery_limit(2);
    let (queue, dlq) = (
        topology.queue_name().to_owned(),
        topology.dead_letter_queue_name().unwrap().to_owned(),
    );
    declare_deleted_on_drop(&kit, &topology).await;
    let envelope = placed("o-1", 1);
    kit.publish(
        "",
        &queue,
        envelope.payload.as_bytes(),
        outbox_lapin::wire::properties(&envelope, "/tests"),
    )
    .await;

    // A consumer that dies with the message: it comes back unacked.
    let channel = kit.connection().create_channel().await.unwrap();
    let mut deliveries = 0;
    for _ in 0..200 {
        match channel
            .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap()
        {
            Some(got) => {
                deliveries += 1;
                got.delivery
                    .acker
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..BasicNackOptions::default()
                    })
                    .await
                    .unwrap();
            }
            None if kit.ready(&dlq).await == 1 => break,
            None => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
    assert_eq!(deliveries, 3, "delivered 1 + 2 times, then dead-lettered");
    let dead = kit.drain(&dlq).await;
    assert_eq!(dead.len(), 1);
    let headers = dead[0].delivery.properties.headers().clone().unwrap();
    let header = |key: &str| outbox_lapin::wire::header_str(&headers, key).map(str::to_owned);
    assert_eq!(
        (
            header("x-first-death-reason"),
            header("x-first-death-queue")
        ),
        (Some("delivery_limit".to_owned()), Some(queue.clone())),
        "the broker says why and from where: {headers:?}"
    );
    assert!(headers.inner().contains_key("x-death"));
    let _ = channel.close(200, "done".into()).await;
}

/// Gets and nacks (requeue) every delivery of `queue` until it has none
/// ready, as a consumer that dies with each message would; returns how many
/// it saw.
async fn bounce_until_gone(channel: &lapin::Channel, queue: &str) -> u32 {
    let mut deliveries = 0;
    for _ in 0..200 {
        match channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: false })
            .await
            .unwrap()
        {
            Some(got) => {
                deliveries += 1;
                got.delivery
                    .acker
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..BasicNackOptions::default()
                    })
                    .await
                    .unwrap();
            }
            None => return deliveries,
        }
    }
    panic!("`{queue}` still delivers after 200 nacks");
}

#[tokio::test]
async fn past_its_delivery_limit_a_message_whose_dead_letter_queue_is_gone_is_kept_not_dropped() {
    let kit = TestBroker::new(names::unique("test_cluster", "dlq_gone")).await;
    let topology = QueueTopology::new(kit.named("q"))
        .queue_type(QueueType::Quorum)
        .delivery_limit(1);
    let (queue, dlq) = (
        topology.queue_name().to_owned(),
        topology.dead_letter_queue_name().unwrap().to_owned(),
    );
    declare_deleted_on_drop(&kit, &topology).await;
    // The dead-letter queue deleted (by an operator, a cleanup): its
    // exchange now routes nowhere.
    kit.channel()
        .queue_delete(dlq.as_str().into(), Default::default())
        .await
        .unwrap();
    let envelope = placed("o-1", 1);
    kit.publish(
        "",
        &queue,
        envelope.payload.as_bytes(),
        outbox_lapin::wire::properties(&envelope, "/tests"),
    )
    .await;

    let channel = kit.connection().create_channel().await.unwrap();
    let deliveries = bounce_until_gone(&channel, &queue).await;
    assert_eq!(deliveries, 2, "delivered 1 + 1 times, then dead-lettered");

    // At-most-once dead-lettering (the broker's default) would have dropped
    // it here. At-least-once keeps it until a dead-letter queue takes it:
    // once the queue is back, it arrives there.
    topology.declare(kit.channel()).await.unwrap();
    let dead = eventually("the kept message dead-lettered once its queue is back")
        .within(Duration::from_secs(300))
        .every(Duration::from_millis(500))
        .some(|| async {
            let dead = kit.drain(&dlq).await;
            (!dead.is_empty()).then_some(dead)
        })
        .await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].delivery.data, envelope.payload.as_bytes());
    let _ = channel.close(200, "done".into()).await;
}

#[tokio::test]
async fn a_quorum_queue_declared_without_at_least_once_dead_lettering_is_refused_by_name() {
    let kit = TestBroker::new(names::unique("test_cluster", "old_quorum")).await;
    let topology = QueueTopology::new(kit.named("q")).queue_type(QueueType::Quorum);
    let (queue, dlx) = (
        topology.queue_name().to_owned(),
        topology.dead_letter_exchange_name().unwrap().to_owned(),
    );
    kit.delete_queue_on_drop(&queue);
    kit.delete_queue_on_drop(topology.dead_letter_queue_name().unwrap());
    kit.delete_exchange_on_drop(&dlx);
    // The queue as an earlier version declared it: no dead-letter strategy.
    let mut old = FieldTable::default();
    old.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    old.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(dlx.as_str().into()),
    );
    kit.channel()
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            old,
        )
        .await
        .unwrap();

    let channel = kit.connection().create_channel().await.unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), topology.declare(&channel))
        .await
        .expect("answered, not hung")
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, Error::Amqp { .. })
            && text.contains("PRECONDITION_FAILED")
            && text.contains(&queue),
        "{text}"
    );
}

/// A node that completes the AMQP handshake and then never answers (a
/// minority node in a partition): a proxy to the shared broker that
/// forwards only the client's channel-0 frames (handshake, heartbeats), so
/// opening a channel is never answered. Returns its URL.
fn handshake_only_node() -> String {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    let broker = amqp_url();
    let authority = broker.split("://").nth(1).unwrap();
    let authority = authority.split('/').next().unwrap();
    let target = authority.rsplit('@').next().unwrap().to_owned();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = broker.replacen(&target, &listener.local_addr().unwrap().to_string(), 1);
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let Ok(mut server) = TcpStream::connect(&target) else {
                return;
            };
            let (mut client_in, mut server_out) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || std::io::copy(&mut server, &mut client));
            std::thread::spawn(move || -> std::io::Result<()> {
                let mut header = [0u8; 8];
                client_in.read_exact(&mut header)?;
                server_out.write_all(&header)?;
                loop {
                    let mut frame = [0u8; 7];
                    client_in.read_exact(&mut frame)?;
                    let channel = u16::from_be_bytes([frame[1], frame[2]]);
                    let size = u32::from_be_bytes([frame[3], frame[4], frame[5], frame[6]]);
                    let mut rest = vec![0u8; size as usize + 1];
                    client_in.read_exact(&mut rest)?;
                    if channel == 0 {
                        server_out.write_all(&frame)?;
                        server_out.write_all(&rest)?;
                    }
                }
            });
        }
    });
    url
}

#[tokio::test]
async fn a_node_that_answers_only_the_handshake_is_left_for_the_next_url() {
    let kit = TestBroker::new(names::unique("test_cluster", "handshake_only")).await;
    let exchange = kit.topic_exchange(&kit.named("x")).await;
    let queue = kit.queue(&kit.named("q")).await;
    kit.bind(&queue, &exchange, "#").await;
    let urls = AmqpUrls::from(vec![handshake_only_node(), amqp_url()]);
    let publisher = LapinPublisher::builder(&urls)
        .exchange(&exchange)
        .source("/tests")
        .connection_name(kit.named("relay"))
        .operation_timeout(Duration::from_secs(1))
        .build()
        .unwrap();

    // The first round connects to the first node (the handshake works)
    // and its channel is never opened.
    let err = publisher.connect().await.unwrap_err();
    assert!(
        matches!(err, Error::Timeout { .. }),
        "the channel of the first node times out: {err}"
    );
    // The next round starts at the second node, which works (before, it
    // started at the first node again, every time).
    publisher.connect().await.unwrap();
    let event = placed("o-1", 1);
    let outcomes = publisher.publish(&[&event], None).await;
    assert!(
        matches!(outcomes[..], [PublishOutcome::Acked]),
        "{outcomes:?}"
    );
    assert_eq!(kit.ready(&queue).await, 1);

    // So does a new client sharing the URLs (it starts where the last one
    // worked).
    let other = LapinPublisher::builder(&urls)
        .exchange(&exchange)
        .source("/tests")
        .connection_name(kit.named("relay-2"))
        .operation_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    other.connect().await.unwrap();
}
