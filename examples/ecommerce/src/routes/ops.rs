//! Operations endpoints: `GET /healthz` and `GET /metrics`.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use diesel_async::SimpleAsyncConnection as _;
use futures_util::FutureExt as _;
use futures_util::future::BoxFuture;
use lapin::Connection;
use outbox::rabbitmq::AmqpUrls;
use tokio::sync::Mutex;

use super::AppState;
use crate::db::{Database, DbPool};

/// No node yet in [`Health::check_broker`].
const NO_NODE: usize = usize::MAX;

/// How long each health probe may take before it counts as down.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// The database probe: a `SELECT 1` on a pooled connection.
type DatabaseProbe = Box<dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync>;

/// Probes the database and the broker.
pub struct Health {
    database: DatabaseProbe,
    /// The broker's URLs, kept for the app's life: where the next probe
    /// starts is remembered from one probe to the next.
    urls: AmqpUrls,
    /// Kept open between probes (reopened when lost), so a probe is one
    /// channel round trip rather than a new AMQP connection.
    broker: Mutex<Option<Connection>>,
}

impl fmt::Debug for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Health")
            .field("urls", &self.urls)
            .finish_non_exhaustive()
    }
}

/// The outcome of one probe of each dependency: `Err` says why it is down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthReport {
    /// The database: a `SELECT 1` on a pooled connection.
    pub database: Result<(), ProbeError>,
    /// RabbitMQ: opening and closing a channel.
    pub broker: Result<(), ProbeError>,
}

/// Why a probe failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeError {
    /// No answer within [`PROBE_TIMEOUT`].
    Timeout,
    /// The dependency answered with an error (the driver's text, which may
    /// name hosts, users and server versions: for logs, not for clients).
    Failed(String),
}

impl ProbeError {
    /// The short reason `/healthz` shows to anonymous clients.
    pub fn reason(&self) -> &'static str {
        match self {
            ProbeError::Timeout => "timeout",
            ProbeError::Failed(_) => "unreachable",
        }
    }
}

impl fmt::Display for ProbeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeError::Timeout => write!(f, "no answer within {PROBE_TIMEOUT:?}"),
            ProbeError::Failed(detail) => f.write_str(detail),
        }
    }
}

impl HealthReport {
    /// `true` when both are reachable.
    pub fn is_healthy(&self) -> bool {
        self.database.is_ok() && self.broker.is_ok()
    }
}

impl Health {
    /// Probes on `pool` and the broker at `amqp_url`.
    pub fn new<C: Database>(pool: DbPool<C>, amqp_url: impl Into<String>) -> Self {
        let database: DatabaseProbe = Box::new(move || {
            let pool = pool.clone();
            async move {
                let mut conn = pool.get().await.map_err(|e| e.to_string())?;
                conn.batch_execute("SELECT 1")
                    .await
                    .map_err(|e| e.to_string())
            }
            .boxed()
        });
        Health {
            database,
            // `AMQP_URL` may list every node of a cluster.
            urls: AmqpUrls::from(amqp_url.into()),
            broker: Mutex::new(None),
        }
    }

    /// Probes both, concurrently, each bounded by [`PROBE_TIMEOUT`].
    pub async fn check(&self) -> HealthReport {
        let (database, broker) = tokio::join!(bounded(self.check_database()), self.probe_broker());
        HealthReport { database, broker }
    }

    async fn check_database(&self) -> Result<(), String> {
        (self.database)().await
    }

    /// The broker probe, bounded by [`PROBE_TIMEOUT`]. A probe that fails
    /// or times out on a node moves the start of the next one to the next
    /// URL: with a frozen node (which takes longer than a probe to time out
    /// a connection), the next probe tries the next node rather than the
    /// frozen one again.
    async fn probe_broker(&self) -> Result<(), ProbeError> {
        let node = AtomicUsize::new(NO_NODE);
        let probed = bounded(self.check_broker(&node)).await;
        let node = node.into_inner();
        if probed.is_err() && node != NO_NODE {
            self.urls.failed(node);
        }
        probed
    }

    /// Stores in `node` the index of the URL it is using.
    async fn check_broker(&self, node: &AtomicUsize) -> Result<(), String> {
        let mut broker = self.broker.lock().await;
        node.store(self.urls.preferred(), Ordering::Relaxed);
        let connection = match broker.take() {
            Some(connection) if connection.status().connected() => connection,
            _ => {
                let connection = self
                    .urls
                    .connect("ecommerce-health")
                    .await
                    .map_err(|e| e.to_string())?;
                // The node that answered.
                node.store(self.urls.preferred(), Ordering::Relaxed);
                connection
            }
        };
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        channel
            .close(200, "OK".into())
            .await
            .map_err(|e| e.to_string())?;
        // Kept only after a successful round trip; a timeout drops it.
        *broker = Some(connection);
        Ok(())
    }
}

