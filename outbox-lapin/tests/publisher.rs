//! `LapinPublisher` against the real RabbitMQ: wire format, confirms,
//! unroutable returns, channel errors narrowed to their message, reconnects.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use lapin::ExchangeKind;
use lapin::options::ExchangeDeclareOptions;
use lapin::types::AMQPValue;
use outbox_core::{EventEnvelope, Headers, PublishOutcome, Publisher};
use outbox_lapin::LapinPublisher;
use outbox_lapin::wire::{self, header_str};
use outbox_testkit::amqp::{TestBroker, close_connection};
use outbox_testkit::names;
use outbox_testkit::urls::amqp_url;
use uuid::Uuid;

/// A private exchange and queue (bound with `#`), deleted on drop (also
/// when the test panics), with what the test declares through `kit`.
struct Broker {
    kit: TestBroker,
    exchange: String,
    queue: String,
}

impl Broker {
    async fn new(test: &str) -> Broker {
        let kit = TestBroker::new(names::unique("test", test)).await;
        let exchange = kit.topic_exchange(&kit.named("x")).await;
        let queue = kit.queue(&kit.named("q")).await;
        kit.bind(&queue, &exchange, "#").await;
        Broker {
            kit,
            exchange,
            queue,
        }
    }

    fn publisher(&self, connection_name: &str) -> LapinPublisher {
        LapinPublisher::builder(amqp_url())
            .exchange(&self.exchange)
            .source("/tests")
            .connection_name(connection_name)
            .build()
            .unwrap()
    }

    /// Takes every message currently in the queue; returns their ids, in
    /// arrival order.
    async fn received_ids(&self) -> Vec<String> {
        self.drain()
            .await
            .iter()
            .map(|m| {
                m.delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .unwrap()
                    .to_string()
            })
            .collect()
    }

    /// Takes every message currently in the queue.
    async fn drain(&self) -> Vec<lapin::message::BasicGetMessage> {
        self.kit.drain(&self.queue).await
    }
}

