//! Orders and their lines on PostgreSQL.

use diesel::pg::Pg;
use diesel::result::QueryResult;
use diesel::{
    ExpressionMethods, Insertable, OptionalExtension, QueryDsl, Queryable, Selectable,
    SelectableHelper,
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::db::Orders;
use uuid::Uuid;

use super::schema::{order_items, orders};
use crate::domain::{LineItem, Order};

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

impl Orders for AsyncPgConnection {
    async fn insert_order(&mut self, order: &Order) -> QueryResult<()> {
        let conn = self;
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

    async fn find_order(&mut self, id: Uuid) -> QueryResult<Option<Order>> {
        let conn = self;
        let row = orders::table
            .find(id)
            .select(OrderRow::as_select())
            .first(conn)
            .await
            .optional()?;
        with_items(conn, row).await
    }

    /// `SELECT … FOR UPDATE`.
    async fn lock_order(&mut self, id: Uuid) -> QueryResult<Option<Order>> {
        let conn = self;
        let row = orders::table
            .find(id)
            .select(OrderRow::as_select())
            .for_update()
            .first(conn)
            .await
            .optional()?;
        with_items(conn, row).await
    }

    async fn update_order_status(
        &mut self,
        order: &Order,
        reason: Option<&str>,
    ) -> QueryResult<()> {
        let target = diesel::update(orders::table.find(order.id));
        let status = (
            orders::status.eq(order.status.as_str()),
            orders::updated_at.eq(diesel::dsl::now),
        );
        match reason {
            Some(reason) => {
                target
                    .set((status, orders::rejection_reason.eq(reason)))
                    .execute(self)
                    .await?
            }
            None => target.set(status).execute(self).await?,
        };
        Ok(())
    }
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
    let status = crate::db::order_status(&row.status)?;
    Ok(Some(Order {
        id: row.id,
        customer_id: row.customer_id,
        status,
        total_cents: row.total_cents,
        items,
    }))
}
