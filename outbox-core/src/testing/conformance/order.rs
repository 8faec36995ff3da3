//! Per-aggregate order around a dead or waiting head.

use chrono::Utc;
use uuid::Uuid;

use super::{Fixture, Violation, claim, dead, failed, finish, ids_of, record, stats};
use crate::testing::TestEvent;
use crate::{Claim, DeadSelector, EventStatus, FailedAttempt, NextStep, OutboxStore};

/// In [`DeliveryOrder::PerAggregate`](crate::DeliveryOrder) (a fresh
/// store's default): a `Dead` event, or one waiting for its retry, holds
/// back the later events of its own aggregate only; the stats count them;
/// [`replay_dead`](OutboxStore::replay_dead) brings a dead event back in
/// its place (attempts reset) and [`skip_dead`](OutboxStore::skip_dead)
/// (dead events only) releases the events behind it.
///
/// # Errors
/// A [`Violation`] where the store breaks this (or fails).
pub async fn a_dead_event_holds_back_only_its_aggregate<F: Fixture>(
    fixture: &F,
) -> Result<(), Violation> {
    const CHECK: &str = "a_dead_event_holds_back_only_its_aggregate";
    let store = fixture.store();
    let events = ["a", "b", "a", "b", "a"].map(TestEvent::new);
    let ids = record(fixture, CHECK, &events).await?;
    let (a0, b0, a1, b1, a2) = (ids[0], ids[1], ids[2], ids[3], ids[4]);

    // a0 dies, b0 waits for a retry an hour away; the rest is released.
    let Some(mut batch) = claim(fixture, CHECK, 100).await? else {
        return Err(Violation {
            check: CHECK,
            what: "five pending events, nothing claimable".into(),
        });
    };
    ensure!(
        CHECK,
        ids_of(&batch) == ids,
        "a claim got {:?}, expected every event in seq order",
        ids_of(&batch)
    );
    let seq = |claim: &<F::Store as OutboxStore>::Claim, id: Uuid| {
        claim
            .records()
            .iter()
            .find(|r| r.id() == id)
            .map(|r| r.seq)
            .unwrap_or(i64::MIN)
    };
    let retry = FailedAttempt::new(
        seq(&batch, b0),
        1,
        "nack",
        NextStep::RetryAt(Utc::now() + chrono::Duration::hours(1)),
    );
    batch
        .mark_failed(&[dead(seq(&batch, a0), 3), retry])
        .await
        .map_err(|e| failed(CHECK, "mark_failed", &e))?;
    finish(CHECK, batch).await?;
    if let Some(batch) = claim(fixture, CHECK, 100).await? {
        let got = ids_of(&batch);
        finish(CHECK, batch).await?;
        return Err(Violation {
            check: CHECK,
            what: format!("both aggregates are blocked, yet a claim got {got:?}"),
        });
    }
    let now = stats(fixture, CHECK).await?;
    ensure!(
        CHECK,
        (now.dead, now.backlog, now.blocked_aggregates) == (1, 4, 2),
        "stats with a dead and a waiting head: {now:?}, expected 1 dead, backlog 4, \
         2 blocked aggregates"
    );

    // A new aggregate is not held back by them.
    let c0 = record(fixture, CHECK, &[TestEvent::new("c")]).await?[0];
    let Some(batch) = claim(fixture, CHECK, 100).await? else {
        return Err(Violation {
            check: CHECK,
            what: "an event of a third aggregate is held back by the others".into(),
        });
    };
    ensure!(
        CHECK,
        ids_of(&batch) == [c0],
        "a claim got {:?}, expected only the new aggregate's event",
        ids_of(&batch)
    );
    finish(CHECK, batch).await?;

    // Replaying a0: a0, a1, a2 come back in their order, a0 with no attempts.
    let replayed = store
        .replay_dead(DeadSelector::Id(a0))
        .await
        .map_err(|e| failed(CHECK, "replay_dead", &e))?;
    ensure!(CHECK, replayed == 1, "replay_dead of one event: {replayed}");
    let Some(mut batch) = claim(fixture, CHECK, 100).await? else {
        return Err(Violation {
            check: CHECK,
            what: "nothing claimable after a replay".into(),
        });
    };
    ensure!(
        CHECK,
        ids_of(&batch) == [a0, a1, a2, c0],
        "after replaying a0 a claim got {:?}, expected a0, a1, a2, c0",
        ids_of(&batch)
    );
    let head = &batch.records()[0];
    ensure!(
        CHECK,
        head.attempts == 0 && head.status == EventStatus::Pending,
        "a replayed event is claimed with {} attempts as {:?}, expected 0 and Pending",
        head.attempts,
        head.status
    );

    // a0 dies again and is skipped: a1 and a2 go without it.
    let a0_seq = seq(&batch, a0);
    batch
        .mark_failed(&[dead(a0_seq, 1)])
        .await
        .map_err(|e| failed(CHECK, "mark_failed", &e))?;
    finish(CHECK, batch).await?;
    let skipped = store
        .skip_dead(a0)
        .await
        .map_err(|e| failed(CHECK, "skip_dead", &e))?;
    ensure!(CHECK, skipped, "skip_dead of a dead event returned false");
    let again = store
        .skip_dead(a0)
        .await
        .map_err(|e| failed(CHECK, "skip_dead", &e))?;
    ensure!(CHECK, !again, "skip_dead of a skipped event returned true");
    let not_dead = store
        .skip_dead(b1)
        .await
        .map_err(|e| failed(CHECK, "skip_dead", &e))?;
    ensure!(
        CHECK,
        !not_dead,
        "skip_dead of a pending event returned true"
    );
    let Some(mut batch) = claim(fixture, CHECK, 100).await? else {
        return Err(Violation {
            check: CHECK,
            what: "nothing claimable after a skip".into(),
        });
    };
    ensure!(
        CHECK,
        ids_of(&batch) == [a1, a2, c0],
        "after skipping a0 a claim got {:?}, expected a1, a2, c0 (b1 waits behind b0)",
        ids_of(&batch)
    );
    let seqs: Vec<i64> = batch.records().iter().map(|r| r.seq).collect();
    batch
        .mark_sent(&seqs)
        .await
        .map_err(|e| failed(CHECK, "mark_sent", &e))?;
    finish(CHECK, batch).await?;
    let now = stats(fixture, CHECK).await?;
    ensure!(
        CHECK,
        (now.dead, now.backlog, now.blocked_aggregates) == (0, 2, 1),
        "stats with only b0 waiting: {now:?}, expected 0 dead, backlog 2, 1 blocked aggregate"
    );
    Ok(())
}
