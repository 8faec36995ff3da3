//! `GET /customers/{id}/points`.

use axum::Json;
use outbox::axum::Tx;
use serde::Serialize;
use uuid::Uuid;

use super::error::{ApiError, ApiPath};
use crate::db::Database;

/// A customer's loyalty points.
#[derive(Debug, Clone, Serialize)]
pub struct PointsView {
    /// The customer.
    pub customer_id: Uuid,
    /// Their points (0 for a customer never seen).
    pub points: i64,
}

/// `GET /customers/{id}/points`.
///
/// # Errors
/// `400` for a malformed id.
pub async fn points<C: Database>(
    mut tx: Tx<C>,
    ApiPath(customer_id): ApiPath<Uuid>,
) -> Result<Json<PointsView>, ApiError> {
    let points = tx.points(customer_id).await?;
    Ok(Json(PointsView {
        customer_id,
        points,
    }))
}
