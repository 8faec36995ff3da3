//! The inventory: reserves stock for placed orders, releases it for
//! cancelled ones, and tells the world with `inventory.reserved` or
//! `inventory.rejected`, recorded through the outbox in the same
//! transaction as the stock change.

use outbox::postgres::Transaction;
use outbox::rabbitmq::{EventHandler, HandlerError, IncomingEvent};

use super::{payload, unknown_event_type};
use crate::db::Database;
use crate::domain::inventory::{self, ReservationStatus};
use crate::domain::{
    InventoryRejected, InventoryReserved, OrderCancelled, OrderPlaced, ReservedItem,
};

/// The inventory consumer's [`EventHandler`]. It records its events with
/// the back end's default recorder (`Connection::record_event`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Inventory;

impl Inventory {
    /// The consumer's name in the inbox (and in its errors).
    pub const NAME: &'static str = "inventory";

    /// `order.placed`: reserves every item, or none.
    async fn reserve<C: Database>(conn: &mut C, placed: OrderPlaced) -> Result<(), HandlerError> {
        let order_id = placed.order_id;
        if let Some(status) = conn.lock_reservation(order_id).await? {
            // Cancelled before it arrived (`released`), or handled already.
            tracing::info!(%order_id, status = status.as_str(), "order already handled by the inventory");
            return Ok(());
        }
        let demand = inventory::demand(&placed.items).map_err(HandlerError::permanent)?;
        let skus: Vec<&str> = demand.keys().map(String::as_str).collect();
        let stock = conn.lock_stock(&skus).await?;
        match inventory::check(&demand, &stock) {
            Ok(()) => {
                for (sku, &quantity) in &demand {
                    conn.shift_to_reserved(sku, quantity).await?;
                }
                let items: Vec<(&str, i64)> =
                    demand.iter().map(|(sku, &q)| (sku.as_str(), q)).collect();
                conn.insert_reservation(order_id, ReservationStatus::Reserved, None, &items)
                    .await?;
                let reserved = InventoryReserved {
                    order_id,
                    items: demand
                        .into_iter()
                        .map(|(sku, quantity)| ReservedItem { sku, quantity })
                        .collect(),
                };
                conn.record_event(&reserved).await?;
                tracing::info!(%order_id, "stock reserved");
            }
            Err(reason) => {
                conn.insert_reservation(order_id, ReservationStatus::Rejected, Some(&reason), &[])
                    .await?;
                tracing::info!(%order_id, %reason, "order rejected by the inventory");
                conn.record_event(&InventoryRejected { order_id, reason })
                    .await?;
            }
        }
        Ok(())
    }

    /// `order.cancelled`: gives back what was reserved for the order.
    async fn release<C: Database>(
        conn: &mut C,
        cancelled: OrderCancelled,
    ) -> Result<(), HandlerError> {
        let order_id = cancelled.order_id;
        match conn.lock_reservation(order_id).await? {
            Some(ReservationStatus::Reserved) => {
                let items = conn.reservation_items(order_id).await?;
                let skus: Vec<&str> = items.iter().map(|(sku, _)| sku.as_str()).collect();
                conn.lock_stock(&skus).await?;
                for (sku, quantity) in &items {
                    conn.shift_to_reserved(sku, -*quantity).await?;
                }
                conn.set_reservation_status(order_id, ReservationStatus::Released)
                    .await?;
                tracing::info!(%order_id, "stock released");
            }
            Some(ReservationStatus::Rejected | ReservationStatus::Released) => {
                tracing::debug!(%order_id, "nothing reserved for the cancelled order");
            }
            None => {
                // The cancel overtook the order (its `order.placed` is being
                // retried): remember it, so the late event reserves nothing.
                conn.insert_reservation(order_id, ReservationStatus::Released, None, &[])
                    .await?;
                tracing::info!(%order_id, "order cancelled before the inventory saw it");
            }
        }
        Ok(())
    }
}

impl<C: Database> EventHandler<Transaction<C>> for Inventory {
    async fn handle(
        &self,
        tx: &mut Transaction<C>,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        match event.event_type.as_str() {
            OrderPlaced::EVENT_TYPE => {
                Self::reserve(&mut **tx, payload(event, OrderPlaced::SCHEMA_VERSION)?).await
            }
            OrderCancelled::EVENT_TYPE => {
                Self::release(&mut **tx, payload(event, OrderCancelled::SCHEMA_VERSION)?).await
            }
            _ => Err(unknown_event_type(Self::NAME, event)),
        }
    }
}
