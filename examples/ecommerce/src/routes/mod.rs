//! The HTTP API (roles `api` and `all`): routes, error mapping, and the
//! middleware around them.

pub mod admin;
pub mod customers;
pub mod error;
pub mod inventory;
pub mod ops;
pub mod orders;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::DefaultBodyLimit;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use outbox::axum::OutboxLayer;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::db::Database;
use crate::telemetry;

pub use error::{ApiError, ApiJson, ApiPath};
pub use ops::Health;

/// The largest request body accepted; larger ones get `413`.
pub const BODY_LIMIT: usize = 64 * 1024;

/// How long a handler may run before it is answered `408` (and its
/// transaction rolled back).
pub const HANDLER_TIMEOUT: Duration = Duration::from_secs(10);

/// What handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    /// Probes for `/healthz`.
    pub health: Arc<Health>,
    /// Renders `/metrics`.
    pub metrics: PrometheusHandle,
}

/// The application: the API routes inside `outbox` (the request's
/// transaction and events), the operations endpoints and the admin API
/// (`admin`, mounted at `/admin` when given: see [`admin`]) outside it.
///
/// Middleware, from the inside out (see the `outbox::axum` docs on layer
/// order): a handler timeout (a `408` rolls back cleanly), the outbox
/// layer, then for every route a body limit, panic catching (a `500`
/// after the outbox layer rolled back) and request tracing (each request in
/// a span continuing the caller's trace: [`telemetry::request_span`]).
pub fn router<C: Database>(state: AppState, outbox: OutboxLayer, admin: Option<Router>) -> Router {
    let api = Router::new()
        .route(
            "/inventory/{sku}",
            get(inventory::get::<C>).put(inventory::put::<C>),
        )
        .route("/orders", post(orders::place::<C>))
        .route("/orders/{id}", get(orders::get::<C>))
        .route("/orders/{id}/pay", post(orders::pay::<C>))
        .route("/orders/{id}/cancel", post(orders::cancel::<C>))
        .route("/customers/{id}/points", get(customers::points::<C>))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            HANDLER_TIMEOUT,
        ))
        .layer(outbox);
    let mut app = Router::new()
        .route("/healthz", get(ops::healthz))
        .route("/metrics", get(ops::metrics))
        .merge(api);
    if let Some(admin) = admin {
        // A finished router (its own state inside): `nest_service`, since
        // `nest` wants a router missing the same state as this one.
        app = app.nest_service("/admin", admin);
    }
    app.fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(CatchPanicLayer::custom(panicked))
        .layer(TraceLayer::new_for_http().make_span_with(telemetry::request_span::<Body>))
        .with_state(state)
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route for {}", uri.path()))
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
}

fn panicked(_panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    // The panic message is already logged by the panic hook.
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response()
}
