//! One order is one trace (feature `opentelemetry`), against the real
//! PostgreSQL and RabbitMQ: an HTTP request through the Axum layer, in a
//! span continuing the caller's `traceparent`, raises an event; the relay
//! publishes it in a `publish` span (child of the request's span, linked to
//! its batch span); the inbox consumer handles it in a `process` span (child
//! of the `publish` span) whose handler records a chained event, published
//! and processed in the same trace; opted-in baggage of the request arrives
//! on the chained event's message. A malformed `traceparent` is refused.
//!
//! The spans go to an in-memory exporter through the global subscriber
//! (the relay, the consumer and the HTTP server run on tasks of their own):
//! this binary holds these tests only, and each finds its spans by its own
//! trace and event ids.
#![cfg(feature = "opentelemetry")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::routing::post;
use opentelemetry::trace::{SpanId, SpanKind, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use outbox::axum::{Events, OutboxLayer, Tx};
use outbox::postgres::{Outbox, PgInbox, PgInboxDatabase, PgTransaction};
use outbox::rabbitmq::{
    EventHandler, HandlerError, InboxConsumer, IncomingEvent, QueueTopology, wire,
};
use outbox::{DomainEvent, EventEnvelope, Headers, RetryPolicy, trace_context};
use outbox_testkit::eventually::eventually;
use outbox_testkit::urls::amqp_url;
use outbox_tests::Pipeline;
use outbox_tests::events::OrderPlaced;
use serde::Serialize;
use tower_http::trace::TraceLayer;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use uuid::Uuid;

const WAIT: Duration = Duration::from_secs(30);

/// The caller's context: trace `4bf9…`, parent span `00f0…`, sampled.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
/// Uppercase hex: not a valid `traceparent` (W3C: lowercase only).
const MALFORMED: &str = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01";

/// The event the inbox handler records on its transaction when it handles
/// `order.placed`.
#[derive(Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
struct OrderAcknowledged {
    #[aggregate_id]
    order_id: Uuid,
}

/// The spans every test exports: the global subscriber's OpenTelemetry
/// layer, set once for the binary. Baggage is carried (process-wide).
fn spans() -> &'static InMemorySpanExporter {
    static EXPORTER: OnceLock<InMemorySpanExporter> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        // The library's spans and the test's request spans; not the drivers'.
        let traced = Targets::new()
            .with_default(LevelFilter::INFO)
            .with_target("lapin", LevelFilter::OFF);
        let logs = tracing_subscriber::fmt::layer()
            .with_test_writer()
            .with_filter(tracing_subscriber::EnvFilter::new(
                "warn,lapin::returned_messages=error",
            ));
        let subscriber = tracing_subscriber::registry()
            .with(
                tracing_opentelemetry::layer()
                    .with_tracer(provider.tracer("outbox-tests"))
                    .with_filter(traced),
            )
            .with(logs);
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
        trace_context::carry_baggage(1024);
        exporter
    })
}

/// The exported span matching `pred`, waiting for it (spans are exported
/// when they end).
async fn span(what: &str, pred: impl Fn(&SpanData) -> bool) -> SpanData {
    eventually(what.to_owned())
        .within(WAIT)
        .some(|| {
            let found = spans()
                .get_finished_spans()
                .unwrap()
                .into_iter()
                .find(|s| pred(s));
            std::future::ready(found)
        })
        .await
}

fn attr(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| kv.value.to_string())
}

/// The `publish` or `process` (`operation`) span of event `id`.
async fn messaging_span(operation: &str, id: Uuid) -> SpanData {
    span(&format!("the {operation} span of event {id}"), |s| {
        attr(s, "messaging.operation.name").as_deref() == Some(operation)
            && attr(s, "messaging.message.id") == Some(id.to_string())
    })
    .await
}

