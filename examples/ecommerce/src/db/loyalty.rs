//! Loyalty points per customer, and the award of each paid order.

use diesel::result::QueryResult;
use diesel::upsert::excluded;
use diesel::{ExpressionMethods, OptionalExtension, QueryDsl};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::schema::{loyalty_accounts, loyalty_awards};
use crate::domain::loyalty::{Award, AwardStatus};

/// The points of `customer_id` (0 for a customer never seen).
///
/// # Errors
/// The query's error.
pub async fn points(conn: &mut AsyncPgConnection, customer_id: Uuid) -> QueryResult<i64> {
    Ok(loyalty_accounts::table
        .find(customer_id)
        .select(loyalty_accounts::points)
        .first(conn)
        .await
        .optional()?
        .unwrap_or(0))
}

/// Adds `delta` (negative to take back) to the points of `customer_id`,
/// creating the account if needed. One atomic statement, which locks the
/// account row until the transaction ends.
///
/// # Errors
/// The query's error.
pub async fn add_points(
    conn: &mut AsyncPgConnection,
    customer_id: Uuid,
    delta: i64,
) -> QueryResult<()> {
    diesel::insert_into(loyalty_accounts::table)
        .values((
            loyalty_accounts::customer_id.eq(customer_id),
            loyalty_accounts::points.eq(delta),
        ))
        .on_conflict(loyalty_accounts::customer_id)
        .do_update()
        .set(
            loyalty_accounts::points
                .eq(loyalty_accounts::points + excluded(loyalty_accounts::points)),
        )
        .execute(conn)
        .await?;
    Ok(())
}

/// The award of `order_id`, its row locked (`FOR UPDATE`), or `None` when
/// there is none yet (see `inventory::lock_reservation` for why the
/// primary key then serializes concurrent writers).
///
/// # Errors
/// The query's error.
pub async fn lock_award(
    conn: &mut AsyncPgConnection,
    order_id: Uuid,
) -> QueryResult<Option<Award>> {
    let row: Option<(Uuid, i64, String)> = loyalty_awards::table
        .find(order_id)
        .select((
            loyalty_awards::customer_id,
            loyalty_awards::points,
            loyalty_awards::status,
        ))
        .for_update()
        .first(conn)
        .await
        .optional()?;
    row.map(|(customer_id, points, status)| {
        let status = status
            .parse()
            .map_err(|e| diesel::result::Error::DeserializationError(Box::new(e)))?;
        Ok(Award {
            customer_id,
            points,
            status,
        })
    })
    .transpose()
}

/// Records the award of `order_id`.
///
/// # Errors
/// The query's error (a unique violation if one exists already).
pub async fn insert_award(
    conn: &mut AsyncPgConnection,
    order_id: Uuid,
    award: &Award,
) -> QueryResult<()> {
    diesel::insert_into(loyalty_awards::table)
        .values((
            loyalty_awards::order_id.eq(order_id),
            loyalty_awards::customer_id.eq(award.customer_id),
            loyalty_awards::points.eq(award.points),
            loyalty_awards::status.eq(award.status.as_str()),
        ))
        .execute(conn)
        .await?;
    Ok(())
}

/// Changes the status of a (locked) award.
///
/// # Errors
/// The query's error.
pub async fn set_award_status(
    conn: &mut AsyncPgConnection,
    order_id: Uuid,
    status: AwardStatus,
) -> QueryResult<()> {
    diesel::update(loyalty_awards::table.find(order_id))
        .set((
            loyalty_awards::status.eq(status.as_str()),
            loyalty_awards::updated_at.eq(diesel::dsl::now),
        ))
        .execute(conn)
        .await?;
    Ok(())
}
