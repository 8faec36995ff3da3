//! Orders and their lines.

use diesel::pg::Pg;
use diesel::result::QueryResult;
use diesel::{
    ExpressionMethods, Insertable, OptionalExtension, QueryDsl, Queryable, Selectable,
    SelectableHelper,
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::schema::{order_items, orders};
use crate::domain::{LineItem, Order, OrderStatus};

#[derive(Queryable, Selectable)]
#[diesel(table_name = orders, check_for_backend(Pg))]
struct OrderRow {
    id: Uuid,
    customer_id: Uuid,
    status: String,
    total_cents: i64,
}

#[derive(Queryable, Selectable, Insertable)]
#[diesel(table_name = order_items, check_for_backend(Pg))]
struct ItemRow {
    order_id: Uuid,
    line: i32,
    sku: String,
    quantity: i64,
    unit_price_cents: i64,
}

/// Inserts a new order and its lines.
///
/// # Errors
/// The query's error.
pub async fn insert(conn: &mut AsyncPgConnection, order: &Order) -> QueryResult<()> {
    diesel::insert_into(orders::table)
        .values((
            orders::id.eq(order.id),
            orders::customer_id.eq(order.customer_id),
            orders::status.eq(order.status.as_str()),
            orders::total_cents.eq(order.total_cents),
        ))
        .execute(conn)
        .await?;
    let items: Vec<ItemRow> = (0..)
        .zip(&order.items)
        .map(|(line, item)| ItemRow {
            order_id: order.id,
            line,
            sku: item.sku.clone(),
            quantity: item.quantity,
            unit_price_cents: item.unit_price_cents,
        })
        .collect();
    diesel::insert_into(order_items::table)
        .values(&items)
        .execute(conn)
        .await?;
    Ok(())
}

/// The order `id`, or `None`.
///
/// # Errors
/// The query's error.
pub async fn find(conn: &mut AsyncPgConnection, id: Uuid) -> QueryResult<Option<Order>> {
    let row = orders::table
        .find(id)
        .select(OrderRow::as_select())
        .first(conn)
        .await
        .optional()?;
    with_items(conn, row).await
}

/// The order `id`, its row locked (`FOR UPDATE`) until the transaction
/// ends: every change to an order goes through here, so changes to one
/// order (and the events they record) are serialized.
///
/// # Errors
/// The query's error.
pub async fn find_for_update(conn: &mut AsyncPgConnection, id: Uuid) -> QueryResult<Option<Order>> {
    let row = orders::table
        .find(id)
        .select(OrderRow::as_select())
        .for_update()
        .first(conn)
        .await
        .optional()?;
    with_items(conn, row).await
}

async fn with_items(
    conn: &mut AsyncPgConnection,
    row: Option<OrderRow>,
) -> QueryResult<Option<Order>> {
    let Some(row) = row else {
        return Ok(None);
    };
    let items = order_items::table
        .filter(order_items::order_id.eq(row.id))
        .order(order_items::line)
        .select(ItemRow::as_select())
        .load(conn)
        .await?
        .into_iter()
        .map(|item| LineItem {
            sku: item.sku,
            quantity: item.quantity,
            unit_price_cents: item.unit_price_cents,
        })
        .collect();
    let status: OrderStatus = row
        .status
        .parse()
        .map_err(|e| diesel::result::Error::DeserializationError(Box::new(e)))?;
    Ok(Some(Order {
        id: row.id,
        customer_id: row.customer_id,
        status,
        total_cents: row.total_cents,
        items,
    }))
}

/// Stores the order's status (after a transition on a locked order).
///
/// # Errors
/// The query's error.
pub async fn update_status(conn: &mut AsyncPgConnection, order: &Order) -> QueryResult<()> {
    diesel::update(orders::table.find(order.id))
        .set((
            orders::status.eq(order.status.as_str()),
            orders::updated_at.eq(diesel::dsl::now),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

/// Stores a rejected order's status and the inventory's reason.
///
/// # Errors
/// The query's error.
pub async fn update_rejected(
    conn: &mut AsyncPgConnection,
    order: &Order,
    reason: &str,
) -> QueryResult<()> {
    diesel::update(orders::table.find(order.id))
        .set((
            orders::status.eq(order.status.as_str()),
            orders::rejection_reason.eq(reason),
            orders::updated_at.eq(diesel::dsl::now),
        ))
        .execute(conn)
        .await?;
    Ok(())
}
