//! Trace context captured at record (feature `opentelemetry`): the current
//! OpenTelemetry span's context, over the `context` scope's, malformed
//! values dropped, baggage only when carried.
#![cfg(feature = "opentelemetry")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use opentelemetry::baggage::BaggageExt;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use outbox_core::trace_context::{self, TraceParent};
use outbox_core::{DomainEvent, EventEnvelope, Headers, context};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;

#[derive(serde::Serialize)]
struct Noted;

impl DomainEvent for Noted {
    fn aggregate_type(&self) -> &'static str {
        "note"
    }
    fn event_type(&self) -> &'static str {
        "note.noted"
    }
    fn aggregate_id(&self) -> String {
        "1".into()
    }
}

const REQUEST: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn subscriber() -> (impl tracing::Subscriber + Send + Sync, SdkTracerProvider) {
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(InMemorySpanExporter::default())
        .build();
    let tracer = provider.tracer("test");
    let subscriber =
        tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
    (subscriber, provider)
}

fn record_in_scope(scope: Headers) -> EventEnvelope {
    block_on(context::scope(scope, async {
        EventEnvelope::from_event(&Noted).expect("a valid event")
    }))
}

/// Runs a future to completion on a current-thread runtime (the subscriber
/// set with `with_default` is this thread's).
fn block_on<F: std::future::Future>(fut: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
        .block_on(fut)
}

#[test]
fn an_event_recorded_in_a_span_carries_the_span_context_over_the_scope() {
    let (subscriber, _provider) = subscriber();
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!("handler");
        let _entered = span.enter();
        let cx = span.context();
        let expected = cx.span().span_context().clone();
        assert!(expected.is_valid(), "the layer gives the span a context");

        let scope = Headers::new()
            .with(Headers::TRACEPARENT, REQUEST)
            .with(Headers::TRACESTATE, "congo=t61rcWkgMzE")
            .with(Headers::CORRELATION_ID, "req-1");
        let envelope = record_in_scope(scope);
        let tp = TraceParent::parse(envelope.headers.get(Headers::TRACEPARENT).unwrap()).unwrap();
        assert_eq!(tp.trace_id(), expected.trace_id().to_string());
        assert_eq!(tp.span_id(), expected.span_id().to_string());
        assert_eq!(
            envelope.headers.get(Headers::TRACESTATE),
            None,
            "the scope's tracestate belongs to the scope's traceparent"
        );
        assert_eq!(envelope.headers.get(Headers::CORRELATION_ID), Some("req-1"));

        // What the caller sets afterwards wins (it is the caller's).
        let own = envelope.with_traceparent(REQUEST);
        assert_eq!(own.headers.get(Headers::TRACEPARENT), Some(REQUEST));
    });
}

#[test]
fn a_span_parented_from_headers_continues_their_trace() {
    let (subscriber, _provider) = subscriber();
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!("process");
        let carried = Headers::new().with(Headers::TRACEPARENT, REQUEST);
        assert!(trace_context::set_parent(&span, &carried));
        let _entered = span.enter();
        let envelope = record_in_scope(Headers::new());
        let tp = TraceParent::parse(envelope.headers.get(Headers::TRACEPARENT).unwrap()).unwrap();
        assert_eq!(tp.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_ne!(tp.span_id(), "00f067aa0ba902b7", "the child span's own id");

        let malformed = Headers::new().with(Headers::TRACEPARENT, "00-abc-def-01");
        assert!(!trace_context::set_parent(
            &tracing::info_span!("x"),
            &malformed
        ));
    });
}

#[test]
fn without_an_opentelemetry_span_the_scope_gives_the_context_and_malformed_values_are_dropped() {
    let envelope = record_in_scope(
        Headers::new()
            .with(Headers::TRACEPARENT, REQUEST)
            .with(Headers::TRACESTATE, "congo=t61rcWkgMzE"),
    );
    assert_eq!(envelope.headers.get(Headers::TRACEPARENT), Some(REQUEST));
    assert_eq!(
        envelope.headers.get(Headers::TRACESTATE),
        Some("congo=t61rcWkgMzE")
    );

    let envelope = record_in_scope(
        Headers::new()
            .with(
                Headers::TRACEPARENT,
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b71-01",
            )
            .with(Headers::TRACESTATE, "congo=t61rcWkgMzE")
            .with(Headers::CORRELATION_ID, "req-2"),
    );
    assert_eq!(envelope.headers.get(Headers::TRACEPARENT), None);
    assert_eq!(envelope.headers.get(Headers::TRACESTATE), None);
    assert_eq!(envelope.headers.get(Headers::CORRELATION_ID), Some("req-2"));
}

/// The one test of this binary that turns baggage on (a process-wide
/// setting); the others record no baggage.
#[test]
fn baggage_is_captured_only_when_carried_and_capped() {
    let (subscriber, _provider) = subscriber();
    tracing::subscriber::with_default(subscriber, || {
        let span = tracing::info_span!("request");
        let big = "x".repeat(300);
        let cx = Context::new().with_baggage(vec![
            KeyValue::new("tenant", "acme corp"),
            KeyValue::new("blob", big),
        ]);
        span.set_parent(cx).expect("a fresh span");
        let _entered = span.enter();

        let envelope = record_in_scope(Headers::new());
        assert_eq!(
            envelope.headers.get(Headers::BAGGAGE),
            None,
            "off by default"
        );

        trace_context::carry_baggage(100);
        let envelope = record_in_scope(Headers::new());
        assert_eq!(
            envelope.headers.get(Headers::BAGGAGE),
            Some("tenant=acme%20corp"),
            "percent-encoded; the member past the cap is dropped, not the event"
        );

        // Headers that fit only without the baggage: the event is recorded
        // without it.
        trace_context::carry_baggage(trace_context::MAX_BAGGAGE_LEN);
        let filler = "f".repeat(EventEnvelope::MAX_HEADERS_BYTES - 100);
        let envelope = record_in_scope(Headers::new().with("filler", filler.clone()));
        trace_context::carry_baggage(0);
        assert_eq!(envelope.headers.get("filler"), Some(filler.as_str()));
        assert_eq!(envelope.headers.get(Headers::BAGGAGE), None);

        // Carried baggage of many members (W3C allows 180): an OpenTelemetry
        // context holds 64, so 64 are carried, the same ones, whether the
        // event is recorded in a span parented from it or not.
        let many = (0..100)
            .map(|i| format!("k{i}=v{i}"))
            .collect::<Vec<_>>()
            .join(",");
        let carried = Headers::new()
            .with(Headers::TRACEPARENT, REQUEST)
            .with(Headers::BAGGAGE, many.clone());
        trace_context::carry_baggage(trace_context::MAX_BAGGAGE_LEN);
        let process = tracing::info_span!(parent: None, "process");
        assert!(trace_context::set_parent(&process, &carried));
        let in_span = process.in_scope(|| record_in_scope(carried.clone()));
        let mut injected = Headers::new();
        assert!(trace_context::inject(&process, &mut injected));
        let mut sanitized = carried.clone();
        trace_context::sanitize(&mut sanitized);
        trace_context::carry_baggage(0);
        let first_64: std::collections::BTreeSet<String> =
            (0..64).map(|i| format!("k{i}=v{i}")).collect();
        for headers in [&in_span.headers, &injected, &sanitized] {
            let members: std::collections::BTreeSet<String> = headers
                .get(Headers::BAGGAGE)
                .unwrap_or_default()
                .split(',')
                .map(str::to_owned)
                .collect();
            assert_eq!(members, first_64, "{:?}", headers.get(Headers::BAGGAGE));
        }
    });
}
