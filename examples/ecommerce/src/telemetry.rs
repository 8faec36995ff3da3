//! Logs, traces and metrics.
//!
//! [`init_tracing`] installs the `tracing` subscriber: log lines on stderr
//! (`RUST_LOG`) and, when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, spans exported by OTLP/HTTP
//! through a `tracing-opentelemetry` layer, with the W3C trace context and
//! baggage propagators installed globally. The outbox (feature
//! `opentelemetry`) then puts one order in one trace: the request's span
//! ([`request_span`], a child of the caller's `traceparent`), the relay's
//! `publish` span of each event, the consumers' `process` spans and the
//! events they record in turn. Unset, no exporter and no OpenTelemetry layer
//! run (the events still carry the caller's `traceparent`).
//!
//! `/metrics` serves the `metrics` facade through a Prometheus recorder:
//! the relay's counters (`outbox_published_total`, `outbox_failed_total`,
//! ...) where a relay runs in the process, the inbox consumers' counters,
//! and the outbox gauges (`outbox_backlog`, `outbox_oldest_unsent_age_seconds`,
//! `outbox_dead`, `outbox_blocked_aggregates`, `outbox_unroutable_events`),
//! which [`outbox_gauges`] reads from the database every few seconds: every
//! process that serves HTTP shows them, whether or not a relay runs in it.

use std::io::IsTerminal;
use std::time::Duration;

use axum::extract::{MatchedPath, Request};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use opentelemetry::propagation::TextMapCompositePropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use opentelemetry_sdk::trace::SdkTracerProvider;
use outbox::relay::metric_names as names;
use outbox::{Headers, OutboxStore, trace_context};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::shutdown::Shutdown;

/// The log filter unless `RUST_LOG` says otherwise.
pub const DEFAULT_LOG_FILTER: &str = "info,lapin::returned_messages=error";

/// How long [`Tracing::shutdown`] waits for the last spans to be exported.
pub const EXPORT_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// The process's tracing, from [`init_tracing`]: call
/// [`shutdown`](Self::shutdown) last, so the spans still buffered are
/// exported.
#[derive(Debug)]
#[must_use = "call shutdown() at exit, or the last spans are not exported"]
pub struct Tracing {
    provider: Option<SdkTracerProvider>,
}

impl Tracing {
    /// Whether spans are exported (`OTEL_EXPORTER_OTLP_ENDPOINT` set).
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports the spans still buffered and stops the exporter, waiting at
    /// most [`EXPORT_FLUSH_TIMEOUT`]. Call it outside the tokio runtime or
    /// after it stopped (the export is a blocking HTTP call).
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(error) = provider.shutdown_with_timeout(EXPORT_FLUSH_TIMEOUT)
        {
            tracing::warn!(%error, "exporting the last spans failed");
        }
    }
}

/// Installs the global `tracing` subscriber: log lines on stderr, filtered
/// by `RUST_LOG` (default [`DEFAULT_LOG_FILTER`]), and, when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is
/// set, the spans (those the filter lets through) exported by OTLP/HTTP
/// with protobuf (`opentelemetry-otlp`'s other `OTEL_EXPORTER_OTLP_*`
/// settings apply), as service `OTEL_SERVICE_NAME`, else `ecommerce-<role>`.
/// Then the W3C `traceparent`/`tracestate` and `baggage` propagators are
/// the global ones too.
///
/// An exporter that cannot be built is logged and left out: the service
/// runs without it.
///
/// # Panics
/// When a global subscriber is installed already.
pub fn init_tracing(role: &str) -> Tracing {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| DEFAULT_LOG_FILTER.into());
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let wanted = [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()));
    let (provider, failed) = if wanted {
        match otlp_provider(role) {
            Ok(provider) => (Some(provider), None),
            Err(error) => (None, Some(error)),
        }
    } else {
        (None, None)
    };
    let spans = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("ecommerce")));
    tracing_subscriber::registry()
        .with(filter)
        .with(logs)
        .with(spans)
        .init();
    if let Some(provider) = &provider {
        opentelemetry::global::set_tracer_provider(provider.clone());
        opentelemetry::global::set_text_map_propagator(TextMapCompositePropagator::new(vec![
            Box::new(TraceContextPropagator::new()),
            Box::new(BaggagePropagator::new()),
        ]));
        tracing::info!("exporting traces by OTLP/HTTP");
    }
    if let Some(error) = failed {
        tracing::warn!(%error, "the OTLP exporter could not be built; traces are not exported");
    }
    Tracing { provider }
}

