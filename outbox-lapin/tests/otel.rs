//! The relay's `publish` spans (feature `opentelemetry`), against the real
//! RabbitMQ with an in-memory span exporter: each message's span is a child
//! of the context recorded with its event, linked to it and to the relay's
//! batch span, and its context is what the message carries.
#![cfg(feature = "opentelemetry")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use opentelemetry::trace::{SpanKind, Status, TracerProvider as _};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use outbox_core::testing::InMemoryStore;
use outbox_core::trace_context::TraceParent;
use outbox_core::{EventEnvelope, EventStatus, Headers, PublishOutcome, Publisher, Relay};
use outbox_lapin::LapinPublisher;
use outbox_lapin::wire::header_str;
use outbox_testkit::amqp::TestBroker;
use outbox_testkit::names;
use outbox_testkit::urls::amqp_url;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;
use uuid::Uuid;

/// The trace of the request that recorded the event.
const RECORDED: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const RECORDED_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const RECORDED_SPAN: &str = "00f067aa0ba902b7";

/// Installs an OpenTelemetry layer for this thread (the tests run on a
/// current-thread runtime, so the relay's tasks see it).
fn install() -> (
    tracing::subscriber::DefaultGuard,
    InMemorySpanExporter,
    SdkTracerProvider,
) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    let guard = tracing::subscriber::set_default(subscriber);
    (guard, exporter, provider)
}

fn envelope(traceparent: &str) -> EventEnvelope {
    EventEnvelope {
        id: Uuid::now_v7(),
        aggregate_type: "order".into(),
        aggregate_id: "o-1".into(),
        aggregate_version: Some(1),
        event_type: "order.placed".into(),
        schema_version: 1,
        payload: r#"{"n":1}"#.into(),
        headers: Headers::new()
            .with(Headers::TRACEPARENT, traceparent)
            .with(Headers::CORRELATION_ID, "corr-1"),
        occurred_at: chrono::Utc::now(),
    }
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|KeyValue { key: k, .. }| k.as_str() == key)
        .map(|kv| &kv.value)
}

fn string(value: &str) -> Option<Value> {
    Some(Value::from(value.to_owned()))
}

