//! `PUT /inventory/{sku}` and `GET /inventory/{sku}`.

use axum::Json;
use outbox::axum::Tx;
use serde::{Deserialize, Serialize};

use super::error::{ApiError, ApiJson, ApiPath};
use crate::db::Database;
use crate::domain::inventory::{MAX_SKU_LEN, Stock, is_valid_sku};

/// Body of `PUT /inventory/{sku}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetStock {
    /// Units that can be ordered, not negative.
    pub available: i64,
}

/// The stock of a SKU as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct StockView {
    /// Stock keeping unit.
    pub sku: String,
    /// Units that can be ordered.
    pub available: i64,
    /// Units reserved for orders.
    pub reserved: i64,
}

impl From<Stock> for StockView {
    fn from(stock: Stock) -> Self {
        StockView {
            sku: stock.sku,
            available: stock.available,
            reserved: stock.reserved,
        }
    }
}

/// `PUT /inventory/{sku}`: creates the SKU or sets its available units;
/// reserved units are unchanged.
///
/// # Errors
/// `400` for a malformed SKU, `422` for a negative quantity.
pub async fn put<C: Database>(
    mut tx: Tx<C>,
    ApiPath(sku): ApiPath<String>,
    ApiJson(body): ApiJson<SetStock>,
) -> Result<Json<StockView>, ApiError> {
    check_sku(&sku)?;
    if body.available < 0 {
        return Err(ApiError::unprocessable(format!(
            "available must not be negative, got {}",
            body.available
        )));
    }
    let stock = tx.set_available(&sku, body.available).await?;
    tracing::info!(%sku, available = stock.available, "stock set");
    Ok(Json(stock.into()))
}

/// `GET /inventory/{sku}`.
///
/// # Errors
/// `400` for a malformed SKU, `404` for an unknown one.
pub async fn get<C: Database>(
    mut tx: Tx<C>,
    ApiPath(sku): ApiPath<String>,
) -> Result<Json<StockView>, ApiError> {
    check_sku(&sku)?;
    let stock = tx
        .find_stock(&sku)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("sku {sku:?} not found")))?;
    Ok(Json(stock.into()))
}

fn check_sku(sku: &str) -> Result<(), ApiError> {
    if is_valid_sku(sku) {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "malformed sku {sku:?}: use 1 to {MAX_SKU_LEN} ASCII letters, digits, '-', '_' or '.'"
        )))
    }
}