/// `child`'s parent is `parent`, in the same trace.
fn assert_child_of(child: &SpanData, parent: &SpanData, what: &str) {
    assert_eq!(
        child.span_context.trace_id(),
        parent.span_context.trace_id(),
        "{what}: same trace"
    );
    assert_eq!(
        child.parent_span_id,
        parent.span_context.span_id(),
        "{what}: parent span"
    );
}

/// The request span of one request (the example's `request_span`, in
/// short): a child of the caller's trace context.
fn request_span(request: &Request) -> tracing::Span {
    let span = tracing::info_span!(
        "request",
        otel.name = "POST /orders",
        otel.kind = "server",
        url.path = %request.uri().path(),
        http.request.header.x_request_id = request
            .headers()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok()),
    );
    let mut headers = Headers::new();
    for key in [Headers::TRACEPARENT, Headers::TRACESTATE, Headers::BAGGAGE] {
        if let Some(value) = request.headers().get(key).and_then(|v| v.to_str().ok()) {
            headers.insert(key, value);
        }
    }
    trace_context::set_parent(&span, &headers);
    span
}

/// `POST /orders` raises `order.placed` and answers its event id.
async fn place(_tx: Tx, events: Events) -> Result<(StatusCode, String), StatusCode> {
    let envelope = EventEnvelope::from_event(&OrderPlaced {
        order_id: Uuid::now_v7(),
        total_cents: 2999,
    })
    .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    let id = envelope.id;
    events
        .raise_envelope(envelope)
        .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    Ok((StatusCode::CREATED, id.to_string()))
}

/// Records `order.acknowledged` for each `order.placed`.
struct Acknowledge {
    outbox: Outbox,
}

impl EventHandler<PgTransaction> for Acknowledge {
    async fn handle(
        &self,
        tx: &mut PgTransaction,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        if event.event_type == "order.placed" {
            let order_id = event.aggregate_id.parse().map_err(HandlerError::new)?;
            self.outbox
                .record(tx, &OrderAcknowledged { order_id })
                .await?;
        }
        Ok(())
    }
}

