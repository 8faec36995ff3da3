//! Logs and metrics.
//!
//! `/metrics` serves the `metrics` facade through a Prometheus recorder:
//! the relay's counters (`outbox_published_total`, `outbox_failed_total`,
//! ...) where a relay runs in the process, the inbox consumers' counters,
//! and the outbox gauges (`outbox_backlog`, `outbox_oldest_unsent_age_seconds`,
//! `outbox_dead`, `outbox_blocked_aggregates`, `outbox_unroutable_events`),
//! which [`outbox_gauges`] reads from the database every few seconds: every
//! process that serves HTTP shows them, whether or not a relay runs in it.

use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use outbox::OutboxStore;
use outbox::relay::metric_names as names;

use crate::shutdown::Shutdown;

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
