//! The inventory: reserves stock for placed orders, releases it for
//! cancelled ones, and tells the world with `inventory.reserved` or
//! `inventory.rejected`, recorded through the outbox in the same
//! transaction as the stock change.

use diesel_async::AsyncPgConnection;
use outbox::postgres::{Outbox, PgTransaction};
use outbox::rabbitmq::{EventHandler, HandlerError, IncomingEvent};

use super::{payload, unknown_event_type};
use crate::db;
use crate::domain::inventory::{self, ReservationStatus};
use crate::domain::{
    InventoryRejected, InventoryReserved, OrderCancelled, OrderPlaced, ReservedItem,
};

/// The inventory consumer's [`EventHandler`].
#[derive(Debug, Clone, Default)]
pub struct Inventory {
    outbox: Outbox,
}

impl Inventory {
    /// The consumer's name in the inbox (and in its errors).
    pub const NAME: &'static str = "inventory";

    /// Records its events in `outbox`.
    pub fn new(outbox: Outbox) -> Self {
        Inventory { outbox }
    }

    /// `order.placed`: reserves every item, or none.
    async fn reserve(
        &self,
        conn: &mut AsyncPgConnection,
        placed: OrderPlaced,
    ) -> Result<(), HandlerError> {
        let order_id = placed.order_id;
        if let Some(status) = db::inventory::lock_reservation(conn, order_id).await? {
            // Cancelled before it arrived (`released`), or handled already.
            tracing::info!(%order_id, status = status.as_str(), "order already handled by the inventory");
            return Ok(());
        }
        let demand = inventory::demand(&placed.items).map_err(HandlerError::permanent)?;
        let skus: Vec<&str> = demand.keys().map(String::as_str).collect();
        let stock = db::inventory::lock_stock(conn, &skus).await?;
        match inventory::check(&demand, &stock) {
            Ok(()) => {
                for (sku, &quantity) in &demand {
                    db::inventory::reserve_units(conn, sku, quantity).await?;
                }
                let items: Vec<(&str, i64)> =
                    demand.iter().map(|(sku, &q)| (sku.as_str(), q)).collect();
                db::inventory::insert_reservation(
                    conn,
                    order_id,
                    ReservationStatus::Reserved,
                    None,
                    &items,
                )
                .await?;
                let reserved = InventoryReserved {
                    order_id,
                    items: demand
                        .into_iter()
                        .map(|(sku, quantity)| ReservedItem { sku, quantity })
                        .collect(),
                };
                self.outbox.record(conn, &reserved).await?;
                tracing::info!(%order_id, "stock reserved");
            }
            Err(reason) => {
                db::inventory::insert_reservation(
                    conn,
                    order_id,
                    ReservationStatus::Rejected,
                    Some(&reason),
                    &[],
                )
                .await?;
                tracing::info!(%order_id, %reason, "order rejected by the inventory");
                self.outbox
                    .record(conn, &InventoryRejected { order_id, reason })
                    .await?;
            }
        }
        Ok(())
    }

    /// `order.cancelled`: gives back what was reserved for the order.
    async fn release(
        &self,
        conn: &mut AsyncPgConnection,
        cancelled: OrderCancelled,
    ) -> Result<(), HandlerError> {
        let order_id = cancelled.order_id;
        match db::inventory::lock_reservation(conn, order_id).await? {
            Some(ReservationStatus::Reserved) => {
                let items = db::inventory::reservation_items(conn, order_id).await?;
                let skus: Vec<&str> = items.iter().map(|(sku, _)| sku.as_str()).collect();
                db::inventory::lock_stock(conn, &skus).await?;
                for (sku, quantity) in &items {
                    db::inventory::release_units(conn, sku, *quantity).await?;
                }
                db::inventory::set_reservation_status(conn, order_id, ReservationStatus::Released)
                    .await?;
                tracing::info!(%order_id, "stock released");
            }
            Some(ReservationStatus::Rejected | ReservationStatus::Released) => {
                tracing::debug!(%order_id, "nothing reserved for the cancelled order");
            }
            None => {
                // The cancel overtook the order (its `order.placed` is being
                // retried): remember it, so the late event reserves nothing.
                db::inventory::insert_reservation(
                    conn,
                    order_id,
                    ReservationStatus::Released,
                    None,
                    &[],
                )
                .await?;
                tracing::info!(%order_id, "order cancelled before the inventory saw it");
            }
        }
        Ok(())
    }
}

impl EventHandler<PgTransaction> for Inventory {
    async fn handle(
        &self,
        tx: &mut PgTransaction,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        match event.event_type.as_str() {
            OrderPlaced::EVENT_TYPE => {
                self.reserve(tx, payload(event, OrderPlaced::SCHEMA_VERSION)?)
                    .await
            }
            OrderCancelled::EVENT_TYPE => {
                self.release(tx, payload(event, OrderCancelled::SCHEMA_VERSION)?)
                    .await
            }
            _ => Err(unknown_event_type(Self::NAME, event)),
        }
    }
}
