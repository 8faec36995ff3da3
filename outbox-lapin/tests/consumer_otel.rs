//! The inbox consumer's OpenTelemetry `process` spans (feature
//! `opentelemetry`) against the real RabbitMQ, with an in-memory span
//! exporter behind a `tracing-opentelemetry` layer: a child of the
//! producer's context by default, a new trace linked to it with
//! `trace_links(true)`, one per handler call in batch mode linked to the
//! batch's span; the events the handler records carry the `process` span's
//! context (and, when carried, the producer's baggage); a malformed
//! `traceparent` is neither a parent nor carried on; the handler-duration
//! and raise-to-handled histograms.
//!
//! Each test installs its own subscriber for its thread (`#[tokio::test]`
//! runs the consumer's tasks on that thread) and declares its own exchange
//! and queues, deleted when it ends, also when it fails. Baggage is
//! process-wide (`carry_baggage`): one test only turns it on.
#![cfg(feature = "opentelemetry")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use lapin::BasicProperties;
use lapin::types::{AMQPValue, LongString, ShortString};
use opentelemetry::trace::{SpanId, SpanKind, Status, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use outbox_core::testing::{InMemoryInbox, InboxTx};
use outbox_core::trace_context::{self, TraceParent};
use outbox_core::{EventEnvelope, Headers};
use outbox_diesel::{Outbox, PgInbox, PgInboxDatabase, PgTransaction};
use outbox_lapin::consumer_metrics::{HANDLER_DURATION_SECONDS, RAISE_TO_HANDLED_SECONDS};
use outbox_lapin::{EventHandler, HandlerError, IncomingEvent, handler_fn, wire};
use outbox_testkit::eventually::eventually;
use outbox_testkit::names;
use outbox_testkit::pg::TestSchema;
use outbox_testkit::urls::database_url;
use tracing_subscriber::layer::SubscriberExt;

use common::{Broker, Placed, Running, WAIT, placed};

/// The producer's `publish` span, as a message carries it.
const PRODUCER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// An exporter behind a layer, installed for this thread until the guard
/// drops.
struct Traces {
    exporter: InMemorySpanExporter,
    _provider: SdkTracerProvider,
    _guard: tracing::subscriber::DefaultGuard,
}

impl Traces {
    fn install() -> Traces {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        Traces {
            exporter,
            _provider: provider,
            _guard: tracing::subscriber::set_default(subscriber),
        }
    }

    fn spans(&self) -> Vec<SpanData> {
        self.exporter.get_finished_spans().unwrap()
    }

    /// The finished spans named `name`, waiting until there are `n`.
    async fn named(&self, name: &str, n: usize) -> Vec<SpanData> {
        eventually(format!("{n} spans `{name}` finished"))
            .within(WAIT)
            .until(|| async { self.spans().iter().filter(|s| s.name == name).count() >= n })
            .await;
        self.spans()
            .into_iter()
            .filter(|s| s.name == name)
            .collect()
    }
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

fn process_name(broker: &Broker) -> String {
    format!("process {}", broker.queue())
}

/// What the handler saw, and the event it recorded.
#[derive(Clone, Default)]
struct Recorded(Arc<Mutex<Vec<(IncomingEvent, EventEnvelope)>>>);

impl Recorded {
    fn all(&self) -> Vec<(IncomingEvent, EventEnvelope)> {
        self.0.lock().unwrap().clone()
    }

    /// The event recorded while handling `incoming`, waiting for it.
    async fn of(&self, incoming: uuid::Uuid) -> EventEnvelope {
        eventually("the handler recorded its event")
            .within(WAIT)
            .until(|| async { self.all().iter().any(|(seen, _)| seen.id == incoming) })
            .await;
        self.all()
            .into_iter()
            .find(|(seen, _)| seen.id == incoming)
            .map(|(_, recorded)| recorded)
            .unwrap()
    }
}

/// A handler that records an event (as `record` would build it) and keeps
/// it; it fails for aggregate `poison`.
fn recording(recorded: &Recorded) -> impl EventHandler<InboxTx> + use<> {
    let recorded = recorded.clone();
    handler_fn(move |_tx: &mut InboxTx, event: &IncomingEvent| {
        let recorded = recorded.clone();
        let event = event.clone();
        Box::pin(async move {
            if event.aggregate_id == "poison" {
                return Err(HandlerError::permanent("poison"));
            }
            let envelope = EventEnvelope::from_event(&Placed {
                order: format!("{}-next", event.aggregate_id),
                n: 0,
            })
            .unwrap();
            recorded.0.lock().unwrap().push((event, envelope));
            Ok(())
        })
    })
}

/// Publishes `envelope` as the relay does, with `extra` headers set as is
/// (so a malformed one reaches the consumer whatever the publisher checks).
async fn publish_with(broker: &Broker, envelope: &EventEnvelope, extra: &[(&str, &str)]) {
    let properties = wire::properties(envelope, "/tests");
    let mut headers = properties.headers().clone().unwrap_or_default();
    for (key, value) in extra {
        headers.insert(
            ShortString::from(*key),
            AMQPValue::LongString(LongString::from(*value)),
        );
    }
    let properties: BasicProperties = properties.with_headers(headers);
    broker
        .publish_raw(
            &envelope.event_type,
            envelope.payload.as_bytes(),
            properties,
        )
        .await;
}

fn traceparent(envelope: &EventEnvelope) -> TraceParent {
    TraceParent::parse(
        envelope
            .headers
            .get(Headers::TRACEPARENT)
            .expect("a traceparent"),
    )
    .expect("a valid traceparent")
}

#[tokio::test]
async fn the_process_span_is_a_child_of_the_producer_and_recorded_events_carry_it() {
    let metrics = Histograms::installed();
    let traces = Traces::install();
    let broker = Broker::new("test_cotel", "child", &["order.*"]).await;
    let recorded = Recorded::default();
    let consumer = broker
        .consumer(InMemoryInbox::new(), recording(&recorded))
        .build()
        .unwrap();
    let running = Running::start(consumer);

    let incoming = placed("o-1", 1);
    publish_with(
        &broker,
        &incoming,
        &[
            (Headers::TRACEPARENT, PRODUCER),
            (Headers::TRACESTATE, "congo=t61rcWkgMzE"),
            (Headers::CORRELATION_ID, "req-1"),
        ],
    )
    .await;
    let next = recorded.of(incoming.id).await;
    let spans = traces.named(&process_name(&broker), 1).await;
    running.stop().await;

    let span = &spans[0];
    let producer = TraceParent::parse(PRODUCER).unwrap();
    assert_eq!(span.span_kind, SpanKind::Consumer);
    assert_eq!(
        span.span_context.trace_id().to_string(),
        producer.trace_id()
    );
    assert_eq!(span.parent_span_id.to_string(), producer.span_id());
    assert!(span.parent_span_is_remote);
    assert_eq!(
        span.span_context.trace_state().header(),
        "congo=t61rcWkgMzE"
    );
    assert_eq!(span.status, Status::Unset);
    for (key, expected) in [
        ("messaging.system", "rabbitmq"),
        ("messaging.operation.name", "process"),
        ("messaging.operation.type", "process"),
        ("messaging.destination.name", broker.exchange.as_str()),
        ("messaging.rabbitmq.destination.routing_key", "order.placed"),
        ("messaging.message.id", &incoming.id.to_string()),
        ("messaging.message.conversation_id", "req-1"),
        ("messaging.consumer.group.name", &broker.consumer_name()),
        ("trace_id", &producer.trace_id()),
    ] {
        assert_eq!(attribute(span, key).as_deref(), Some(expected), "{key}");
    }

    // The recorded event continues the trace from the process span.
    let tp = traceparent(&next);
    assert_eq!(tp.trace_id(), producer.trace_id());
    assert_eq!(tp.span_id(), span.span_context.span_id().to_string());
    assert_eq!(
        next.headers.get(Headers::CAUSATION_ID),
        Some(incoming.id.to_string().as_str())
    );
    assert_eq!(next.headers.get(Headers::CORRELATION_ID), Some("req-1"));

    // Both histograms, labelled with the consumer.
    let name = broker.consumer_name();
    let durations = metrics.values(HANDLER_DURATION_SECONDS, &name);
    assert_eq!(durations.len(), 1, "one handler call");
    assert!(durations[0] >= 0.0 && durations[0] < WAIT.as_secs_f64());
    let raised = metrics.values(RAISE_TO_HANDLED_SECONDS, &name);
    assert_eq!(raised.len(), 1, "one event handled for the first time");
    let since_raised = (chrono::Utc::now() - incoming.occurred_at)
        .to_std()
        .unwrap()
        .as_secs_f64();
    assert!(
        raised[0] > 0.0 && raised[0] <= since_raised,
        "{} s, raised {since_raised} s ago",
        raised[0]
    );
}

/// With PostgreSQL: the event the handler records on the consumer's
/// transaction (`Outbox::record`) is stored with the `process` span's
/// context.
#[tokio::test]
async fn an_event_recorded_in_postgres_by_the_handler_carries_the_process_span() {
    let traces = Traces::install();
    let broker = Broker::new("test_cotel", "pg", &["order.*"]).await;
    let schema = TestSchema::reserve(&database_url(), names::unique("t_cotel", "pg"));
    let mut conn = outbox_diesel::connect(&database_url())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    outbox_diesel::migrate(&mut conn, schema.name())
        .await
        .unwrap();
    let pool = outbox_diesel::pool(&database_url(), 2).unwrap();
    let db = PgInboxDatabase::new(pool, PgInbox::new(schema.name()).unwrap());
    let outbox = Arc::new(Outbox::new(schema.name()).unwrap());
    let handler = handler_fn(move |tx: &mut PgTransaction, event: &IncomingEvent| {
        let outbox = outbox.clone();
        let order = format!("{}-next", event.aggregate_id);
        Box::pin(async move {
            outbox
                .record(tx, &Placed { order, n: 0 })
                .await
                .map_err(HandlerError::new)?;
            Ok(())
        })
    });
    let consumer = broker.consumer(db, handler).build().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(consumer.run(async {
        let _ = stopped.await;
    }));

    let incoming = placed("o-pg", 1);
    publish_with(
        &broker,
        &incoming,
        &[
            (Headers::TRACEPARENT, PRODUCER),
            (Headers::CORRELATION_ID, "req-pg"),
        ],
    )
    .await;
    let spans = traces.named(&process_name(&broker), 1).await;
    let _ = stop.send(());
    tokio::time::timeout(WAIT, running)
        .await
        .expect("the consumer stops")
        .unwrap()
        .expect("run returns Ok after shutdown");

    let span = &spans[0];
    assert_eq!(span.status, Status::Unset, "handled");
    let producer = TraceParent::parse(PRODUCER).unwrap();
    assert_eq!(span.parent_span_id.to_string(), producer.span_id());
    let expected = format!(
        "00-{}-{}-01",
        span.span_context.trace_id(),
        span.span_context.span_id()
    );
    assert_eq!(
        schema
            .count(&format!(
                "SELECT count(*) AS n FROM {{schema}}.outbox_events \
                 WHERE headers->>'traceparent' = '{expected}' \
                 AND headers->>'causation_id' = '{}' \
                 AND headers->>'correlation_id' = 'req-pg'",
                incoming.id
            ))
            .await,
        1,
        "the recorded row carries the process span's context, causation and correlation"
    );
}

#[tokio::test]
async fn with_trace_links_the_process_span_starts_a_trace_linked_to_the_producer() {
    let traces = Traces::install();
    let broker = Broker::new("test_cotel", "links", &["order.*"]).await;
    let recorded = Recorded::default();
    let consumer = broker
        .consumer(InMemoryInbox::new(), recording(&recorded))
        .trace_links(true)
        .build()
        .unwrap();
    let running = Running::start(consumer);

    let incoming = placed("o-2", 1);
    publish_with(&broker, &incoming, &[(Headers::TRACEPARENT, PRODUCER)]).await;
    let next = recorded.of(incoming.id).await;
    let spans = traces.named(&process_name(&broker), 1).await;
    running.stop().await;

    let span = &spans[0];
    let producer = TraceParent::parse(PRODUCER).unwrap();
    assert_eq!(span.span_kind, SpanKind::Consumer);
    assert_ne!(
        span.span_context.trace_id().to_string(),
        producer.trace_id()
    );
    assert_eq!(span.parent_span_id, SpanId::INVALID, "a root");
    let links: Vec<_> = span
        .links
        .iter()
        .map(|link| {
            (
                link.span_context.trace_id().to_string(),
                link.span_context.span_id().to_string(),
            )
        })
        .collect();
    assert_eq!(links, [(producer.trace_id(), producer.span_id())]);
    assert_eq!(
        attribute(span, "trace_id").as_deref(),
        Some(producer.trace_id().as_str()),
        "logs show the producer's trace id"
    );
    let tp = traceparent(&next);
    assert_eq!(tp.trace_id(), span.span_context.trace_id().to_string());
    assert_eq!(tp.span_id(), span.span_context.span_id().to_string());
}

#[tokio::test]
async fn a_malformed_traceparent_is_neither_the_parent_nor_carried_on() {
    let traces = Traces::install();
    let broker = Broker::new("test_cotel", "malformed", &["order.*"]).await;
    let recorded = Recorded::default();
    let consumer = broker
        .consumer(InMemoryInbox::new(), recording(&recorded))
        .build()
        .unwrap();
    let running = Running::start(consumer);

    let malformed = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01";
    let incoming = placed("o-3", 1);
    publish_with(
        &broker,
        &incoming,
        &[
            (Headers::TRACEPARENT, malformed),
            (Headers::TRACESTATE, "congo=t61rcWkgMzE"),
        ],
    )
    .await;
    let next = recorded.of(incoming.id).await;
    let spans = traces.named(&process_name(&broker), 1).await;
    running.stop().await;

    let span = &spans[0];
    assert_eq!(span.parent_span_id, SpanId::INVALID, "a root");
    assert!(span.links.is_empty());
    assert_eq!(attribute(span, "trace_id"), None);
    assert_eq!(span.span_context.trace_state().header(), "");
    let (seen, _) = recorded.all().remove(0);
    assert_eq!(seen.headers.get(Headers::TRACEPARENT), None);
    assert_eq!(seen.headers.get(Headers::TRACESTATE), None);
    // The recorded event carries the process span's own context instead.
    let tp = traceparent(&next);
    assert_eq!(tp.trace_id(), span.span_context.trace_id().to_string());
    assert_eq!(tp.span_id(), span.span_context.span_id().to_string());
    assert_eq!(next.headers.get(Headers::TRACESTATE), None);
}

#[tokio::test]
async fn without_an_opentelemetry_layer_recorded_events_continue_the_producers_trace() {
    // No subscriber: no span has an OpenTelemetry context.
    let broker = Broker::new("test_cotel", "no_layer", &["order.*"]).await;
    let recorded = Recorded::default();
    let consumer = broker
        .consumer(InMemoryInbox::new(), recording(&recorded))
        .build()
        .unwrap();
    let running = Running::start(consumer);

    let good = placed("o-4", 1);
    publish_with(
        &broker,
        &good,
        &[
            (Headers::TRACEPARENT, PRODUCER),
            (Headers::TRACESTATE, "congo=t61rcWkgMzE"),
        ],
    )
    .await;
    let bad = placed("o-5", 1);
    publish_with(&broker, &bad, &[(Headers::TRACEPARENT, "00-abc-def-01")]).await;
    let from_good = recorded.of(good.id).await;
    let from_bad = recorded.of(bad.id).await;
    running.stop().await;

    assert_eq!(from_good.headers.get(Headers::TRACEPARENT), Some(PRODUCER));
    assert_eq!(
        from_good.headers.get(Headers::TRACESTATE),
        Some("congo=t61rcWkgMzE")
    );
    assert_eq!(from_bad.headers.get(Headers::TRACEPARENT), None);
    assert_eq!(
        from_bad.headers.get(Headers::CAUSATION_ID),
        Some(bad.id.to_string().as_str())
    );
}

/// The only test of this binary that turns baggage on (process-wide).
#[tokio::test]
async fn carried_baggage_reaches_the_events_the_handler_records() {
    trace_context::carry_baggage(1024);
    let traces = Traces::install();
    let broker = Broker::new("test_cotel", "baggage", &["order.*"]).await;
    let recorded = Recorded::default();
    let child = broker
        .consumer(InMemoryInbox::new(), recording(&recorded))
        .build()
        .unwrap();
    let running = Running::start(child);
    let incoming = placed("o-6", 1);
    publish_with(
        &broker,
        &incoming,
        &[
            (Headers::TRACEPARENT, PRODUCER),
            (Headers::BAGGAGE, "user=alice,tier=gold"),
        ],
    )
    .await;
    let next = recorded.of(incoming.id).await;
    running.stop().await;
    traces.named(&process_name(&broker), 1).await;

    // Also when the process span only links to the producer (the baggage
    // then comes from the incoming headers, not the span's context).
    let linked_recorded = Recorded::default();
    let linked = broker
        .consumer(InMemoryInbox::new(), recording(&linked_recorded))
        .trace_links(true)
        .build()
        .unwrap();
    let running = Running::start(linked);
    let incoming_linked = placed("o-7", 1);
    publish_with(
        &broker,
        &incoming_linked,
        &[
            (Headers::TRACEPARENT, PRODUCER),
            (Headers::BAGGAGE, "user=bob"),
        ],
    )
    .await;
    let next_linked = linked_recorded.of(incoming_linked.id).await;
    running.stop().await;
    trace_context::carry_baggage(0);

    let members = |envelope: &EventEnvelope| {
        let mut members: Vec<String> = envelope
            .headers
            .get(Headers::BAGGAGE)
            .expect("baggage")
            .split(',')
            .map(|m| m.trim().to_owned())
            .collect();
        members.sort();
        members
    };
    assert_eq!(members(&next), ["tier=gold", "user=alice"]);
    assert_eq!(members(&next_linked), ["user=bob"]);
    let (seen, _) = recorded.all().remove(0);
    assert_eq!(
        seen.headers.get(Headers::BAGGAGE),
        Some("user=alice,tier=gold"),
        "the handler sees it"
    );
}

#[tokio::test]
async fn in_batch_mode_each_handler_call_has_a_process_span_linked_to_the_batch() {
    let traces = Traces::install();
    let broker = Broker::new("test_cotel", "batch", &["order.*"]).await;
    let recorded = Recorded::default();
    // Three messages wait before the consumer starts: one batch.
    let producers = [
        "00-11111111111111111111111111111111-1111111111111111-01",
        "00-22222222222222222222222222222222-2222222222222222-01",
        "00-33333333333333333333333333333333-3333333333333333-01",
    ];
    let mut incoming = Vec::new();
    for (n, producer) in producers.iter().enumerate() {
        let envelope = placed(&format!("o-b{n}"), 1);
        publish_with(&broker, &envelope, &[(Headers::TRACEPARENT, producer)]).await;
        incoming.push(envelope);
    }
    broker.wait_ready(broker.queue(), 3).await;
    let consumer = broker
        .consumer(InMemoryInbox::new(), recording(&recorded))
        .prefetch(10)
        .batch(10, std::time::Duration::from_millis(500))
        .build()
        .unwrap();
    let running = Running::start(consumer);
    for envelope in &incoming {
        recorded.of(envelope.id).await;
    }
    let batches = traces.named("outbox.consume_batch", 1).await;
    let spans = traces.named(&process_name(&broker), 3).await;
    running.stop().await;

    assert_eq!(batches.len(), 1, "one batch");
    let batch = &batches[0];
    assert_eq!(
        batch
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == "messaging.batch.message_count")
            .map(|kv| &kv.value),
        Some(&opentelemetry::Value::I64(3)),
        "an integer attribute, as the conventions say"
    );
    assert_eq!(spans.len(), 3);
    for (envelope, producer) in incoming.iter().zip(producers) {
        let producer = TraceParent::parse(producer).unwrap();
        let span = spans
            .iter()
            .find(|s| attribute(s, "messaging.message.id") == Some(envelope.id.to_string()))
            .expect("a process span per delivery");
        assert_eq!(span.span_kind, SpanKind::Consumer);
        assert_eq!(
            span.span_context.trace_id().to_string(),
            producer.trace_id()
        );
        assert_eq!(span.parent_span_id.to_string(), producer.span_id());
        let links: Vec<_> = span
            .links
            .iter()
            .map(|l| l.span_context.span_id())
            .collect();
        assert_eq!(links, [batch.span_context.span_id()], "linked to the batch");
        let next = recorded.of(envelope.id).await;
        assert_eq!(
            traceparent(&next).span_id(),
            span.span_context.span_id().to_string()
        );
    }
}

#[tokio::test]
async fn a_failed_handling_marks_its_process_span_as_an_error() {
    let traces = Traces::install();
    let broker = Broker::new("test_cotel", "failed", &["order.*"]).await;
    let consumer = broker
        .consumer(InMemoryInbox::new(), recording(&Recorded::default()))
        .max_attempts(1)
        .build()
        .unwrap();
    let running = Running::start(consumer);
    let poison = placed("poison", 1);
    publish_with(&broker, &poison, &[(Headers::TRACEPARENT, PRODUCER)]).await;
    broker.dead_letters(1).await;
    let spans = traces.named(&process_name(&broker), 1).await;
    running.stop().await;

    match &spans[0].status {
        Status::Error { description } => assert!(description.contains("poison"), "{description}"),
        other => panic!("status {other:?}"),
    }
}

/// The histograms recorded through the `metrics` facade, by name and
/// `consumer` label: this test binary's recorder, installed once.
#[derive(Default)]
struct Histograms(Mutex<HashMap<(String, String), Samples>>);

/// The values one histogram recorded.
type Samples = Arc<Mutex<Vec<f64>>>;

impl Histograms {
    fn installed() -> &'static Histograms {
        static INSTALLED: OnceLock<&'static Histograms> = OnceLock::new();
        INSTALLED.get_or_init(|| {
            let histograms: &'static Histograms = Box::leak(Box::default());
            metrics::set_global_recorder(HistogramRecorder(histograms))
                .expect("no other metrics recorder in this test binary");
            histograms
        })
    }

    fn values(&self, name: &str, consumer: &str) -> Vec<f64> {
        self.0
            .lock()
            .unwrap()
            .get(&(name.to_owned(), consumer.to_owned()))
            .map(|values| values.lock().unwrap().clone())
            .unwrap_or_default()
    }
}