fn envelope(aggregate: &str, n: i64) -> EventEnvelope {
    EventEnvelope {
        id: Uuid::now_v7(),
        aggregate_type: "order".into(),
        aggregate_id: aggregate.into(),
        aggregate_version: Some(n),
        event_type: "order.placed".into(),
        schema_version: 1,
        payload: format!(r#"{{"z":{n},"a":"ünïcode","nested":{{"k":[1,2]}}}}"#),
        headers: Headers::new(),
        occurred_at: chrono::Utc::now(),
    }
}

#[tokio::test]
async fn a_published_event_arrives_with_the_whole_wire_format() {
    let broker = Broker::new("wire").await;
    let publisher = broker.publisher("outbox-test-wire");
    let mut env = envelope("o-1", 4)
        .with_correlation_id("corr-1")
        .with_causation_id("cause-1")
        .with_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        .with_header(Headers::TRACESTATE, "vendor=1");
    env.schema_version = 3;
    let outcomes = publisher.publish(&[&env], None).await;
    assert_eq!(outcomes, [PublishOutcome::Acked]);

    let messages = broker.drain().await;
    assert_eq!(messages.len(), 1);
    let m = &messages[0].delivery;
    assert_eq!(
        m.data,
        env.payload.as_bytes(),
        "body is the stored payload, byte for byte"
    );
    assert_eq!(m.routing_key.as_str(), "order.placed");
    let p = &m.properties;
    assert_eq!(
        p.content_type().as_ref().unwrap().as_str(),
        "application/json"
    );
    assert_eq!(
        p.message_id().as_ref().unwrap().as_str(),
        env.id.to_string()
    );
    assert_eq!(p.kind().as_ref().unwrap().as_str(), "order.placed");
    assert_eq!(*p.timestamp(), Some(env.occurred_at.timestamp() as u64));
    assert_eq!(*p.delivery_mode(), Some(2));
    assert_eq!(p.correlation_id().as_ref().unwrap().as_str(), "corr-1");
    let h = p.headers().as_ref().unwrap();
    assert_eq!(header_str(h, "aggregate_type"), Some("order"));
    assert_eq!(header_str(h, "aggregate_id"), Some("o-1"));
    assert_eq!(
        h.inner().get("aggregate_version"),
        Some(&AMQPValue::LongLongInt(4))
    );
    assert_eq!(
        h.inner().get("schema_version"),
        Some(&AMQPValue::LongLongInt(3))
    );
    assert!(matches!(
        h.inner().get("traceparent"),
        Some(AMQPValue::LongString(_))
    ));
    assert_eq!(
        header_str(h, "traceparent"),
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    );
    assert_eq!(header_str(h, "tracestate"), Some("vendor=1"));
    assert_eq!(header_str(h, "correlation_id"), Some("corr-1"));
    assert_eq!(header_str(h, "causation_id"), Some("cause-1"));
    assert_eq!(
        header_str(h, "cloudEvents:id"),
        Some(env.id.to_string().as_str())
    );
    assert_eq!(header_str(h, "cloudEvents:type"), Some("order.placed"));
    assert_eq!(header_str(h, "cloudEvents:source"), Some("/tests"));
    assert_eq!(header_str(h, "cloudEvents:subject"), Some("o-1"));
    assert_eq!(header_str(h, "cloudEvents:specversion"), Some("1.0"));
    let time = header_str(h, "cloudEvents:time").unwrap();
    assert_eq!(
        chrono::DateTime::parse_from_rfc3339(time).unwrap(),
        env.occurred_at
    );
    // And a consumer decodes it back to the same event.
    let incoming = wire::decode(p, m.routing_key.as_str(), &m.data).unwrap();
    assert_eq!(incoming.id, env.id);
    assert_eq!(incoming.payload, env.payload);
    assert_eq!(incoming.headers.get(Headers::CAUSATION_ID), Some("cause-1"));
}

#[tokio::test]
async fn a_pipelined_batch_is_confirmed_in_full_and_arrives_in_order() {
    let broker = Broker::new("batch").await;
    let publisher = broker.publisher("outbox-test-batch");
    let envs: Vec<EventEnvelope> = (0..500).map(|n| envelope(&format!("o-{n}"), n)).collect();
    let refs: Vec<&EventEnvelope> = envs.iter().collect();
    let outcomes = publisher.publish(&refs, None).await;
    assert!(outcomes.iter().all(|o| *o == PublishOutcome::Acked));
    let received = broker.received_ids().await;
    let sent: Vec<String> = envs.iter().map(|e| e.id.to_string()).collect();
    assert_eq!(received, sent);
}

#[tokio::test]
async fn an_unroutable_event_is_reported_unroutable_not_acked() {
    let broker = Broker::new("unroutable").await;
    // A second exchange with no binding (the publisher declares it):
    // mandatory publishes come back.
    broker
        .kit
        .delete_exchange_on_drop(format!("{}.unbound", broker.exchange));
    let publisher = LapinPublisher::builder(amqp_url())
        .exchange(format!("{}.unbound", broker.exchange))
        .connection_name("outbox-test-unroutable")
        .build()
        .unwrap();
    let env = envelope("o-1", 1);
    let outcomes = publisher.publish(&[&env], None).await;
    match &outcomes[..] {
        [PublishOutcome::Unroutable { reason }] => {
            assert!(
                reason.contains("312") && reason.contains("NO_ROUTE"),
                "{reason}"
            )
        }
        other => panic!("expected unroutable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_messages_amid_pipelined_batches_are_rejected_exactly() {
    // lapin attaches a `basic.return` to whichever confirm completes next;
    // with the broker's multiple-acks that can be another message's. The
    // publisher matches returns by message id: over many pipelined
    // batches, exactly the unroutable messages are rejected.
    let broker = Broker::new("returns").await;
    let unbound = format!("{}.unbound", broker.exchange);
    broker
        .kit
        .exchange(
            &unbound,
            ExchangeKind::Topic,
            ExchangeDeclareOptions::default(),
        )
        .await;
    let lost_exchange = unbound.clone();
    let publisher = LapinPublisher::builder(amqp_url())
        .exchange(&broker.exchange)
        .exchange_for(move |e| (e.aggregate_id == "lost").then(|| lost_exchange.clone()))
        .connection_name("outbox-test-returns")
        .build()
        .unwrap();
    let mut acked = std::collections::HashSet::new();
    for b in 0..20 {
        let batch: Vec<EventEnvelope> = (0..50)
            .map(|n| envelope(if n == 25 { "lost" } else { "real" }, b * 100 + n))
            .collect();
        let refs: Vec<&EventEnvelope> = batch.iter().collect();
        let outcomes = publisher.publish(&refs, None).await;
        for (n, (env, outcome)) in batch.iter().zip(&outcomes).enumerate() {
            if env.aggregate_id == "lost" {
                assert!(
                    matches!(outcome, PublishOutcome::Unroutable { reason } if reason.contains("NO_ROUTE")),
                    "batch {b}: the unroutable message is reported unroutable, got {outcome:?}"
                );
            } else {
                assert_eq!(*outcome, PublishOutcome::Acked, "batch {b} event {n}");
                acked.insert(env.id.to_string());
            }
        }
    }
    let received: std::collections::HashSet<String> =
        broker.received_ids().await.into_iter().collect();
    assert_eq!(received, acked, "exactly the acked messages arrived");
}

#[tokio::test]
async fn an_event_over_the_wire_limits_is_unpublishable_and_never_sent() {
    let broker = Broker::new("unpublishable").await;
    let publisher = broker.publisher("outbox-test-unpublishable");
    // Stored by another writer: the record-time checks never saw it.
    let mut long_name = envelope("o-1", 1);
    long_name.headers.insert("h".repeat(256), "v");
    let mut huge_headers = envelope("o-2", 1);
    huge_headers.headers.insert("note", "n".repeat(200 * 1024));
    let fine = envelope("o-3", 1);
    let outcomes = publisher
        .publish(&[&long_name, &huge_headers, &fine], None)
        .await;
    for outcome in &outcomes[..2] {
        assert!(
            matches!(outcome, PublishOutcome::Unpublishable { reason } if reason.contains("bytes long")),
            "{outcome:?}"
        );
    }
    assert_eq!(
        outcomes[2],
        PublishOutcome::Acked,
        "its batch neighbour is sent"
    );
    let received = broker.received_ids().await;
    assert_eq!(
        received,
        [fine.id.to_string()],
        "only the sendable one arrived"
    );
}

#[tokio::test]
async fn an_event_whose_header_frame_exceeds_frame_max_is_unpublishable_and_the_connection_lives() {
    let broker = Broker::new("frame_max").await;
    // A connection that negotiates a small frame (4 KiB is AMQP's minimum
    // maximum): headers that pass the envelope's checks no longer fit.
    let url = format!("{}?frame_max=8192", amqp_url());
    let publisher = LapinPublisher::builder(url)
        .exchange(&broker.exchange)
        .connection_name("outbox-test-frame-max")
        .build()
        .unwrap();
    let mut wide = envelope("o-1", 1);
    for i in 0..40 {
        wide.headers.insert(format!("h{i}"), "v".repeat(256));
    }
    wide.validate().expect("well within the envelope's limits");
    let fine = envelope("o-2", 1);
    let outcomes = publish_until_settled(&publisher, &[&wide, &fine]).await;
    assert!(
        matches!(&outcomes[0], PublishOutcome::Unpublishable { reason } if reason.contains("frame_max")),
        "{:?}",
        outcomes[0]
    );
    assert_eq!(outcomes[1], PublishOutcome::Acked, "its neighbour is sent");
    assert_eq!(broker.received_ids().await, [fine.id.to_string()]);
    // The connection was never closed for it: the next publish goes out on
    // it at once.
    let next = envelope("o-3", 1);
    assert_eq!(
        publisher.publish(&[&next], None).await,
        [PublishOutcome::Acked]
    );
}

/// Publishes `events` and, like the relay, publishes again those that come
/// back `ConnectionLost` or `ConnectionDied` (no attempt spent): a channel error can take the
/// connection down with it (see the `LapinPublisher` docs), so this loops
/// until every event is acked or rejected.
async fn publish_until_settled(
    publisher: &LapinPublisher,
    events: &[&EventEnvelope],
) -> Vec<PublishOutcome> {
    let mut settled: Vec<Option<PublishOutcome>> = vec![None; events.len()];
    for _ in 0..20 {
        let left: Vec<usize> = (0..events.len())
            .filter(|&i| settled[i].is_none())
            .collect();
        if left.is_empty() {
            break;
        }
        let batch: Vec<&EventEnvelope> = left.iter().map(|&i| events[i]).collect();
        for (i, outcome) in left.into_iter().zip(publisher.publish(&batch, None).await) {
            if !matches!(
                outcome,
                PublishOutcome::ConnectionLost { .. } | PublishOutcome::ConnectionDied { .. }
            ) {
                settled[i] = Some(outcome);
            }
        }
    }
    settled
        .into_iter()
        .map(|o| o.expect("settled within 20 rounds"))
        .collect()
}

#[tokio::test]
async fn a_missing_exchange_fails_only_the_events_routed_to_it() {
    let broker = Broker::new("missing_exchange").await;
    let missing = format!("{}.does-not-exist", broker.exchange);
    let publisher = LapinPublisher::builder(amqp_url())
        .exchange(&broker.exchange)
        .exchange_for(move |e| (e.aggregate_id == "ghost").then(|| missing.clone()))
        .connection_name("outbox-test-missing-exchange")
        .build()
        .unwrap();
    let envs: Vec<EventEnvelope> = (0..9)
        .map(|n| envelope(if n == 4 { "ghost" } else { "real" }, n))
        .collect();
    let refs: Vec<&EventEnvelope> = envs.iter().collect();
    let outcomes = publish_until_settled(&publisher, &refs).await;
    for (n, outcome) in outcomes.iter().enumerate() {
        if n == 4 {
            match outcome {
                PublishOutcome::Rejected { reason } => {
                    assert!(reason.contains("404"), "{reason}")
                }
                other => panic!("the ghost event must be rejected, got {other:?}"),
            }
        } else {
            assert_eq!(*outcome, PublishOutcome::Acked, "event {n}");
        }
    }
    let received: std::collections::HashSet<String> =
        broker.received_ids().await.into_iter().collect();
    for (n, env) in envs.iter().enumerate() {
        assert_eq!(received.contains(&env.id.to_string()), n != 4, "event {n}");
    }
    // The publisher keeps working afterwards.
    let next = envelope("real", 10);
    assert_eq!(
        publisher.publish(&[&next], None).await,
        [PublishOutcome::Acked]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_batches_overlap_and_a_bad_one_fails_only_its_culprit() {
    let broker = Broker::new("concurrent").await;
    let missing = format!("{}.does-not-exist", broker.exchange);
    let publisher = LapinPublisher::builder(amqp_url())
        .exchange(&broker.exchange)
        .exchange_for(move |e| (e.aggregate_id == "ghost").then(|| missing.clone()))
        .connection_name("outbox-test-concurrent-batches")
        .build()
        .unwrap();
    // Eight batches in flight at once, as relay loops do; one holds a
    // message whose exchange does not exist, which makes the broker close
    // its channel.
    let batches: Vec<Vec<EventEnvelope>> = (0..8)
        .map(|b| {
            (0..50)
                .map(|n| {
                    let aggregate = if b == 3 && n == 20 { "ghost" } else { "real" };
                    envelope(aggregate, b * 100 + n)
                })
                .collect()
        })
        .collect();
    // Like the relay: what comes back `ConnectionLost` is published again
    // (no attempt spent), see `publish_until_settled`.
    let final_outcomes = futures_util::future::join_all(batches.iter().map(|batch| {
        let publisher = publisher.clone();
        async move {
            let refs: Vec<&EventEnvelope> = batch.iter().collect();
            publish_until_settled(&publisher, &refs).await
        }
    }))
    .await;
    let mut acked = std::collections::HashSet::new();
    for (b, (batch, outcomes)) in batches.iter().zip(&final_outcomes).enumerate() {
        for (n, (env, outcome)) in batch.iter().zip(outcomes).enumerate() {
            if env.aggregate_id == "ghost" {
                assert!(
                    matches!(outcome, PublishOutcome::Rejected { reason } if reason.contains("404")),
                    "the ghost is rejected: {outcome:?}"
                );
            } else {
                assert_eq!(*outcome, PublishOutcome::Acked, "batch {b} event {n}");
                acked.insert(env.id.to_string());
            }
        }
    }
    let received: std::collections::HashSet<String> =
        broker.received_ids().await.into_iter().collect();
    assert_eq!(acked.len(), 399);
    assert!(
        acked.is_subset(&received),
        "every acked message arrived ({} of {} missing)",
        acked.difference(&received).count(),
        acked.len()
    );
}

#[tokio::test]
async fn a_closed_connection_is_reported_lost_then_reopened() {
    let broker = Broker::new("reconnect").await;
    let name = format!("outbox-test-reconnect-{}", std::process::id());
    let publisher = broker.publisher(&name);
    publisher.connect().await.unwrap();
    let first = envelope("o", 1);
    assert_eq!(
        publisher.publish(&[&first], None).await,
        [PublishOutcome::Acked]
    );

    assert_eq!(
        close_connection(&name),
        1,
        "the publisher's connection is listed"
    );
    // The broker closes it asynchronously; wait until the client sees it.
    let mut lost = false;
    for _ in 0..50 {
        let env = envelope("o", 2);
        match publisher.publish(&[&env], None).await.as_slice() {
            [PublishOutcome::ConnectionLost { .. }] => {
                lost = true;
                break;
            }
            [PublishOutcome::Acked] => {
                // Reconnected already, or the close had not landed yet.
                if close_connection(&name) == 0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            other => panic!("unexpected outcome {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        lost,
        "a publish on the closed connection reports ConnectionLost"
    );
    // The next publish reconnects.
    let after = envelope("o", 3);
    assert_eq!(
        publisher.publish(&[&after], None).await,
        [PublishOutcome::Acked]
    );
}

#[tokio::test]
async fn an_unreachable_broker_is_connection_lost_and_connect_says_how_to_fix() {
    let publisher = LapinPublisher::builder("amqp://guest:secret@127.0.0.1:1/%2f")
        .build()
        .unwrap();
    let env = envelope("o", 1);
    assert!(matches!(
        publisher.publish(&[&env], None).await.as_slice(),
        [PublishOutcome::ConnectionLost { .. }]
    ));
    let err = publisher.connect().await.unwrap_err().to_string();
    assert!(err.contains("scripts/dev-services"), "{err}");
    assert!(!err.contains("secret"), "password redacted: {err}");
}

#[tokio::test]
async fn malformed_trace_context_is_never_forwarded_and_never_counted() {
    let broker = Broker::new("malformed-trace").await;
    let publisher = broker.publisher("outbox-test-malformed-trace");
    // Stored by another writer: the record-time checks never saw it. The
    // baggage alone is over the headers limit; left out, it costs nothing.
    let mut env = envelope("o-1", 1)
        .with_correlation_id("corr-1")
        .with_header(Headers::TRACEPARENT, "00-abc-def-01")
        .with_header(Headers::TRACESTATE, "Not a state")
        .with_header(
            Headers::BAGGAGE,
            format!("no equals sign {}", "b".repeat(80 * 1024)),
        );
    env.headers.insert("note", "kept");
    let outcomes = publisher.publish(&[&env], None).await;
    assert_eq!(outcomes, [PublishOutcome::Acked]);

    let messages = broker.drain().await;
    assert_eq!(messages.len(), 1);
    let h = messages[0].delivery.properties.headers().as_ref().unwrap();
    for key in [Headers::TRACEPARENT, Headers::TRACESTATE, Headers::BAGGAGE] {
        assert!(h.inner().get(key).is_none(), "{key} was forwarded");
    }
    assert_eq!(header_str(h, "note"), Some("kept"));
    assert_eq!(header_str(h, Headers::CORRELATION_ID), Some("corr-1"));
}
