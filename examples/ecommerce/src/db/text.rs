//! The shop's queries in plain SQL, for the back ends whose ids are text
//! (MariaDB, SQLite): written once, as a macro that implements
//! [`Orders`](super::Orders), [`Inventory`](super::Inventory) and
//! [`Loyalty`](super::Loyalty) for one connection type with that back
//! end's [`Dialect`]. Both bind with `?`; they differ in row locking, in
//! upsert syntax and in how they say "now".

use diesel::QueryableByName;
use diesel::result::QueryResult;
use diesel::sql_types::{BigInt, Text};
use uuid::Uuid;

use crate::domain::inventory::Stock;
use crate::domain::{LineItem, Order};

/// What differs between the text-id back ends' SQL.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dialect {
    /// Appended to a `SELECT` that locks its rows (`" FOR UPDATE"`, or
    /// nothing where the transaction holds the write lock already).
    pub(crate) lock: &'static str,
    /// The current time, for `updated_at`.
    pub(crate) now: &'static str,
    /// Inserts `(sku, available)` with nothing reserved, or sets the
    /// available units of an existing SKU.
    pub(crate) upsert_stock: &'static str,
    /// Inserts `(customer_id, points)`, or adds the points to an existing
    /// account.
    pub(crate) upsert_points: &'static str,
}

/// An `orders` row.
#[derive(QueryableByName)]
pub(crate) struct OrderRow {
    #[diesel(sql_type = Text)]
    pub(crate) id: String,
    #[diesel(sql_type = Text)]
    pub(crate) customer_id: String,
    #[diesel(sql_type = Text)]
    pub(crate) status: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) total_cents: i64,
}

/// An `order_items` row.
#[derive(QueryableByName)]
pub(crate) struct ItemRow {
    #[diesel(sql_type = Text)]
    pub(crate) sku: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) quantity: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) unit_price_cents: i64,
}

/// An `inventory` row.
#[derive(QueryableByName)]
pub(crate) struct StockRow {
    #[diesel(sql_type = Text)]
    pub(crate) sku: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) available: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) reserved: i64,
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

/// A `reservation_items` row.
#[derive(QueryableByName)]
pub(crate) struct ReservedRow {
    #[diesel(sql_type = Text)]
    pub(crate) sku: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) quantity: i64,
}

/// A `status` column.
#[derive(QueryableByName)]
pub(crate) struct StatusRow {
    #[diesel(sql_type = Text)]
    pub(crate) status: String,
}

/// A `points` column.
#[derive(QueryableByName)]
pub(crate) struct PointsRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) points: i64,
}

/// A `loyalty_awards` row.
#[derive(QueryableByName)]
pub(crate) struct AwardRow {
    #[diesel(sql_type = Text)]
    pub(crate) customer_id: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) points: i64,
    #[diesel(sql_type = Text)]
    pub(crate) status: String,
}

/// A stored id, parsed.
pub(crate) fn uuid(text: &str) -> QueryResult<Uuid> {
    super::parse(text)
}

/// An order from its row and its lines.
pub(crate) fn order(row: OrderRow, items: Vec<ItemRow>) -> QueryResult<Order> {
    Ok(Order {
        id: uuid(&row.id)?,
        customer_id: uuid(&row.customer_id)?,
        status: super::order_status(&row.status)?,
        total_cents: row.total_cents,
        items: items
            .into_iter()
            .map(|item| LineItem {
                sku: item.sku,
                quantity: item.quantity,
                unit_price_cents: item.unit_price_cents,
            })
            .collect(),
    })
}

/// `skus` sorted and without repeats: the order every transaction locks
/// stock rows in, so two of them never wait for each other in a cycle.
pub(crate) fn lock_order(skus: &[&str]) -> Vec<String> {
    let mut sorted: Vec<String> = skus.iter().map(|&sku| sku.to_owned()).collect();
    sorted.sort();
    sorted.dedup();
    sorted
}