/// A tracer provider exporting in batches by OTLP/HTTP (protobuf).
fn otlp_provider(role: &str) -> Result<SdkTracerProvider, opentelemetry_otlp::ExporterBuildError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()?;
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none_or(|v| v.is_empty()) {
        resource = resource.with_service_name(format!("ecommerce-{role}"));
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build())
}

/// The span of one HTTP request (tower-http's `TraceLayer::make_span_with`):
/// `"{method} {route}"`, kind server, a child of the caller's trace context
/// (`traceparent`, `tracestate`, and `baggage` when carried: see
/// `outbox::trace_context`); a malformed `traceparent` is ignored (the
/// request starts a trace of its own). The events the handler raises
/// record this span's context, so the relay and the consumers continue
/// the caller's trace.
pub fn request_span<B>(request: &Request<B>) -> tracing::Span {
    let method = request.method();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(MatchedPath::as_str);
    let name = match route {
        Some(route) => format!("{method} {route}"),
        None => method.to_string(),
    };
    let span = tracing::info_span!(
        "request",
        otel.name = %name,
        otel.kind = "server",
        http.request.method = %method,
        http.route = route,
        url.path = %request.uri().path(),
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

/// How often [`outbox_gauges`] reads the outbox's numbers.
pub const GAUGE_INTERVAL: Duration = Duration::from_secs(5);

/// Installs the Prometheus recorder as the global `metrics` recorder and
/// describes the outbox's metrics.
///
/// # Errors
/// When a recorder is installed already.
pub fn install_metrics() -> Result<PrometheusHandle, metrics_exporter_prometheus::BuildError> {
    let handle = PrometheusBuilder::new().install_recorder()?;
    names::describe();
    outbox::rabbitmq::consumer_metrics::describe();
    Ok(handle)
}

/// Shows the relay's counters at 0 before its first batch (a counter is
/// otherwise absent until first incremented), and `outbox_relay_paused` at
/// 0 until the relay first pauses (the dashboard in `docs/ops/` plots it).
pub fn register_relay_counters() {
    metrics::counter!(names::PUBLISHED_TOTAL).increment(0);
    metrics::counter!(names::FAILED_TOTAL).increment(0);
    metrics::counter!(names::DEAD_TOTAL).increment(0);
    metrics::gauge!(names::PAUSED).set(0.0);
}

/// Reads the outbox's numbers once and sets the gauges.
///
/// # Errors
/// The store's error; the gauges keep their last values.
pub async fn refresh_outbox_gauges<S: OutboxStore>(store: &S) -> Result<(), S::Error> {
    let stats = store.stats().await?;
    // Counts stay far below 2^53, so they are exact as f64.
    metrics::gauge!(names::BACKLOG).set(stats.backlog as f64);
    metrics::gauge!(names::DEAD).set(stats.dead as f64);
    metrics::gauge!(names::BLOCKED_AGGREGATES).set(stats.blocked_aggregates as f64);
    metrics::gauge!(names::UNROUTABLE_EVENTS).set(stats.unroutable as f64);
    metrics::gauge!(names::RELAYS_LIVE).set(stats.relays_live as f64);
    metrics::gauge!(names::OLDEST_UNSENT_AGE_SECONDS)
        .set(stats.oldest_unsent_age.map_or(0.0, |age| age.as_secs_f64()));
    Ok(())
}

/// Refreshes the outbox gauges every [`GAUGE_INTERVAL`] (the first time at
/// once) and runs the recorder's upkeep, until shutdown.
pub async fn outbox_gauges<S: OutboxStore>(
    store: S,
    metrics: PrometheusHandle,
    shutdown: Shutdown,
) {
    loop {
        if let Err(error) = refresh_outbox_gauges(&store).await {
            tracing::warn!(%error, "reading the outbox stats failed");
        }
        metrics.run_upkeep();
        tokio::select! {
            () = tokio::time::sleep(GAUGE_INTERVAL) => {}
            () = shutdown.wait() => return,
        }
    }
}