/// A pipeline (schema, exchange, tap queue bound to `#`), a relay on it, an
/// inbox consumer on a queue of its own, and the HTTP app on a free port.
struct Shop {
    pipeline: Pipeline,
    base: String,
    stops: Vec<Box<dyn FnOnce() + Send>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Shop {
    async fn start(test: &str) -> Shop {
        let pipeline = Pipeline::new("t_otel", test, "#").await;
        let mut stops: Vec<Box<dyn FnOnce() + Send>> = Vec::new();
        let mut tasks = Vec::new();

        let (relay, relay_task) = pipeline.start(
            pipeline.publisher().build().unwrap(),
            RetryPolicy::default(),
        );
        let handle = relay.clone();
        stops.push(Box::new(move || handle.shutdown()));
        tasks.push(relay_task);

        let topology = QueueTopology::new(pipeline.broker.named("inbox"))
            .exchange(&pipeline.exchange)
            .bind("order.#");
        pipeline.broker.delete_queue_on_drop(topology.queue_name());
        if let Some(dlq) = topology.dead_letter_queue_name() {
            pipeline.broker.delete_queue_on_drop(dlq);
        }
        if let Some(dlx) = topology.dead_letter_exchange_name() {
            pipeline.broker.delete_exchange_on_drop(dlx);
        }
        topology.declare(pipeline.broker.channel()).await.unwrap();
        let consumer = InboxConsumer::builder(
            amqp_url(),
            topology.queue_name(),
            format!("{}.inbox", pipeline.name),
            PgInboxDatabase::new(
                pipeline.pool.clone(),
                PgInbox::new(&pipeline.schema).unwrap(),
            ),
            Acknowledge {
                outbox: pipeline.outbox.clone(),
            },
        )
        .build()
        .unwrap();
        let (stop_consumer, stopped) = tokio::sync::oneshot::channel::<()>();
        stops.push(Box::new(move || {
            let _ = stop_consumer.send(());
        }));
        tasks.push(tokio::spawn(async move {
            consumer
                .run(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        }));

        let app = Router::new()
            .route("/orders", post(place))
            .layer(
                OutboxLayer::new(pipeline.pool.clone())
                    .outbox(pipeline.outbox.clone())
                    .relay(relay),
            )
            .layer(TraceLayer::new_for_http().make_span_with(request_span));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
        stops.push(Box::new(move || {
            let _ = stop_http.send(());
        }));
        tasks.push(tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = http_stopped.await;
                })
                .await
                .unwrap();
        }));
        Shop {
            pipeline,
            base,
            stops,
            tasks,
        }
    }

    /// `POST /orders` with `headers`; the event id it answers.
    async fn place_order(&self, headers: &[(&str, &str)]) -> Uuid {
        let mut request = reqwest::Client::new().post(format!("{}/orders", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.unwrap();
        assert_eq!(
            response.status(),
            reqwest::StatusCode::CREATED,
            "the order is placed"
        );
        response.text().await.unwrap().parse().unwrap()
    }

    /// The message of event `id` the tap queue received (waiting for it).
    async fn message(&self, id: Uuid) -> Received {
        self.received(&format!("event {id} on the tap queue"), |e| e.id == id)
            .await
    }

    /// The event of type `event_type` on the tap queue (waiting for it).
    async fn message_of_type(&self, event_type: &str) -> Received {
        self.received(&format!("an {event_type} on the tap queue"), |e| {
            e.event_type == event_type
        })
        .await
    }

    async fn received(&self, what: &str, pred: impl Fn(&IncomingEvent) -> bool) -> Received {
        let queue = &self.pipeline.queue;
        eventually(what.to_owned())
            .within(WAIT)
            .some(|| async {
                self.pipeline
                    .broker
                    .peek(queue)
                    .await
                    .into_iter()
                    .filter_map(|m| {
                        let properties = &m.delivery.properties;
                        let event = wire::decode(
                            properties,
                            m.delivery.routing_key.as_str(),
                            &m.delivery.data,
                        )
                        .ok()?;
                        let baggage = properties
                            .headers()
                            .as_ref()
                            .and_then(|h| wire::header_str(h, Headers::BAGGAGE))
                            .map(str::to_owned);
                        Some(Received { event, baggage })
                    })
                    .find(|r| pred(&r.event))
            })
            .await
    }

    async fn stop(self) {
        for stop in self.stops {
            stop();
        }
        for task in self.tasks {
            tokio::time::timeout(WAIT, task)
                .await
                .expect("stops in time")
                .unwrap();
        }
    }
}

/// A message on the tap queue: the event as a consumer decodes it, and its
/// AMQP `baggage` header (`IncomingEvent::headers` holds the trace context
/// and the ids only).
struct Received {
    event: IncomingEvent,
    baggage: Option<String>,
}

fn baggage_members(value: &str) -> Vec<String> {
    let mut members: Vec<String> = value.split(',').map(|m| m.trim().to_owned()).collect();
    members.sort();
    members
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_order_is_one_trace_from_the_request_through_the_relay_and_the_consumer_to_a_chained_event()
 {
    spans();
    let shop = Shop::start("one_trace").await;

    let placed = shop
        .place_order(&[
            ("traceparent", &format!("00-{TRACE}-{CALLER_SPAN}-01")),
            ("baggage", "user=alice,tier=gold"),
        ])
        .await;

    // The request: a child of the caller's span, in the caller's trace.
    let trace = TraceId::from_hex(TRACE).unwrap();
    let request = span("the request span", |s| {
        s.span_context.trace_id() == trace && s.span_kind == SpanKind::Server
    })
    .await;
    assert_eq!(
        request.parent_span_id,
        SpanId::from_hex(CALLER_SPAN).unwrap()
    );
    assert!(request.parent_span_is_remote, "the caller's span is remote");

    // The relay: `publish`, a child of the request's span (the context
    // recorded with the event), linked to its batch's span.
    let publish = messaging_span("publish", placed).await;
    assert_child_of(&publish, &request, "publish ← request");
    assert_eq!(publish.span_kind, SpanKind::Producer);
    assert_eq!(
        attr(&publish, "messaging.system").as_deref(),
        Some("rabbitmq")
    );
    assert_eq!(
        attr(&publish, "messaging.destination.name"),
        Some(shop.pipeline.exchange.clone())
    );
    let batch = span("the relay batch span", |s| {
        attr(s, "messaging.batch.message_count").is_some()
            && publish
                .links
                .iter()
                .any(|l| l.span_context.span_id() == s.span_context.span_id())
    })
    .await;
    assert_ne!(
        batch.span_context.trace_id(),
        trace,
        "the batch span is the relay's own, linked, not a parent"
    );
    // The message carries the publish span's context.
    let message = shop.message(placed).await;
    assert_eq!(
        message.event.headers.get(Headers::TRACEPARENT),
        Some(format!("00-{TRACE}-{}-01", publish.span_context.span_id()).as_str())
    );

    // The consumer: `process`, a child of the `publish` span.
    let process = messaging_span("process", placed).await;
    assert_child_of(&process, &publish, "process ← publish");
    assert_eq!(process.span_kind, SpanKind::Consumer);

    // The chained event: recorded in the `process` span, published and
    // processed in the same trace.
    let Received {
        event: chained,
        baggage: chained_baggage,
    } = shop.message_of_type("order.acknowledged").await;
    let chained_publish = messaging_span("publish", chained.id).await;
    assert_child_of(&chained_publish, &process, "chained publish ← process");
    let chained_process = messaging_span("process", chained.id).await;
    assert_child_of(
        &chained_process,
        &chained_publish,
        "chained process ← chained publish",
    );
    assert_eq!(
        chained.headers.get(Headers::CAUSATION_ID),
        Some(placed.to_string().as_str()),
        "the chained event names its cause"
    );

    // Baggage (opted in): from the request to the chained event's message.
    assert_eq!(
        chained_baggage.as_deref().map(baggage_members),
        Some(vec!["tier=gold".to_owned(), "user=alice".to_owned()]),
        "the request's baggage on the chained event's message"
    );

    shop.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_traceparent_is_refused_and_the_request_succeeds() {
    spans();
    let shop = Shop::start("malformed").await;

    let placed = shop
        .place_order(&[("traceparent", MALFORMED), ("x-request-id", "malformed-1")])
        .await;

    // The request span starts a trace of its own.
    let request = span("the request span of the malformed request", |s| {
        attr(s, "http.request.header.x_request_id").as_deref() == Some("malformed-1")
    })
    .await;
    assert_eq!(
        request.parent_span_id,
        SpanId::INVALID,
        "no parent: a root span"
    );
    assert_ne!(
        request.span_context.trace_id(),
        TraceId::from_hex(TRACE).unwrap(),
        "not the malformed value's trace"
    );

    // The stored event carries the request span's context, never the
    // malformed value.
    let stored = shop
        .pipeline
        .count(&format!(
            "SELECT count(*) AS n FROM {{schema}}.outbox_events WHERE id = '{placed}' \
             AND headers->>'traceparent' = '00-{}-{}-01'",
            request.span_context.trace_id(),
            request.span_context.span_id()
        ))
        .await;
    assert_eq!(
        stored, 1,
        "the event carries the request span's traceparent"
    );
    let malformed = shop
        .pipeline
        .count(&format!(
            "SELECT count(*) AS n FROM {{schema}}.outbox_events WHERE headers::text ILIKE '%{}%'",
            &MALFORMED[3..35]
        ))
        .await;
    assert_eq!(malformed, 0, "the malformed traceparent is not stored");

    let message = shop.message(placed).await;
    assert_eq!(
        message
            .event
            .headers
            .get(Headers::TRACEPARENT)
            .and_then(|tp| tp.get(3..35)),
        Some(request.span_context.trace_id().to_string().as_str()),
        "the message continues the request span's trace"
    );
    shop.stop().await;
}