/// Implements the shop's query traits for `$conn` with the [`Dialect`]
/// `$dialect`.
macro_rules! text_queries {
    ($conn:ty, $dialect:expr) => {
        const _: () = {
            use diesel::result::QueryResult;
            use diesel::sql_types::{BigInt, Nullable, Text};
            use diesel_async::RunQueryDsl;
            use uuid::Uuid;

            use $crate::db::text::{
                self, AwardRow, ItemRow, OrderRow, PointsRow, ReservedRow, StatusRow, StockRow,
            };
            use $crate::db::{Inventory, Loyalty, Orders};
            use $crate::domain::Order;
            use $crate::domain::inventory::{ReservationStatus, Stock};
            use $crate::domain::loyalty::{Award, AwardStatus};

            const DIALECT: text::Dialect = $dialect;

            async fn find_order(
                conn: &mut $conn,
                id: Uuid,
                lock: &'static str,
            ) -> QueryResult<Option<Order>> {
                let row: Option<OrderRow> = diesel::sql_query(format!(
                    "SELECT id, customer_id, status, total_cents FROM orders WHERE id = ?{lock}"
                ))
                .bind::<Text, _>(id.to_string())
                .load(conn)
                .await?
                .pop();
                let Some(row) = row else {
                    return Ok(None);
                };
                let items: Vec<ItemRow> = diesel::sql_query(
                    "SELECT sku, quantity, unit_price_cents FROM order_items \
                     WHERE order_id = ? ORDER BY line",
                )
                .bind::<Text, _>(id.to_string())
                .load(conn)
                .await?;
                text::order(row, items).map(Some)
            }

            impl Orders for $conn {
                async fn insert_order(&mut self, order: &Order) -> QueryResult<()> {
                    diesel::sql_query(
                        "INSERT INTO orders (id, customer_id, status, total_cents) \
                         VALUES (?, ?, ?, ?)",
                    )
                    .bind::<Text, _>(order.id.to_string())
                    .bind::<Text, _>(order.customer_id.to_string())
                    .bind::<Text, _>(order.status.as_str())
                    .bind::<BigInt, _>(order.total_cents)
                    .execute(self)
                    .await?;
                    for (line, item) in (0_i64..).zip(&order.items) {
                        diesel::sql_query(
                            "INSERT INTO order_items \
                             (order_id, line, sku, quantity, unit_price_cents) \
                             VALUES (?, ?, ?, ?, ?)",
                        )
                        .bind::<Text, _>(order.id.to_string())
                        .bind::<BigInt, _>(line)
                        .bind::<Text, _>(&item.sku)
                        .bind::<BigInt, _>(item.quantity)
                        .bind::<BigInt, _>(item.unit_price_cents)
                        .execute(self)
                        .await?;
                    }
                    Ok(())
                }

                async fn find_order(&mut self, id: Uuid) -> QueryResult<Option<Order>> {
                    find_order(self, id, "").await
                }

                async fn lock_order(&mut self, id: Uuid) -> QueryResult<Option<Order>> {
                    find_order(self, id, DIALECT.lock).await
                }

                async fn update_order_status(
                    &mut self,
                    order: &Order,
                    reason: Option<&str>,
                ) -> QueryResult<()> {
                    let now = DIALECT.now;
                    diesel::sql_query(format!(
                        "UPDATE orders SET status = ?, \
                         rejection_reason = COALESCE(?, rejection_reason), updated_at = {now} \
                         WHERE id = ?"
                    ))
                    .bind::<Text, _>(order.status.as_str())
                    .bind::<Nullable<Text>, _>(reason)
                    .bind::<Text, _>(order.id.to_string())
                    .execute(self)
                    .await?;
                    Ok(())
                }
            }

            impl Inventory for $conn {
                async fn set_available(&mut self, sku: &str, available: i64) -> QueryResult<Stock> {
                    diesel::sql_query(DIALECT.upsert_stock)
                        .bind::<Text, _>(sku)
                        .bind::<BigInt, _>(available)
                        .execute(&mut *self)
                        .await?;
                    let row: StockRow = diesel::sql_query(
                        "SELECT sku, available, reserved FROM inventory WHERE sku = ?",
                    )
                    .bind::<Text, _>(sku)
                    .get_result(self)
                    .await?;
                    Ok(row.into())
                }

                async fn find_stock(&mut self, sku: &str) -> QueryResult<Option<Stock>> {
                    let row: Option<StockRow> = diesel::sql_query(
                        "SELECT sku, available, reserved FROM inventory WHERE sku = ?",
                    )
                    .bind::<Text, _>(sku)
                    .load(self)
                    .await?
                    .pop();
                    Ok(row.map(Stock::from))
                }

                async fn lock_stock(&mut self, skus: &[&str]) -> QueryResult<Vec<Stock>> {
                    let lock = DIALECT.lock;
                    let mut stock = Vec::with_capacity(skus.len());
                    // One row at a time, in SKU order (see `lock_order`).
                    // An invalid SKU (from another producer's event) is
                    // never stored, so it is unknown, as on PostgreSQL;
                    // MariaDB would refuse to compare it with its ASCII
                    // column instead.
                    for sku in text::lock_order(skus)
                        .into_iter()
                        .filter(|sku| $crate::domain::inventory::is_valid_sku(sku))
                    {
                        let row: Option<StockRow> = diesel::sql_query(format!(
                            "SELECT sku, available, reserved FROM inventory WHERE sku = ?{lock}"
                        ))
                        .bind::<Text, _>(sku)
                        .load(&mut *self)
                        .await?
                        .pop();
                        stock.extend(row.map(Stock::from));
                    }
                    Ok(stock)
                }

                async fn shift_to_reserved(&mut self, sku: &str, delta: i64) -> QueryResult<()> {
                    diesel::sql_query(
                        "UPDATE inventory SET available = available - ?, reserved = reserved + ? \
                         WHERE sku = ?",
                    )
                    .bind::<BigInt, _>(delta)
                    .bind::<BigInt, _>(delta)
                    .bind::<Text, _>(sku)
                    .execute(self)
                    .await?;
                    Ok(())
                }

                async fn lock_reservation(
                    &mut self,
                    order_id: Uuid,
                ) -> QueryResult<Option<ReservationStatus>> {
                    let lock = DIALECT.lock;
                    let row: Option<StatusRow> = diesel::sql_query(format!(
                        "SELECT status FROM reservations WHERE order_id = ?{lock}"
                    ))
                    .bind::<Text, _>(order_id.to_string())
                    .load(self)
                    .await?
                    .pop();
                    row.map(|row| $crate::db::parse(&row.status)).transpose()
                }

                async fn insert_reservation(
                    &mut self,
                    order_id: Uuid,
                    status: ReservationStatus,
                    reason: Option<&str>,
                    items: &[(&str, i64)],
                ) -> QueryResult<()> {
                    diesel::sql_query(
                        "INSERT INTO reservations (order_id, status, reason) VALUES (?, ?, ?)",
                    )
                    .bind::<Text, _>(order_id.to_string())
                    .bind::<Text, _>(status.as_str())
                    .bind::<Nullable<Text>, _>(reason)
                    .execute(&mut *self)
                    .await?;
                    for &(sku, quantity) in items {
                        diesel::sql_query(
                            "INSERT INTO reservation_items (order_id, sku, quantity) \
                             VALUES (?, ?, ?)",
                        )
                        .bind::<Text, _>(order_id.to_string())
                        .bind::<Text, _>(sku)
                        .bind::<BigInt, _>(quantity)
                        .execute(&mut *self)
                        .await?;
                    }
                    Ok(())
                }

                async fn reservation_items(
                    &mut self,
                    order_id: Uuid,
                ) -> QueryResult<Vec<(String, i64)>> {
                    let rows: Vec<ReservedRow> = diesel::sql_query(
                        "SELECT sku, quantity FROM reservation_items \
                         WHERE order_id = ? ORDER BY sku",
                    )
                    .bind::<Text, _>(order_id.to_string())
                    .load(self)
                    .await?;
                    Ok(rows.into_iter().map(|row| (row.sku, row.quantity)).collect())
                }

                async fn set_reservation_status(
                    &mut self,
                    order_id: Uuid,
                    status: ReservationStatus,
                ) -> QueryResult<()> {
                    let now = DIALECT.now;
                    diesel::sql_query(format!(
                        "UPDATE reservations SET status = ?, updated_at = {now} WHERE order_id = ?"
                    ))
                    .bind::<Text, _>(status.as_str())
                    .bind::<Text, _>(order_id.to_string())
                    .execute(self)
                    .await?;
                    Ok(())
                }
            }

            impl Loyalty for $conn {
                async fn points(&mut self, customer_id: Uuid) -> QueryResult<i64> {
                    let row: Option<PointsRow> = diesel::sql_query(
                        "SELECT points FROM loyalty_accounts WHERE customer_id = ?",
                    )
                    .bind::<Text, _>(customer_id.to_string())
                    .load(self)
                    .await?
                    .pop();
                    Ok(row.map_or(0, |row| row.points))
                }

                async fn add_points(&mut self, customer_id: Uuid, delta: i64) -> QueryResult<()> {
                    diesel::sql_query(DIALECT.upsert_points)
                        .bind::<Text, _>(customer_id.to_string())
                        .bind::<BigInt, _>(delta)
                        .execute(self)
                        .await?;
                    Ok(())
                }

                async fn lock_award(&mut self, order_id: Uuid) -> QueryResult<Option<Award>> {
                    let lock = DIALECT.lock;
                    let row: Option<AwardRow> = diesel::sql_query(format!(
                        "SELECT customer_id, points, status FROM loyalty_awards \
                         WHERE order_id = ?{lock}"
                    ))
                    .bind::<Text, _>(order_id.to_string())
                    .load(self)
                    .await?
                    .pop();
                    row.map(|row| {
                        Ok(Award {
                            customer_id: text::uuid(&row.customer_id)?,
                            points: row.points,
                            status: $crate::db::parse(&row.status)?,
                        })
                    })
                    .transpose()
                }

                async fn insert_award(&mut self, order_id: Uuid, award: &Award) -> QueryResult<()> {
                    diesel::sql_query(
                        "INSERT INTO loyalty_awards (order_id, customer_id, points, status) \
                         VALUES (?, ?, ?, ?)",
                    )
                    .bind::<Text, _>(order_id.to_string())
                    .bind::<Text, _>(award.customer_id.to_string())
                    .bind::<BigInt, _>(award.points)
                    .bind::<Text, _>(award.status.as_str())
                    .execute(self)
                    .await?;
                    Ok(())
                }

                async fn set_award_status(
                    &mut self,
                    order_id: Uuid,
                    status: AwardStatus,
                ) -> QueryResult<()> {
                    let now = DIALECT.now;
                    diesel::sql_query(format!(
                        "UPDATE loyalty_awards SET status = ?, updated_at = {now} WHERE order_id = ?"
                    ))
                    .bind::<Text, _>(status.as_str())
                    .bind::<Text, _>(order_id.to_string())
                    .execute(self)
                    .await?;
                    Ok(())
                }
            }
        };
    };
}

pub(crate) use text_queries;
