//! `POST /orders`, `GET /orders/{id}`, `POST /orders/{id}/pay`,
//! `POST /orders/{id}/cancel`.
//!
//! Each handler works on the request's transaction ([`Tx`]) and raises its
//! event on [`Events`]; the `OutboxLayer` writes the events into the outbox
//! in that same transaction and commits only on a `2xx`. A `404` or `409`
//! rolls everything back, events included.
//!
//! (axum runs the body extractor last, so [`Tx`] is opened before the body
//! is parsed: a malformed body costs a `BEGIN`/`ROLLBACK`, which is cheap.)

use axum::Json;
use axum::http::StatusCode;
use outbox::axum::{Events, Tx};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::error::{ApiError, ApiJson, ApiPath};
use crate::db::Database;
use crate::domain::{LineItem, Order};

/// Body of `POST /orders`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlaceOrder {
    /// Who orders.
    pub customer_id: Uuid,
    /// What, at least one line, each SKU once.
    pub items: Vec<PlaceOrderItem>,
}

/// A line of [`PlaceOrder`].
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlaceOrderItem {
    /// Stock keeping unit.
    pub sku: String,
    /// How many, at least 1.
    pub quantity: i64,
    /// Price of one in cents, not negative.
    pub unit_price_cents: i64,
}

impl From<PlaceOrderItem> for LineItem {
    fn from(item: PlaceOrderItem) -> Self {
        LineItem {
            sku: item.sku,
            quantity: item.quantity,
            unit_price_cents: item.unit_price_cents,
        }
    }
}

/// An order as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct OrderView {
    /// Its id.
    pub id: Uuid,
    /// Who placed it.
    pub customer_id: Uuid,
    /// `placed`, `paid`, `cancelled` or `rejected`.
    pub status: &'static str,
    /// Σ quantity × unit price.
    pub total_cents: i64,
    /// The lines, as placed.
    pub items: Vec<LineItem>,
}

impl From<&Order> for OrderView {
    fn from(order: &Order) -> Self {
        OrderView {
            id: order.id,
            customer_id: order.customer_id,
            status: order.status.as_str(),
            total_cents: order.total_cents,
            items: order.items.clone(),
        }
    }
}

/// The answer to pay and cancel.
#[derive(Debug, Clone, Serialize)]
pub struct StatusView {
    /// The order.
    pub id: Uuid,
    /// Its new status.
    pub status: &'static str,
}

impl From<&Order> for StatusView {
    fn from(order: &Order) -> Self {
        StatusView {
            id: order.id,
            status: order.status.as_str(),
        }
    }
}

/// `POST /orders`: places an order (`201`), raises `order.placed`.
///
/// # Errors
/// `422` for an invalid order.
pub async fn place<C: Database>(
    mut tx: Tx<C>,
    events: Events,
    ApiJson(request): ApiJson<PlaceOrder>,
) -> Result<(StatusCode, Json<OrderView>), ApiError> {
    let items = request.items.into_iter().map(LineItem::from).collect();
    let (order, placed) = Order::place(request.customer_id, items)?;
    tx.insert_order(&order).await?;
    events.raise(placed)?;
    tracing::info!(order_id = %order.id, total_cents = order.total_cents, "order placed");
    Ok((StatusCode::CREATED, Json(OrderView::from(&order))))
}

/// `GET /orders/{id}`.
///
/// # Errors
/// `404` for an unknown order.
pub async fn get<C: Database>(
    mut tx: Tx<C>,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<OrderView>, ApiError> {
    let order = tx.find_order(id).await?.ok_or_else(|| not_found(id))?;
    Ok(Json(OrderView::from(&order)))
}

/// `POST /orders/{id}/pay`: `placed` → `paid`, raises `order.paid`.
///
/// # Errors
/// `404` for an unknown order, `409` unless it is `placed`.
pub async fn pay<C: Database>(
    mut tx: Tx<C>,
    events: Events,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<StatusView>, ApiError> {
    let mut order = tx.lock_order(id).await?.ok_or_else(|| not_found(id))?;
    let paid = order.pay()?;
    tx.update_order_status(&order, None).await?;
    events.raise(paid)?;
    tracing::info!(order_id = %id, "order paid");
    Ok(Json(StatusView::from(&order)))
}

/// `POST /orders/{id}/cancel`: `placed` or `paid` → `cancelled`, raises
/// `order.cancelled`.
///
/// # Errors
/// `404` for an unknown order, `409` if it is `cancelled` or `rejected`.
pub async fn cancel<C: Database>(
    mut tx: Tx<C>,
    events: Events,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<StatusView>, ApiError> {
    let mut order = tx.lock_order(id).await?.ok_or_else(|| not_found(id))?;
    let cancelled = order.cancel()?;
    tx.update_order_status(&order, None).await?;
    tracing::info!(order_id = %id, was_paid = cancelled.was_paid, "order cancelled");
    events.raise(cancelled)?;
    Ok(Json(StatusView::from(&order)))
}

fn not_found(id: Uuid) -> ApiError {
    ApiError::not_found(format!("order {id} not found"))
}
