//! The outbox's delivery order (per aggregate or unordered): read and
//! changed by an operator, and cached for claims (re-read at most once a
//! second).

use std::time::{Duration, Instant};

use diesel::sql_types::Text;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_core::DeliveryOrder;

use super::PgOutboxStore;
use super::row::OrderRow;
use crate::Result;
use crate::prepared::PreparedExt;

/// How long a claim trusts the delivery order it read last.
const ORDER_CACHE_TTL: Duration = Duration::from_secs(1);

/// The delivery order stored as `value` (its [`DeliveryOrder::as_str`]).
pub(super) fn order_from_db(value: &str) -> Result<DeliveryOrder> {
    Ok(value.parse::<DeliveryOrder>()?)
}

impl PgOutboxStore {
    /// The delivery order every relay on this outbox obeys.
    ///
    /// # Errors
    /// [`Error::Database`] or [`Error::Pool`].
    ///
    /// [`Error::Database`]: crate::Error::Database
    /// [`Error::Pool`]: crate::Error::Pool
    pub async fn delivery_order(&self) -> Result<DeliveryOrder> {
        let mut conn = self.conn().await?;
        let row: OrderRow = diesel::sql_query(&self.sql.get_order)
            .prepared(self.sql.prepare)
            .get_result(&mut *conn)
            .await?;
        order_from_db(&row.delivery_order)
    }

    /// Changes the delivery order of this outbox (for every relay on it).
    ///
    /// # Errors
    /// [`Error::Database`] or [`Error::Pool`].
    ///
    /// [`Error::Database`]: crate::Error::Database
    /// [`Error::Pool`]: crate::Error::Pool
    pub async fn set_delivery_order(&self, order: DeliveryOrder) -> Result<()> {
        let mut conn = self.conn().await?;
        diesel::sql_query(&self.sql.set_order)
            .bind::<Text, _>(order.as_str())
            .execute(&mut *conn)
            .await?;
        if order == DeliveryOrder::Unordered {
            // Nothing waits behind another event any more.
            diesel::sql_query(&self.sql.release_unordered)
                .execute(&mut *conn)
                .await?;
        }
        *self
            .order_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        Ok(())
    }

    /// The delivery order, from a cache refreshed at most once a second (a
    /// change by [`set_delivery_order`](Self::set_delivery_order) reaches
    /// every relay within that second).
    pub(super) async fn cached_order(&self, conn: &mut AsyncPgConnection) -> Result<DeliveryOrder> {
        let cached = *self
            .order_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((order, read_at)) = cached
            && read_at.elapsed() < ORDER_CACHE_TTL
        {
            return Ok(order);
        }
        let row: OrderRow = diesel::sql_query(&self.sql.get_order)
            .prepared(self.sql.prepare)
            .get_result(conn)
            .await?;
        let order = order_from_db(&row.delivery_order)?;
        *self
            .order_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((order, Instant::now()));
        Ok(order)
    }
}
