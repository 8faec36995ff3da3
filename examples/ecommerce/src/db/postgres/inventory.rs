//! Stock per SKU, and what the inventory reserved for each order, on
//! PostgreSQL.

use diesel::pg::Pg;
use diesel::result::QueryResult;
use diesel::upsert::excluded;
use diesel::{
    ExpressionMethods, OptionalExtension, QueryDsl, Queryable, Selectable, SelectableHelper,
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use crate::db::Inventory;

use super::schema::{inventory, reservation_items, reservations};
use crate::domain::inventory::{ReservationStatus, Stock};

#[derive(Queryable, Selectable)]
#[diesel(table_name = inventory, check_for_backend(Pg))]
struct StockRow {
    sku: String,
    available: i64,
    reserved: i64,
}

impl From<StockRow> for Stock {
    fn from(row: StockRow) -> Self {
        Stock {
            sku: row.sku,
            available: row.available,
            reserved: row.reserved,
        }
    }
}

impl Inventory for AsyncPgConnection {
    /// One atomic statement.
    async fn set_available(&mut self, sku: &str, available: i64) -> QueryResult<Stock> {
        let conn = self;
        diesel::insert_into(inventory::table)
            .values((
                inventory::sku.eq(sku),
                inventory::available.eq(available),
                inventory::reserved.eq(0),
            ))
            .on_conflict(inventory::sku)
            .do_update()
            .set(inventory::available.eq(excluded(inventory::available)))
            .returning(StockRow::as_returning())
            .get_result(conn)
            .await
            .map(Stock::from)
    }

    async fn find_stock(&mut self, sku: &str) -> QueryResult<Option<Stock>> {
        let conn = self;
        inventory::table
            .find(sku)
            .select(StockRow::as_select())
            .first(conn)
            .await
            .optional()
            .map(|row| row.map(Stock::from))
    }

    /// `SELECT … ORDER BY sku FOR UPDATE`.
    async fn lock_stock(&mut self, skus: &[&str]) -> QueryResult<Vec<Stock>> {
        let conn = self;
        inventory::table
            .filter(inventory::sku.eq_any(skus))
            .order(inventory::sku)
            .select(StockRow::as_select())
            .for_update()
            .load(conn)
            .await
            .map(|rows| rows.into_iter().map(Stock::from).collect())
    }

    async fn shift_to_reserved(&mut self, sku: &str, delta: i64) -> QueryResult<()> {
        let conn = self;
        diesel::update(inventory::table.find(sku))
            .set((
                inventory::available.eq(inventory::available - delta),
                inventory::reserved.eq(inventory::reserved + delta),
            ))
            .execute(conn)
            .await?;
        Ok(())
    }

    /// `SELECT … FOR UPDATE`.
    async fn lock_reservation(&mut self, order_id: Uuid) -> QueryResult<Option<ReservationStatus>> {
        let conn = self;
        let status: Option<String> = reservations::table
            .find(order_id)
            .select(reservations::status)
            .for_update()
            .first(conn)
            .await
            .optional()?;
        status.map(|s| crate::db::parse(&s)).transpose()
    }

    async fn insert_reservation(
        &mut self,
        order_id: Uuid,
        status: ReservationStatus,
        reason: Option<&str>,
        items: &[(&str, i64)],
    ) -> QueryResult<()> {
        let conn = self;
        diesel::insert_into(reservations::table)
            .values((
                reservations::order_id.eq(order_id),
                reservations::status.eq(status.as_str()),
                reservations::reason.eq(reason),
            ))
            .execute(conn)
            .await?;
        if !items.is_empty() {
            let rows: Vec<_> = items
                .iter()
                .map(|&(sku, quantity)| {
                    (
                        reservation_items::order_id.eq(order_id),
                        reservation_items::sku.eq(sku),
                        reservation_items::quantity.eq(quantity),
                    )
                })
                .collect();
            diesel::insert_into(reservation_items::table)
                .values(&rows)
                .execute(conn)
                .await?;
        }
        Ok(())
    }

    async fn reservation_items(&mut self, order_id: Uuid) -> QueryResult<Vec<(String, i64)>> {
        let conn = self;
        reservation_items::table
            .filter(reservation_items::order_id.eq(order_id))
            .order(reservation_items::sku)
            .select((reservation_items::sku, reservation_items::quantity))
            .load(conn)
            .await
    }

    async fn set_reservation_status(
        &mut self,
        order_id: Uuid,
        status: ReservationStatus,
    ) -> QueryResult<()> {
        let conn = self;
        diesel::update(reservations::table.find(order_id))
            .set((
                reservations::status.eq(status.as_str()),
                reservations::updated_at.eq(diesel::dsl::now),
            ))
            .execute(conn)
            .await?;
        Ok(())
    }
}