async fn bounded(probe: impl Future<Output = Result<(), String>>) -> Result<(), ProbeError> {
    match tokio::time::timeout(PROBE_TIMEOUT, probe).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(detail)) => Err(ProbeError::Failed(detail)),
        Err(_) => Err(ProbeError::Timeout),
    }
}

/// `GET /healthz`: `200 {"status":"ok","database":"ok","broker":"ok"}` when
/// both are reachable, else `503` with an `error` naming what is down and a
/// short reason per dependency (`unreachable` or `timeout`). The endpoint
/// is anonymous: the drivers' error texts (hosts, users, versions) go to the
/// log (a `WARN`), never into the response.
pub async fn healthz(State(state): State<AppState>) -> Response {
    let report = state.health.check().await;
    let show = |probe: &Result<(), ProbeError>| match probe {
        Ok(()) => "ok",
        Err(err) => err.reason(),
    };
    let database = show(&report.database);
    let broker = show(&report.broker);
    if report.is_healthy() {
        return Json(serde_json::json!({ "status": "ok", "database": database, "broker": broker }))
            .into_response();
    }
    let down: Vec<&str> = [
        ("database", report.database.is_err()),
        ("broker", report.broker.is_err()),
    ]
    .into_iter()
    .filter_map(|(name, down)| down.then_some(name))
    .collect();
    let detail = |probe: &Result<(), ProbeError>| match probe {
        Ok(()) => "ok".to_owned(),
        Err(err) => err.to_string(),
    };
    tracing::warn!(
        database = %detail(&report.database),
        broker = %detail(&report.broker),
        "health check failed"
    );
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(serde_json::json!({
            "error": format!("unavailable: {}", down.join(", ")),
            "status": "unavailable",
            "database": database,
            "broker": broker,
        })),
    )
        .into_response()
}

/// `GET /metrics`: every metric of this process in the Prometheus text format.
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}

#[cfg(test)]
mod tests {
    use axum::body::to_bytes;
    use metrics_exporter_prometheus::PrometheusBuilder;

    use super::*;

    /// Nothing listens on port 1: both probes fail fast, and `/healthz`
    /// says which dependency is down, with a short reason and none of the
    /// drivers' error text (which names hosts, ports and users).
    #[tokio::test]
    async fn healthz_is_503_naming_what_is_unreachable_without_error_text() {
        let pool =
            diesel_async::AsyncPgConnection::pool("postgres://health_user@127.0.0.1:1/nothing", 1)
                .unwrap();
        let health = Health::new::<diesel_async::AsyncPgConnection>(
            pool,
            "amqp://guest:guest@127.0.0.1:1/%2f",
        );
        let report = health.check().await;
        assert!(
            matches!(&report.database, Err(ProbeError::Failed(detail)) if !detail.is_empty()),
            "the detail is kept for the log: {report:?}"
        );
        let state = AppState {
            health: std::sync::Arc::new(health),
            metrics: PrometheusBuilder::new().build_recorder().handle(),
        };
        let response = healthz(State(state)).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = to_bytes(response.into_body(), 4096).await.unwrap();
        let text = String::from_utf8_lossy(&body).into_owned();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "error": "unavailable: database, broker",
                "status": "unavailable",
                "database": "unreachable",
                "broker": "unreachable",
            })
        );
        for leak in ["127.0.0.1", "health_user", "refused"] {
            assert!(!text.contains(leak), "{leak:?} in {text}");
        }
    }

    /// The first node of `AMQP_URL` accepts TCP and never answers (frozen):
    /// the first probe times out on it, the next one starts at the second
    /// node (the shared broker) and is healthy. Before, every probe started
    /// at the frozen node and `/healthz` stayed 503.
    #[tokio::test]
    async fn after_a_probe_times_out_on_a_frozen_node_the_next_probe_tries_the_next_node() {
        // Accepted by the kernel, never read: a frozen node.
        let frozen = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let broker = std::env::var("AMQP_URL")
            .unwrap_or_else(|_| crate::config::DEFAULT_AMQP_URL.to_owned());
        let pool =
            diesel_async::AsyncPgConnection::pool("postgres://health_user@127.0.0.1:1/nothing", 1)
                .unwrap();
        let health = Health::new::<diesel_async::AsyncPgConnection>(
            pool,
            format!(
                "amqp://guest:guest@{}/%2f, {broker}",
                frozen.local_addr().unwrap()
            ),
        );
        assert_eq!(health.check().await.broker, Err(ProbeError::Timeout));
        assert_eq!(health.check().await.broker, Ok(()));
        assert_eq!(
            health.check().await.broker,
            Ok(()),
            "the connection is kept"
        );
    }
}
