//! `explain_claim`: the plan of the statement a claim runs now, as the
//! relay's claims run it, for diagnosing claim cost.

use diesel_async::pooled_connection::deadpool::Object;
use diesel_async::{
    AnsiTransactionManager, RunQueryDsl, SimpleAsyncConnection, TransactionManager,
};
use outbox_core::DeliveryOrder;

use super::PgOutboxStore;
use super::order::order_from_db;
use super::row::OrderRow;
use crate::Result;
use crate::prepared::PreparedExt;
use crate::sql::{CLAIM_BEGIN, ExplainSql};

impl PgOutboxStore {
    /// `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)` of the one statement a claim
    /// of `limit` events runs now (in the outbox's current delivery order),
    /// with the generic plan the relay's claims use, for diagnosing claim
    /// cost (as a claim of no relay: no relay's pause stops it). Runs in a transaction that is rolled back, so nothing stays
    /// claimed.
    ///
    /// # Errors
    /// [`Error::Database`] or [`Error::Pool`].
    ///
    /// [`Error::Database`]: crate::Error::Database
    /// [`Error::Pool`]: crate::Error::Pool
    pub async fn explain_claim(&self, limit: usize) -> Result<serde_json::Value> {
        #[derive(diesel::QueryableByName)]
        struct Plan {
            #[diesel(sql_type = diesel::sql_types::Json)]
            #[diesel(column_name = "QUERY PLAN")]
            plan: serde_json::Value,
        }
        let limit_i64 = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut pooled = self.conn().await?;
        let conn = &mut *pooled;
        // As a claim runs it: a generic plan of the prepared statement.
        AnsiTransactionManager::begin_transaction_sql(conn, CLAIM_BEGIN).await?;
        let result: Result<serde_json::Value> = async {
            let order = order_from_db(
                &self.schema,
                &diesel::sql_query(&self.sql.get_order)
                    .prepared(self.prepare)
                    .get_result::<OrderRow>(conn)
                    .await?
                    .delivery_order,
            )?;
            let sql = if order == DeliveryOrder::Unordered {
                ExplainSql::unordered(&self.sql.claim_unordered, limit_i64)
            } else {
                let window = limit_i64.saturating_mul(self.claim_window as i64);
                ExplainSql::ordered(self.ordered_claim(conn).await?, window, limit_i64)
            };
            // A session-level name: deallocated below whatever happens.
            conn.batch_execute(&sql.prepare).await?;
            let plan = diesel::sql_query(&sql.explain)
                .get_result::<Plan>(conn)
                .await;
            let deallocated = conn.batch_execute(sql.deallocate).await;
            let plan = plan?;
            deallocated?;
            Ok(plan.plan)
        }
        .await;
        let rolled_back = AnsiTransactionManager::rollback_transaction(conn).await;
        if result.is_err() || rolled_back.is_err() {
            // The session may still hold the named statement (or be inside
            // the transaction): close it rather than pool it.
            drop(Object::take(pooled));
        }
        rolled_back?;
        result
    }
}
