//! The outbox's delivery order (per aggregate or unordered): read and
//! changed by an operator, and cached for claims (re-read at most once a
//! second).

use std::time::{Duration, Instant};

use diesel::sql_types::Text;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use outbox_core::DeliveryOrder;

use super::PgOutboxStore;
use super::row::OrderRow;
use crate::prepared::PreparedExt;
use crate::schema::Schema;
use crate::{Error, Result};

/// How long a claim trusts the delivery order it read last.
const ORDER_CACHE_TTL: Duration = Duration::from_secs(1);

/// The delivery order stored as `value` (its [`DeliveryOrder::as_str`]) in
/// `schema`, or [`Error::UnknownDeliveryOrder`] naming both.
pub(super) fn order_from_db(schema: &Schema, value: &str) -> Result<DeliveryOrder> {
    value
        .parse::<DeliveryOrder>()
        .map_err(|_| Error::UnknownDeliveryOrder {
            schema: schema.name().to_owned(),
            value: value.to_owned(),
        })
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
        let result = diesel::sql_query(&self.sql.get_order)
            .prepared(self.prepare)
            .get_result(&mut *conn)
            .await;
        let row: OrderRow = self.checked(conn, result)?;
        order_from_db(&self.schema, &row.delivery_order)
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
        let result = async {
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
            Ok(())
        }
        .await;
        self.checked(conn, result)?;
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
            .prepared(self.prepare)
            .get_result(conn)
            .await?;
        let order = order_from_db(&self.schema, &row.delivery_order)?;
        *self
            .order_cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((order, Instant::now()));
        Ok(order)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_orders_are_read() -> Result<()> {
        let schema = Schema::default();
        for order in DeliveryOrder::ALL {
            assert_eq!(order_from_db(&schema, order.as_str())?, order);
        }
        Ok(())
    }

    #[test]
    fn an_unknown_stored_order_is_its_own_error() -> Result<()> {
        let schema = Schema::new("billing")?;
        let err = order_from_db(&schema, "Unordered").unwrap_err();
        assert!(
            matches!(&err, Error::UnknownDeliveryOrder { schema, value }
                if schema == "billing" && value == "Unordered"),
            "{err:?}"
        );
        let message = err.to_string();
        assert!(
            message.contains("\"billing\"") && message.contains("\"Unordered\""),
            "{message}"
        );
        assert!(message.contains("set_delivery_order"), "{message}");
        Ok(())
    }
}
