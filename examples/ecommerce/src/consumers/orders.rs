//! The orders service's own consumer (run by the `api` role): marks an
//! order `rejected` when the inventory rejects it, if it is still `placed`.

use outbox::postgres::Transaction;
use outbox::rabbitmq::{EventHandler, HandlerError, IncomingEvent};

use super::{payload, schema_version, unknown_event_type};
use crate::db::Database;
use crate::domain::{InventoryRejected, InventoryReserved};

/// The orders consumer's [`EventHandler`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Orders;

impl Orders {
    /// The consumer's name in the inbox (and in its errors).
    pub const NAME: &'static str = "orders";

    /// `inventory.rejected`: `placed` → `rejected`; any other status stays.
    async fn reject<C: Database>(
        conn: &mut C,
        rejected: InventoryRejected,
    ) -> Result<(), HandlerError> {
        let order_id = rejected.order_id;
        // Locked like every other change to an order.
        let Some(mut order) = conn.lock_order(order_id).await? else {
            tracing::warn!(%order_id, "inventory rejected an unknown order; ignored");
            return Ok(());
        };
        if order.reject() {
            conn.update_order_status(&order, Some(&rejected.reason))
                .await?;
            tracing::info!(%order_id, reason = %rejected.reason, "order rejected");
        } else {
            tracing::info!(%order_id, status = order.status.as_str(), "inventory rejected an order that is no longer placed; it keeps its status");
        }
        Ok(())
    }
}

impl<C: Database> EventHandler<Transaction<C>> for Orders {
    async fn handle(
        &self,
        tx: &mut Transaction<C>,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        match event.event_type.as_str() {
            InventoryRejected::EVENT_TYPE => {
                Self::reject(
                    &mut **tx,
                    payload(event, InventoryRejected::SCHEMA_VERSION)?,
                )
                .await
            }
            // Nothing to do, but only for a version this consumer knows.
            InventoryReserved::EVENT_TYPE => {
                schema_version(event, InventoryReserved::SCHEMA_VERSION)
            }
            _ => Err(unknown_event_type(Self::NAME, event)),
        }
    }
}
