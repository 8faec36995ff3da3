//! The admin router's error responses: `{"error": "..."}` with a status
//! per [`AdminError`] and per rejected request.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use http::header::{HeaderValue, WWW_AUTHENTICATE};
use outbox_core::admin::AdminError;

use crate::error::json_error;

/// A failed admin request, answered as JSON.
#[derive(Debug)]
pub(crate) enum ApiError {
    /// No caller: `401` with `WWW-Authenticate: Bearer`.
    Unauthenticated,
    /// What the admin API refused or failed with.
    Admin(AdminError),
    /// A request the router could not read (`400`, or `415` for a body that
    /// is not declared JSON).
    Request(StatusCode, String),
}

impl ApiError {
    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        ApiError::Request(StatusCode::BAD_REQUEST, message.into())
    }
}

impl From<AdminError> for ApiError {
    fn from(error: AdminError) -> Self {
        ApiError::Admin(error)
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        let status = match rejection {
            // Required, so a browser cannot send the body cross-site without
            // a CORS preflight.
            JsonRejection::MissingJsonContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            JsonRejection::JsonDataError(_) | JsonRejection::JsonSyntaxError(_) => {
                StatusCode::BAD_REQUEST
            }
            ref other => other.status(),
        };
        ApiError::Request(
            status,
            format!("invalid request body: {}", rejection.body_text()),
        )
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::invalid(format!("invalid query string: {}", rejection.body_text()))
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        ApiError::invalid(format!("invalid path: {}", rejection.body_text()))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Unauthenticated => {
                let mut response = json_error(
                    StatusCode::UNAUTHORIZED,
                    "not authenticated: the outbox admin API needs credentials (with bearer \
                     tokens: `Authorization: Bearer <token>`)",
                );
                response.headers_mut().insert(
                    WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"outbox admin\""),
                );
                response
            }
            ApiError::Request(status, message) => json_error(status, &message),
            ApiError::Admin(error) => {
                let status = match &error {
                    AdminError::Invalid(_) => StatusCode::BAD_REQUEST,
                    AdminError::Forbidden { .. } => StatusCode::FORBIDDEN,
                    AdminError::NotFound(_) => StatusCode::NOT_FOUND,
                    AdminError::Conflict(_) => StatusCode::CONFLICT,
                    AdminError::Store(_) => {
                        // The driver's text may name hosts and users: for the
                        // log, not for the client.
                        tracing::error!(error = %error, source = ?std::error::Error::source(&error), "outbox admin: the store failed");
                        return json_error(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "the outbox store failed (see the service's log); retry later",
                        );
                    }
                    AdminError::Broker(_) => {
                        tracing::error!(error = %error, source = ?std::error::Error::source(&error), "outbox admin: the broker failed");
                        return json_error(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "the broker failed (see the service's log); retry later",
                        );
                    }
                    _ => {
                        tracing::error!(error = %error, "outbox admin: unexpected error");
                        StatusCode::INTERNAL_SERVER_ERROR
                    }
                };
                if status == StatusCode::FORBIDDEN {
                    tracing::warn!(error = %error, "outbox admin: forbidden");
                }
                json_error(status, &error.to_string())
            }
        }
    }
}
