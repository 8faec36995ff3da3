//! The end of a failover scenario: [`Scenario::verify_failover`] runs
//! [`Scenario::verify`] on what the new primary holds and reports what the
//! failover lost.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::verify::Failover;
use super::{Scenario, Summary};

/// What a PostgreSQL failover lost, as the producers and the tap saw it;
/// printed as one `FAULT LOSS` line.
#[derive(Debug, Clone)]
pub struct FailoverLoss {
    /// Scenario name.
    pub scenario: String,
    /// Whether the standby was synchronous.
    pub synchronous: bool,
    /// Events of transactions whose `COMMIT` the producers saw succeed.
    pub acknowledged: usize,
    /// Of those, the ones missing on the new primary (their business rows
    /// with them: the loss is atomic).
    pub acknowledged_lost: usize,
    /// Events of transactions whose `COMMIT` failed (outcome unknown to
    /// the producer) that the new primary holds.
    pub unknown_kept: usize,
    /// Events delivered (published from the old primary) that the new
    /// primary does not hold.
    pub delivered_then_lost: usize,
    /// Events the new primary holds whose inbox effect is missing (applied
    /// on the old primary, the message acknowledged, the effect gone).
    pub effects_lost: usize,
    /// Events the new primary does not hold that the inbox consumer
    /// applied on it (their messages, published from the old primary,
    /// handled after the failover): effects of events that, for the
    /// database, never happened.
    pub applied_then_lost: usize,
}

impl std::fmt::Display for FailoverLoss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "FAULT LOSS {} ({} replication): acknowledged_events={} acknowledged_lost={} \
             unknown_outcome_kept={} delivered_then_lost={} effects_lost={} \
             applied_then_lost={}",
            self.scenario,
            if self.synchronous {
                "synchronous"
            } else {
                "asynchronous"
            },
            self.acknowledged,
            self.acknowledged_lost,
            self.unknown_kept,
            self.delivered_then_lost,
            self.effects_lost,
            self.applied_then_lost
        )
    }
}

impl Scenario {
    /// [`verify`](Self::verify) after a failover, on what the new primary
    /// holds (the `orders` table is the ground truth there too), and the
    /// [`FailoverLoss`] line.
    ///
    /// `synchronous`: the full verification, and no acknowledged commit may
    /// be missing. Otherwise an event may have been published from the old
    /// primary and be gone from the new one: such deliveries are allowed
    /// for events the producers recorded (acknowledged or of unknown
    /// outcome: a `COMMIT` that failed), never for rolled-back ones (on
    /// purpose, or failed before their `COMMIT`), and counted; an inbox
    /// effect applied on the old primary may be gone (only for an event
    /// first delivered before `killed_at`, when the old primary was known
    /// dead), and a lost event's message may be applied on the new one:
    /// both counted.
    pub async fn verify_failover(
        &self,
        tap: &crate::Tap,
        produced: &crate::Produced,
        limit: Duration,
        synchronous: bool,
        killed_at: Instant,
    ) -> (Summary, FailoverLoss) {
        let failover = Failover {
            recorded: produced
                .acknowledged
                .iter()
                .chain(&produced.unknown)
                .copied()
                .collect::<HashSet<Uuid>>(),
            killed_at,
        };
        let (summary, lost) = self
            .verify_with(tap, produced, limit, (!synchronous).then_some(&failover))
            .await;
        let committed: HashSet<Uuid> = self
            .committed()
            .await
            .unwrap_or_else(|e| panic!("{}: reading the orders: {e}", self.name))
            .into_iter()
            .map(|c| c.event_id)
            .collect();
        let loss = FailoverLoss {
            scenario: self.name.clone(),
            synchronous,
            acknowledged: produced.acknowledged.len(),
            acknowledged_lost: produced
                .acknowledged
                .iter()
                .filter(|id| !committed.contains(id))
                .count(),
            unknown_kept: produced
                .unknown
                .iter()
                .filter(|id| committed.contains(id))
                .count(),
            delivered_then_lost: lost.delivered,
            effects_lost: lost.unapplied,
            applied_then_lost: lost.applied,
        };
        let line = loss.to_string();
        tracing::info!("{line}");
        #[allow(clippy::print_stdout)]
        {
            println!("{line}");
        }
        if synchronous {
            assert_eq!(
                (
                    loss.acknowledged_lost,
                    loss.delivered_then_lost,
                    loss.effects_lost
                ),
                (0, 0, 0),
                "{}: synchronous replication lost committed work: {line}",
                self.name
            );
        }
        (summary, loss)
    }
}
