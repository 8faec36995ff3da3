//! Loyalty points per customer, and the award of each paid order, on
//! PostgreSQL.

use diesel::result::QueryResult;
use diesel::upsert::excluded;
use diesel::{ExpressionMethods, OptionalExtension, QueryDsl};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use crate::db::Loyalty;

use super::schema::{loyalty_accounts, loyalty_awards};
use crate::domain::loyalty::{Award, AwardStatus};

impl Loyalty for AsyncPgConnection {
    async fn points(&mut self, customer_id: Uuid) -> QueryResult<i64> {
        let conn = self;
        Ok(loyalty_accounts::table
            .find(customer_id)
            .select(loyalty_accounts::points)
            .first(conn)
            .await
            .optional()?
            .unwrap_or(0))
    }

    /// One atomic statement.
    async fn add_points(&mut self, customer_id: Uuid, delta: i64) -> QueryResult<()> {
        let conn = self;
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

    /// `SELECT … FOR UPDATE`.
    async fn lock_award(&mut self, order_id: Uuid) -> QueryResult<Option<Award>> {
        let conn = self;
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
            let status = crate::db::parse(&status)?;
            Ok(Award {
                customer_id,
                points,
                status,
            })
        })
        .transpose()
    }

    async fn insert_award(&mut self, order_id: Uuid, award: &Award) -> QueryResult<()> {
        let conn = self;
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

    async fn set_award_status(&mut self, order_id: Uuid, status: AwardStatus) -> QueryResult<()> {
        let conn = self;
        diesel::update(loyalty_awards::table.find(order_id))
            .set((
                loyalty_awards::status.eq(status.as_str()),
                loyalty_awards::updated_at.eq(diesel::dsl::now),
            ))
            .execute(conn)
            .await?;
        Ok(())
    }
}
