//! Loyalty: 1 point per full 100 cents of a paid order, taken back when a
//! paid order is cancelled.

use outbox::postgres::Transaction;
use outbox::rabbitmq::{EventHandler, HandlerError, IncomingEvent};

use super::{payload, unknown_event_type};
use crate::db::Database;
use crate::domain::loyalty::{Award, AwardStatus, points_for};
use crate::domain::{OrderCancelled, OrderPaid};

/// The loyalty consumer's [`EventHandler`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Loyalty;

impl Loyalty {
    /// The consumer's name in the inbox (and in its errors).
    pub const NAME: &'static str = "loyalty";

    /// `order.paid`: awards the order's points, once.
    async fn award<C: Database>(conn: &mut C, paid: OrderPaid) -> Result<(), HandlerError> {
        let order_id = paid.order_id;
        if let Some(award) = conn.lock_award(order_id).await? {
            // Revoked by a cancel that overtook the payment.
            tracing::info!(%order_id, status = award.status.as_str(), "order already handled by loyalty");
            return Ok(());
        }
        let award = Award {
            customer_id: paid.customer_id,
            points: points_for(paid.total_cents),
            status: AwardStatus::Awarded,
        };
        conn.insert_award(order_id, &award).await?;
        if award.points > 0 {
            conn.add_points(award.customer_id, award.points).await?;
        }
        tracing::info!(%order_id, customer_id = %award.customer_id, points = award.points, "points awarded");
        Ok(())
    }

    /// `order.cancelled`: takes back the points of a paid order.
    async fn revoke<C: Database>(
        conn: &mut C,
        cancelled: OrderCancelled,
    ) -> Result<(), HandlerError> {
        if !cancelled.was_paid {
            return Ok(());
        }
        let order_id = cancelled.order_id;
        match conn.lock_award(order_id).await? {
            Some(award) if award.status == AwardStatus::Awarded => {
                if award.points > 0 {
                    conn.add_points(award.customer_id, -award.points).await?;
                }
                conn.set_award_status(order_id, AwardStatus::Revoked)
                    .await?;
                tracing::info!(%order_id, points = award.points, "points taken back");
            }
            Some(_) => {}
            None => {
                // The cancel overtook the payment: the late `order.paid`
                // must award nothing.
                let award = Award {
                    customer_id: cancelled.customer_id,
                    points: 0,
                    status: AwardStatus::Revoked,
                };
                conn.insert_award(order_id, &award).await?;
                tracing::info!(%order_id, "paid order cancelled before loyalty saw the payment");
            }
        }
        Ok(())
    }
}

impl<C: Database> EventHandler<Transaction<C>> for Loyalty {
    async fn handle(
        &self,
        tx: &mut Transaction<C>,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        match event.event_type.as_str() {
            OrderPaid::EVENT_TYPE => {
                Self::award(&mut **tx, payload(event, OrderPaid::SCHEMA_VERSION)?).await
            }
            OrderCancelled::EVENT_TYPE => {
                Self::revoke(&mut **tx, payload(event, OrderCancelled::SCHEMA_VERSION)?).await
            }
            _ => Err(unknown_event_type(Self::NAME, event)),
        }
    }
}
