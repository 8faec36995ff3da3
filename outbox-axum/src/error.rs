//! The crate's [`Error`], the extractors' rejections, and the JSON error
//! responses the layer sends.

use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};

/// Errors of `outbox-axum`, returned by [`Events`](crate::Events),
/// [`raise`](crate::raise) and the admin router's
/// [`build`](crate::admin::AdminRouterBuilder::build).
///
/// It converts into a response (`500` with a JSON body), so a handler may
/// return `Result<_, outbox_axum::Error>` or wrap it in its own error type.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// [`raise`](crate::raise) or [`Events::current`](crate::Events::current)
    /// found no request scope.
    #[error(
        "no outbox request scope: `outbox_axum::raise` was called outside a request served \
         through `OutboxLayer`, or in a task spawned without carrying the scope (carry it with \
         `Events::current()` and `events.scope(future)`)"
    )]
    NoRequestScope,
    /// An event was raised or flushed after the request's transaction was
    /// finished (committed or rolled back).
    #[error(
        "the request is finished: raise events before the handler returns (was an `Events` \
         handle kept in a spawned task that outlived the request?)"
    )]
    RequestFinished,
    /// The event is invalid or its payload failed to serialize.
    #[error(transparent)]
    Event(#[from] outbox_core::Error),
    /// Writing events into the outbox failed.
    #[error(transparent)]
    Store(#[from] outbox_diesel::Error),
    /// The [admin router](crate::admin) cannot be built: no authentication
    /// was chosen, or it is misconfigured (a bearer token too short, one
    /// token for two identities, ...). The message says what to change.
    #[error("the admin API is misconfigured: {0}")]
    AdminConfig(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        if let Error::AdminConfig(_) = self {
            tracing::error!(error = %self, "outbox admin API misconfigured");
            return json_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the admin API is misconfigured",
            );
        }
        tracing::error!(error = %self, "outbox event could not be staged or written");
        json_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the request's events could not be recorded",
        )
    }
}

/// Rejection of the [`Tx`](crate::Tx) extractor.
///
/// | variant | status | when |
/// |---|---|---|
/// | [`Unavailable`](Self::Unavailable) | 503 + `Retry-After` | no connection within the acquire timeout (pool exhausted), or the database is down |
/// | [`MissingLayer`](Self::MissingLayer) | 500 | the route is not wrapped in [`OutboxLayer`](crate::OutboxLayer) |
/// | [`AlreadyExtracted`](Self::AlreadyExtracted) | 500 | a second `Tx` was extracted while the first is alive |
/// | [`Finished`](Self::Finished) | 500 | the request's transaction was already finished |
/// | [`WrongConnection`](Self::WrongConnection) | 500 | `Tx<C>` of another connection type than the layer's |
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TxRejection {
    /// No connection or no `BEGIN` within the acquire timeout, or the
    /// database refused: the service is overloaded or the database is down.
    #[error("database unavailable: {reason}")]
    Unavailable {
        /// What went wrong (pool timeout, connection error).
        reason: String,
        /// The `Retry-After` the client is sent.
        retry_after: Duration,
    },
    /// The request did not pass through an `OutboxLayer`.
    #[error("`Tx` needs `OutboxLayer`: add `.layer(OutboxLayer::new(pool))` to the router")]
    MissingLayer,
    /// `Tx` was extracted twice in one handler (or kept by a middleware
    /// while the handler extracts it). There is one transaction per request:
    /// extract it once and pass `&mut tx` (or `&mut *tx`) down.
    #[error(
        "`Tx` extracted twice in one request: there is one transaction per request, extract \
         it once and pass `&mut tx` down"
    )]
    AlreadyExtracted,
    /// The request's transaction was already committed or rolled back.
    #[error("the request's transaction is already finished")]
    Finished,
    /// The handler asked for a `Tx` of another connection type than the
    /// layer's pool gives (e.g. `Tx` of PostgreSQL, the default, with a
    /// MariaDB pool): name the type, `Tx<AsyncMysqlConnection>`.
    #[error(
        "`Tx<{wanted}>` asked for, but the layer's connections are `{found}`: extract \
         `Tx<{found}>`"
    )]
    WrongConnection {
        /// The connection type the handler asked for.
        wanted: &'static str,
        /// The layer's connection type.
        found: &'static str,
    },
}

impl IntoResponse for TxRejection {
    fn into_response(self) -> Response {
        match &self {
            TxRejection::Unavailable { retry_after, .. } => {
                tracing::warn!(error = %self, "request transaction unavailable");
                unavailable(*retry_after)
            }
            _ => {
                tracing::error!(error = %self, "request transaction misused");
                json_error(StatusCode::INTERNAL_SERVER_ERROR, &self.to_string())
            }
        }
    }
}

/// Rejection of the [`Events`](crate::Events) extractor: the route is not
/// wrapped in [`OutboxLayer`](crate::OutboxLayer). A `500`.
#[derive(Debug, thiserror::Error)]
#[error("`Events` needs `OutboxLayer`: add `.layer(OutboxLayer::new(pool))` to the router")]
#[non_exhaustive]
pub struct MissingLayer;

impl IntoResponse for MissingLayer {
    fn into_response(self) -> Response {
        tracing::error!(error = %self, "outbox extractor used without its layer");
        json_error(StatusCode::INTERNAL_SERVER_ERROR, &self.to_string())
    }
}

/// `{"error": message}` with `status`.
pub(crate) fn json_error(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({ "error": message }).to_string();
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// `503` with `Retry-After` (whole seconds, rounded up, at least 1).
pub(crate) fn unavailable(retry_after: Duration) -> Response {
    let mut response = json_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "the database is unavailable or overloaded; retry later",
    );
    let secs = retry_after
        .as_secs()
        .saturating_add(u64::from(retry_after.subsec_nanos() > 0))
        .max(1);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(secs));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_rounds_retry_after_up_to_whole_seconds() {
        for (given, expected) in [
            (Duration::from_secs(1), "1"),
            (Duration::from_millis(1500), "2"),
            (Duration::ZERO, "1"),
            (Duration::from_secs(30), "30"),
        ] {
            let response = unavailable(given);
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(response.headers()[RETRY_AFTER], expected, "{given:?}");
            assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        }
    }

    #[test]
    fn rejections_map_to_their_status() {
        let busy = TxRejection::Unavailable {
            reason: "pool timeout".into(),
            retry_after: Duration::from_secs(3),
        }
        .into_response();
        assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(busy.headers()[RETRY_AFTER], "3");
        for misuse in [
            TxRejection::MissingLayer,
            TxRejection::AlreadyExtracted,
            TxRejection::Finished,
        ] {
            let response = misuse.into_response();
            assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
            assert!(response.headers().get(RETRY_AFTER).is_none());
        }
        assert_eq!(
            MissingLayer.into_response().status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