struct HistogramRecorder(&'static Histograms);

struct Values(Samples);

impl metrics::HistogramFn for Values {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

impl metrics::Recorder for HistogramRecorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        key: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        let consumer = key
            .labels()
            .find(|label| label.key() == "consumer")
            .map(|label| label.value().to_owned())
            .unwrap_or_default();
        let values = self
            .0
            .0
            .lock()
            .unwrap()
            .entry((key.name().to_owned(), consumer))
            .or_default()
            .clone();
        metrics::Histogram::from_arc(Arc::new(Values(values)))
    }
}

#[tokio::test]
async fn in_batch_mode_a_handling_rolled_back_with_its_batch_is_not_a_success() {
    let traces = Traces::install();
    let broker = Broker::new("test_cotel", "rolledback", &["order.*"]).await;
    // Handled first in the batch, then rolled back with it (the poison
    // fails), then applied alone and committed.
    let first = placed("o-r1", 1);
    let poison = placed("poison", 1);
    publish_with(&broker, &first, &[(Headers::TRACEPARENT, PRODUCER)]).await;
    publish_with(&broker, &poison, &[(Headers::TRACEPARENT, PRODUCER)]).await;
    broker.wait_ready(broker.queue(), 2).await;
    let consumer = broker
        .consumer(InMemoryInbox::new(), recording(&Recorded::default()))
        .prefetch(10)
        .batch(10, std::time::Duration::from_millis(500))
        .max_attempts(1)
        .build()
        .unwrap();
    let running = Running::start(consumer);
    broker.dead_letters(1).await;
    let spans = traces.named(&process_name(&broker), 4).await;
    running.stop().await;

    let id = Some(first.id.to_string());
    let mine: Vec<&SpanData> = spans
        .iter()
        .filter(|s| attribute(s, "messaging.message.id") == id)
        .collect();
    assert_eq!(mine.len(), 2, "in the batch, then alone: {mine:#?}");
    assert!(
        mine.iter().any(|s| matches!(&s.status,
            Status::Error { description } if description.contains("rolled back"))),
        "its work in the batch was rolled back: {:?}",
        mine.iter().map(|s| &s.status).collect::<Vec<_>>()
    );
    assert!(
        mine.iter().any(|s| s.status == Status::Unset),
        "applied alone and committed"
    );
}
