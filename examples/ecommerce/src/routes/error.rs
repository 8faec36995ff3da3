//! How the API fails: [`ApiError`] (always `{"error": "..."}`), and the
//! extractors [`ApiJson`] and [`ApiPath`], which turn axum's rejections into
//! it with the status the contract names.
//!
//! | what is wrong | status |
//! |---|---|
//! | body is not JSON (syntax) | 400 |
//! | `Content-Type` is not `application/json` | 415 |
//! | body is JSON but the wrong shape, an unknown field, an invalid value | 422 |
//! | body larger than the limit | 413 |
//! | an id in the path that does not parse | 400 |
//! | no such order / SKU | 404 |
//! | the order's status does not allow it | 409 |
//! | the database is down or the pool exhausted | 503 (from `outbox::axum::Tx`) |
//! | anything else | 500, details only in the log |

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use crate::domain::{InvalidOrder, StatusConflict};

/// An error response: a status and a message, sent as `{"error": message}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    /// An error with `status` and `message`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    /// `400 Bad Request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// `404 Not Found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// `422 Unprocessable Entity`: well-formed JSON with invalid data.
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, message)
    }

    /// `500`: logs `error` (with its sources) and tells the client nothing
    /// more than that it failed.
    pub fn internal(error: &(dyn std::error::Error + 'static)) -> Self {
        tracing::error!(error = %crate::error_chain(error), "request failed");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
    }

    /// The status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(serde_json::json!({ "error": self.message })),
        )
            .into_response()
    }
}

impl From<diesel::result::Error> for ApiError {
    fn from(error: diesel::result::Error) -> Self {
        ApiError::internal(&error)
    }
}

impl From<outbox::axum::Error> for ApiError {
    fn from(error: outbox::axum::Error) -> Self {
        ApiError::internal(&error)
    }
}

impl From<InvalidOrder> for ApiError {
    fn from(error: InvalidOrder) -> Self {
        ApiError::unprocessable(error.to_string())
    }
}

impl From<StatusConflict> for ApiError {
    fn from(error: StatusConflict) -> Self {
        ApiError::new(StatusCode::CONFLICT, error.to_string())
    }
}

/// `Json<T>` whose rejections are [`ApiError`]s: 400 for a syntax error,
/// 415 for a missing or wrong `Content-Type`, 422 for valid JSON that does
/// not fit `T` (missing or unknown fields, wrong types), 413 for a body over
/// the limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(json_rejection(&rejection)),
        }
    }
}

fn json_rejection(rejection: &JsonRejection) -> ApiError {
    // axum already picks the statuses of the table above; keep its message.
    ApiError::new(rejection.status(), rejection.body_text())
}

/// `Path<T>` whose rejections are [`ApiError`]s: a segment that does not
/// parse as `T` (e.g. a malformed UUID) is a `400`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiPath<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(ApiPath(value)),
            Err(rejection) => Err(path_rejection(&rejection)),
        }
    }
}

fn path_rejection(rejection: &PathRejection) -> ApiError {
    let status = rejection.status();
    if status.is_server_error() {
        // A route whose pattern does not match its extractor: our bug.
        return ApiError::internal(rejection);
    }
    ApiError::new(
        StatusCode::BAD_REQUEST,
        format!("malformed path: {}", rejection.body_text()),
    )
}

#[cfg(test)]
mod tests {
    use axum::body::to_bytes;

    use super::*;

    #[tokio::test]
    async fn errors_are_json_objects_with_an_error_key() {
        let response = ApiError::not_found("order 1 not found").into_response();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            response.headers()["content-type"],
            "application/json",
            "JSON content type"
        );
        let body = to_bytes(response.into_body(), 1024).await.unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
            serde_json::json!({"error": "order 1 not found"})
        );
    }

    #[test]
    fn domain_errors_map_to_their_status() {
        assert_eq!(
            ApiError::from(InvalidOrder::NoItems).status(),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        let conflict = StatusConflict {
            order_id: uuid::Uuid::nil(),
            status: crate::domain::OrderStatus::Paid,
            rule: "only placed orders can be paid",
        };
        assert_eq!(ApiError::from(conflict).status(), StatusCode::CONFLICT);
    }
}