#[tokio::test(flavor = "current_thread")]
async fn the_publish_span_is_a_child_of_the_recorded_context_and_its_context_is_sent() {
    let (_guard, exporter, _provider) = install();
    let kit = TestBroker::new(names::unique("test", "otel-publish")).await;
    let exchange = kit.topic_exchange(&kit.named("x")).await;
    let queue = kit.queue(&kit.named("q")).await;
    kit.bind(&queue, &exchange, "#").await;
    let publisher = LapinPublisher::builder(amqp_url())
        .exchange(&exchange)
        .connection_name("outbox-test-otel-publish")
        .build()
        .unwrap();
    let store = InMemoryStore::new();
    let env = envelope(RECORDED);
    store.record_envelope(env.clone()).unwrap();
    let relay = Relay::builder(store.clone(), publisher).build().unwrap();
    outbox_core::testing::run_until(relay, &store, |s| {
        s.records().iter().all(|r| r.status == EventStatus::Sent)
    })
    .await
    .unwrap();

    let spans = exporter.get_finished_spans().unwrap();
    let publish = spans
        .iter()
        .find(|s| s.name == format!("publish {exchange}"))
        .unwrap_or_else(|| panic!("no publish span in {spans:#?}"));
    let batch = spans
        .iter()
        .find(|s| s.name == "send")
        .unwrap_or_else(|| panic!("no batch span in {spans:#?}"));

    // The message carries the publish span's context, in the recorded trace.
    let messages = kit.drain(&queue).await;
    assert_eq!(messages.len(), 1);
    let h = messages[0].delivery.properties.headers().as_ref().unwrap();
    let sent = TraceParent::parse(header_str(h, Headers::TRACEPARENT).unwrap()).unwrap();
    assert_eq!(sent.trace_id(), RECORDED_TRACE);
    assert_eq!(sent.span_id(), publish.span_context.span_id().to_string());
    assert_ne!(sent.span_id(), RECORDED_SPAN);
    assert!(sent.sampled(), "sampling follows the request's decision");

    // Its parent is the recorded context; it is a producer span with the
    // messaging attributes.
    assert_eq!(publish.span_context.trace_id().to_string(), RECORDED_TRACE);
    assert_eq!(publish.parent_span_id.to_string(), RECORDED_SPAN);
    assert!(publish.parent_span_is_remote);
    assert_eq!(publish.span_kind, SpanKind::Producer);
    assert_eq!(
        attribute(publish, "messaging.system"),
        string("rabbitmq").as_ref()
    );
    assert_eq!(
        attribute(publish, "messaging.destination.name"),
        string(&exchange).as_ref()
    );
    assert_eq!(
        attribute(publish, "messaging.rabbitmq.destination.routing_key"),
        string("order.placed").as_ref()
    );
    assert_eq!(
        attribute(publish, "messaging.message.id"),
        string(&env.id.to_string()).as_ref()
    );
    assert_eq!(
        attribute(publish, "messaging.message.conversation_id"),
        string("corr-1").as_ref()
    );
    assert_eq!(
        attribute(publish, "messaging.operation.type"),
        string("send").as_ref()
    );
    assert!(!matches!(publish.status, Status::Error { .. }));

    // Linked to the relay's batch span and to the recorded context.
    let linked: Vec<String> = publish
        .links
        .links
        .iter()
        .map(|l| l.span_context.span_id().to_string())
        .collect();
    assert!(
        linked.contains(&batch.span_context.span_id().to_string()),
        "{linked:?}"
    );
    assert!(linked.contains(&RECORDED_SPAN.to_owned()), "{linked:?}");

    // The batch span: a client span per the messaging conventions.
    assert_eq!(batch.span_kind, SpanKind::Client);
    assert_eq!(
        attribute(batch, "messaging.operation.type"),
        string("send").as_ref()
    );
    assert_eq!(
        attribute(batch, "messaging.batch.message_count"),
        Some(&Value::I64(1))
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_failed_publish_ends_its_span_with_an_error_status() {
    let (_guard, exporter, _provider) = install();
    let kit = TestBroker::new(names::unique("test", "otel-failed")).await;
    // Declared by the publisher, with no queue bound: the mandatory message
    // comes back unroutable.
    let exchange = kit.named("unbound");
    kit.delete_exchange_on_drop(exchange.clone());
    let publisher = LapinPublisher::builder(amqp_url())
        .exchange(&exchange)
        .connection_name("outbox-test-otel-failed")
        .build()
        .unwrap();
    let env = envelope(RECORDED);
    let outcomes = publisher
        .publish(&[&env], None)
        .instrument(tracing::info_span!("outbox.relay.batch"))
        .await;
    assert!(
        matches!(&outcomes[..], [PublishOutcome::Unroutable { .. }]),
        "{outcomes:?}"
    );
    let spans = exporter.get_finished_spans().unwrap();
    let publish = spans
        .iter()
        .find(|s| s.name == format!("publish {exchange}"))
        .unwrap_or_else(|| panic!("no publish span in {spans:#?}"));
    match &publish.status {
        Status::Error { description } => {
            assert!(description.contains("NO_ROUTE"), "{description}")
        }
        other => panic!("expected an error status, got {other:?}"),
    }
    assert_eq!(publish.parent_span_id.to_string(), RECORDED_SPAN);
}

#[tokio::test(flavor = "current_thread")]
async fn a_span_stays_open_across_narrowing_and_ends_once_per_message() {
    let (_guard, exporter, _provider) = install();
    let kit = TestBroker::new(names::unique("test", "otel-narrowing")).await;
    let exchange = kit.topic_exchange(&kit.named("x")).await;
    let queue = kit.queue(&kit.named("q")).await;
    kit.bind(&queue, &exchange, "#").await;
    let missing = format!("{exchange}.does-not-exist");
    let ghost_exchange = missing.clone();
    let publisher = LapinPublisher::builder(amqp_url())
        .exchange(&exchange)
        .exchange_for(move |e| (e.aggregate_id == "ghost").then(|| ghost_exchange.clone()))
        .connection_name("outbox-test-otel-narrowing")
        .build()
        .unwrap();
    // A channel closed by the broker (404 on the ghost's exchange) is
    // narrowed down over several rounds. (lapin may take the connection
    // down with the channel, see the publisher docs: then try afresh.)
    for _ in 0..20 {
        exporter.reset();
        let envs: Vec<EventEnvelope> = (0..6)
            .map(|n| {
                let mut env = envelope(RECORDED);
                if n == 3 {
                    env.aggregate_id = "ghost".into();
                }
                env
            })
            .collect();
        let refs: Vec<&EventEnvelope> = envs.iter().collect();
        let outcomes = publisher
            .publish(&refs, None)
            .instrument(tracing::info_span!("outbox.relay.batch"))
            .await;
        if outcomes.iter().any(|o| {
            matches!(
                o,
                PublishOutcome::ConnectionLost { .. } | PublishOutcome::ConnectionDied { .. }
            )
        }) {
            continue;
        }
        let spans = exporter.get_finished_spans().unwrap();
        for (n, env) in envs.iter().enumerate() {
            let id = string(&env.id.to_string());
            let mine: Vec<&SpanData> = spans
                .iter()
                .filter(|s| attribute(s, "messaging.message.id") == id.as_ref())
                .collect();
            assert_eq!(mine.len(), 1, "one publish span for event {n}: {mine:#?}");
            if n == 3 {
                assert!(
                    matches!(&outcomes[n], PublishOutcome::Rejected { reason } if reason.contains("404")),
                    "{:?}",
                    outcomes[n]
                );
                assert_eq!(mine[0].name, format!("publish {missing}"));
                assert!(
                    matches!(&mine[0].status, Status::Error { description } if description.contains("404")),
                    "{:?}",
                    mine[0].status
                );
            } else {
                assert_eq!(outcomes[n], PublishOutcome::Acked, "event {n}");
                assert_eq!(mine[0].status, Status::Unset, "event {n}");
            }
        }
        return;
    }
    panic!("every try lost the connection");
}

#[tokio::test(flavor = "current_thread")]
async fn an_event_that_fits_as_recorded_is_sent_even_if_the_span_context_would_not_fit() {
    let (_guard, exporter, _provider) = install();
    let kit = TestBroker::new(names::unique("test", "otel-fit")).await;
    let exchange = kit.topic_exchange(&kit.named("x")).await;
    let queue = kit.queue(&kit.named("q")).await;
    kit.bind(&queue, &exchange, "#").await;
    let publisher = LapinPublisher::builder(amqp_url())
        .exchange(&exchange)
        .connection_name("outbox-test-otel-fit")
        .build()
        .unwrap();
    // Recorded outside any trace, with headers a few bytes under the limit:
    // it was valid when recorded and is valid as stored. The publish span
    // (a root span, no recorded parent) would add a `traceparent`.
    let mut env = envelope(RECORDED);
    env.headers.remove(Headers::TRACEPARENT);
    let room = EventEnvelope::MAX_HEADERS_BYTES - env.encoded_headers_bytes();
    let filler = "f".repeat(room - "filler".len() - EventEnvelope::HEADER_ENTRY_OVERHEAD - 10);
    env.headers.insert("filler", filler);
    assert!(env.validate().is_ok());
    let outcomes = publisher
        .publish(&[&env], None)
        .instrument(tracing::info_span!("outbox.relay.batch"))
        .await;
    assert_eq!(
        outcomes,
        [PublishOutcome::Acked],
        "never made unpublishable by its own publish span"
    );
    let messages = kit.drain(&queue).await;
    assert_eq!(messages.len(), 1);
    let spans = exporter.get_finished_spans().unwrap();
    let publish = spans
        .iter()
        .find(|s| s.name == format!("publish {exchange}"))
        .unwrap_or_else(|| panic!("no publish span in {spans:#?}"));
    assert_eq!(publish.status, Status::Unset);
}

#[tokio::test(flavor = "current_thread")]
async fn a_publish_dropped_before_its_outcome_ends_its_span_as_an_error() {
    let (_guard, exporter, _provider) = install();
    let kit = TestBroker::new(names::unique("test", "otel-dropped")).await;
    let exchange = kit.topic_exchange(&kit.named("x")).await;
    let publisher = LapinPublisher::builder(amqp_url())
        .exchange(&exchange)
        .connection_name("outbox-test-otel-dropped")
        .build()
        .unwrap();
    let env = envelope(RECORDED);
    let batch = [&env];
    // What the relay does past its shutdown grace: the batch's future is
    // dropped while it waits (here, for its first connection).
    let publishing = publisher
        .publish(&batch, None)
        .instrument(tracing::info_span!("outbox.relay.batch"));
    assert!(
        tokio::time::timeout(std::time::Duration::ZERO, publishing)
            .await
            .is_err(),
        "still connecting"
    );
    let spans = exporter.get_finished_spans().unwrap();
    let publish = spans
        .iter()
        .find(|s| s.name == format!("publish {exchange}"))
        .unwrap_or_else(|| panic!("no publish span in {spans:#?}"));
    assert!(
        matches!(&publish.status, Status::Error { description } if description.contains("dropped")),
        "an abandoned publish is not a success: {:?}",
        publish.status
    );
}
