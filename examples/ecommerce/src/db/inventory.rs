//! Stock per SKU, and what the inventory reserved for each order.

use diesel::pg::Pg;
use diesel::result::QueryResult;
use diesel::upsert::excluded;
use diesel::{
    ExpressionMethods, OptionalExtension, QueryDsl, Queryable, Selectable, SelectableHelper,
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

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

/// Creates `sku` with `available` units, or sets the available units of an
/// existing one (its reserved units are kept). One atomic statement.
///
/// # Errors
/// The query's error.
pub async fn set_available(
    conn: &mut AsyncPgConnection,
    sku: &str,
    available: i64,
) -> QueryResult<Stock> {
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

/// The stock of `sku`, or `None` for an unknown SKU.
///
/// # Errors
/// The query's error.
pub async fn find(conn: &mut AsyncPgConnection, sku: &str) -> QueryResult<Option<Stock>> {
    inventory::table
        .find(sku)
        .select(StockRow::as_select())
        .first(conn)
        .await
        .optional()
        .map(|row| row.map(Stock::from))
}

/// The stock of the known SKUs among `skus`, each row locked (`FOR UPDATE`)
/// in SKU order, so that two reservations touching the same SKUs wait for
/// each other instead of deadlocking.
///
/// # Errors
/// The query's error.
pub async fn lock_stock(conn: &mut AsyncPgConnection, skus: &[&str]) -> QueryResult<Vec<Stock>> {
    inventory::table
        .filter(inventory::sku.eq_any(skus))
        .order(inventory::sku)
        .select(StockRow::as_select())
        .for_update()
        .load(conn)
        .await
        .map(|rows| rows.into_iter().map(Stock::from).collect())
}

/// Moves `quantity` units of `sku` from available to reserved. Call it on
/// rows locked with [`lock_stock`].
///
/// # Errors
/// The query's error; a check violation if fewer units are available.
pub async fn reserve_units(
    conn: &mut AsyncPgConnection,
    sku: &str,
    quantity: i64,
) -> QueryResult<()> {
    shift_to_reserved(conn, sku, quantity).await
}

/// Moves `quantity` units of `sku` from reserved back to available. Call
/// it on rows locked with [`lock_stock`].
///
/// # Errors
/// The query's error; a check violation if fewer units are reserved.
pub async fn release_units(
    conn: &mut AsyncPgConnection,
    sku: &str,
    quantity: i64,
) -> QueryResult<()> {
    shift_to_reserved(conn, sku, -quantity).await
}

async fn shift_to_reserved(conn: &mut AsyncPgConnection, sku: &str, delta: i64) -> QueryResult<()> {
    diesel::update(inventory::table.find(sku))
        .set((
            inventory::available.eq(inventory::available - delta),
            inventory::reserved.eq(inventory::reserved + delta),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

/// What the inventory did for `order_id` so far, its row locked
/// (`FOR UPDATE`); `None` when the order was never seen. (Without a row
/// there is nothing to lock: two transactions then both insert one, and the
/// primary key makes the second fail, roll back and be retried, when it
/// finds the first one's row.)
///
/// # Errors
/// The query's error.
pub async fn lock_reservation(
    conn: &mut AsyncPgConnection,
    order_id: Uuid,
) -> QueryResult<Option<ReservationStatus>> {
    let status: Option<String> = reservations::table
        .find(order_id)
        .select(reservations::status)
        .for_update()
        .first(conn)
        .await
        .optional()?;
    status
        .map(|s| {
            s.parse()
                .map_err(|e| diesel::result::Error::DeserializationError(Box::new(e)))
        })
        .transpose()
}

/// Records what the inventory did for `order_id`, with the stock it holds.
///
/// # Errors
/// The query's error (a unique violation if a row exists already).
pub async fn insert_reservation(
    conn: &mut AsyncPgConnection,
    order_id: Uuid,
    status: ReservationStatus,
    reason: Option<&str>,
    items: &[(&str, i64)],
) -> QueryResult<()> {
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

/// The stock a reservation holds: `(sku, quantity)` in SKU order.
///
/// # Errors
/// The query's error.
pub async fn reservation_items(
    conn: &mut AsyncPgConnection,
    order_id: Uuid,
) -> QueryResult<Vec<(String, i64)>> {
    reservation_items::table
        .filter(reservation_items::order_id.eq(order_id))
        .order(reservation_items::sku)
        .select((reservation_items::sku, reservation_items::quantity))
        .load(conn)
        .await
}

/// Changes the status of a (locked) reservation.
///
/// # Errors
/// The query's error.
pub async fn set_reservation_status(
    conn: &mut AsyncPgConnection,
    order_id: Uuid,
    status: ReservationStatus,
) -> QueryResult<()> {
    diesel::update(reservations::table.find(order_id))
        .set((
            reservations::status.eq(status.as_str()),
            reservations::updated_at.eq(diesel::dsl::now),
        ))
        .execute(conn)
        .await?;
    Ok(())
}
