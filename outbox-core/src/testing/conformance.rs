//! Contracts every [`OutboxStore`] keeps, as checks any store's tests run.
//!
//! A store's test suite implements [`Fixture`] for a fresh, empty store
//! (how to record events into it, and how to recognise its refusals of a
//! mark, [`Refusal`]) and runs each check in a test of its own:
//!
//! ```
//! use outbox_core::testing::conformance;
//! use outbox_core::testing::InMemoryStore;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! // The in-memory store is its own fixture.
//! conformance::marks_refuse_seqs_not_in_the_claim(&InMemoryStore::new())
//!     .await
//!     .unwrap();
//! # });
//! ```
//!
//! Each check returns a [`Violation`] naming the check and what broke
//! (a store error included) instead of panicking, so the test shows it
//! with `unwrap()`.

use std::fmt;
use std::future::Future;

use chrono::Utc;
use uuid::Uuid;

use crate::{Claim, DeadSelector, EventStatus, FailedAttempt, NextStep, OutboxStore};

use super::{InMemoryStore, StoreError, TestEvent};

/// Why a [`Fixture`] could not record events.
pub type RecordError = Box<dyn std::error::Error + Send + Sync>;

/// A fresh, empty store under test, and what the checks cannot do through
/// [`OutboxStore`] alone.
pub trait Fixture: Send + Sync {
    /// The store under test.
    type Store: OutboxStore;

    /// The store (empty when the check starts).
    fn store(&self) -> &Self::Store;

    /// Records `events` as committed, `Pending`, in order (one transaction
    /// is fine); their ids.
    fn record(
        &self,
        events: &[TestEvent],
    ) -> impl Future<Output = Result<Vec<Uuid>, RecordError>> + Send;

    /// Which refusal of a mark `error` is, if it is one, else `None`.
    fn refusal(error: &<Self::Store as OutboxStore>::Error) -> Option<Refusal>;
}

/// A store's refusal of a whole mark call (nothing of it marked), as a
/// [`Fixture`] recognises it in the store's own error type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The mark named a seq that is not one of the claim's records.
    NotInClaim {
        /// That seq.
        seq: i64,
    },
    /// The mark named a seq more than once.
    DuplicateSeq {
        /// That seq.
        seq: i64,
    },
}

/// The in-memory store is its own fixture: it records directly, and its
/// refusals are [`StoreError::NotInClaim`] and [`StoreError::DuplicateSeq`].
impl Fixture for InMemoryStore {
    type Store = InMemoryStore;

    fn store(&self) -> &InMemoryStore {
        self
    }

    async fn record(&self, events: &[TestEvent]) -> Result<Vec<Uuid>, RecordError> {
        Ok(events
            .iter()
            .map(|e| InMemoryStore::record(self, e))
            .collect::<Result<_, _>>()?)
    }

    fn refusal(error: &StoreError) -> Option<Refusal> {
        match error {
            StoreError::NotInClaim { seq } => Some(Refusal::NotInClaim { seq: *seq }),
            StoreError::DuplicateSeq { seq } => Some(Refusal::DuplicateSeq { seq: *seq }),
            _ => None,
        }
    }
}

/// A store broke a contract (or failed) in a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The check, by its function name.
    pub check: &'static str,
    /// What broke.
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "store contract `{}` broken: {}", self.check, self.what)
    }
}

impl std::error::Error for Violation {}

/// Fails the check with a message unless `cond` holds.
macro_rules! ensure {
    ($check:expr, $cond:expr, $($what:tt)+) => {
        if !$cond {
            return Err(Violation { check: $check, what: format!($($what)+) });
        }
    };
}

/// A store error (or a recording failure) as a [`Violation`] of `check`.
fn failed(check: &'static str, doing: &str, error: &dyn fmt::Display) -> Violation {
    Violation {
        check,
        what: format!("{doing} failed: {error}"),
    }
}

async fn record<F: Fixture>(
    fixture: &F,
    check: &'static str,
    events: &[TestEvent],
) -> Result<Vec<Uuid>, Violation> {
    fixture
        .record(events)
        .await
        .map_err(|e| failed(check, "recording", &e))
}

async fn claim<F: Fixture>(
    fixture: &F,
    check: &'static str,
    limit: usize,
) -> Result<Option<<F::Store as OutboxStore>::Claim>, Violation> {
    fixture
        .store()
        .claim(limit)
        .await
        .map_err(|e| failed(check, "claim", &e))
}

async fn finish<C: Claim>(check: &'static str, claim: C) -> Result<(), Violation> {
    claim
        .finish()
        .await
        .map_err(|e| failed(check, "finish", &e))
}

fn ids_of(claim: &impl Claim) -> Vec<Uuid> {
    claim.records().iter().map(|r| r.id()).collect()
}

/// Checks that `result` is the store's "not in claim" refusal naming
/// `seq` (any seq when `None`).
fn refused<F: Fixture>(
    check: &'static str,
    mark: &str,
    result: Result<(), <F::Store as OutboxStore>::Error>,
    seq: Option<i64>,
) -> Result<(), Violation> {
    match result {
        Ok(()) => Err(Violation {
            check,
            what: format!("{mark} of a seq not in the claim succeeded"),
        }),
        Err(error) => {
            let named = match F::refusal(&error) {
                Some(Refusal::NotInClaim { seq }) => Some(seq),
                _ => None,
            };
            ensure!(
                check,
                named.is_some() && (seq.is_none() || named == seq),
                "{mark} of a seq not in the claim: expected \"not in claim\" naming {seq:?}, \
                 got {error}"
            );
            Ok(())
        }
    }
}

/// Checks that `result` is the store's "duplicate seq" refusal naming `seq`.
fn refused_twice<F: Fixture>(
    check: &'static str,
    mark: &str,
    result: Result<(), <F::Store as OutboxStore>::Error>,
    seq: i64,
) -> Result<(), Violation> {
    match result {
        Ok(()) => Err(Violation {
            check,
            what: format!("{mark} naming seq {seq} twice succeeded"),
        }),
        Err(error) => {
            ensure!(
                check,
                F::refusal(&error) == Some(Refusal::DuplicateSeq { seq }),
                "{mark} naming seq {seq} twice: expected \"duplicate seq\" naming {seq}, got \
                 {error}"
            );
            Ok(())
        }
    }
}

fn dead(seq: i64, attempts: u32) -> FailedAttempt {
    FailedAttempt::new(seq, attempts, "nack", NextStep::Dead)
}

/// Marks name events by their seq, and a claim refuses a seq that is not
/// one of its records (another claim's, or none at all) with "not in
/// claim" from [`mark_sent`](Claim::mark_sent),
/// [`mark_suspect`](Claim::mark_suspect) and
/// [`mark_failed`](Claim::mark_failed), marking nothing of the call (not
/// even the claim's own seqs in it); the claim's own seqs are still marked
/// as usual afterwards.
///
/// # Errors
/// A [`Violation`] where the store breaks this (or fails).
pub async fn marks_refuse_seqs_not_in_the_claim<F: Fixture>(fixture: &F) -> Result<(), Violation> {
    const CHECK: &str = "marks_refuse_seqs_not_in_the_claim";
    let ids = record(fixture, CHECK, &[TestEvent::new("a"), TestEvent::new("b")]).await?;
    let (a, b) = (ids[0], ids[1]);
    let mine = claim(fixture, CHECK, 1).await?;
    let other = claim(fixture, CHECK, 1).await?;
    let (Some(mut mine), Some(other)) = (mine, other) else {
        return Err(Violation {
            check: CHECK,
            what: "two claims of one event each did not both get one".into(),
        });
    };
    ensure!(
        CHECK,
        ids_of(&mine) == [a] && ids_of(&other) == [b],
        "claims of one took {:?} and {:?}, expected [{a}] and [{b}]",
        ids_of(&mine),
        ids_of(&other)
    );
    let own = mine.records()[0].seq;
    let foreign = other.records()[0].seq;
    refused::<F>(
        CHECK,
        "mark_sent",
        mine.mark_sent(&[own, foreign]).await,
        Some(foreign),
    )?;
    refused::<F>(
        CHECK,
        "mark_suspect",
        mine.mark_suspect(&[foreign], "died").await,
        Some(foreign),
    )?;
    refused::<F>(
        CHECK,
        "mark_failed",
        mine.mark_failed(&[dead(own, 1), dead(foreign, 1)]).await,
        Some(foreign),
    )?;
    // Checked in call order: the foreign seq comes first, so it is the
    // refusal, not the duplicate after it.
    refused::<F>(
        CHECK,
        "mark_sent",
        mine.mark_sent(&[foreign, own, own]).await,
        Some(foreign),
    )?;
    let stranger = own.max(foreign) + 1_000;
    refused::<F>(CHECK, "mark_sent", mine.mark_sent(&[stranger]).await, None)?;
    finish(CHECK, mine).await?;
    finish(CHECK, other).await?;

    // Nothing of the refused calls was marked.
    let Some(again) = claim(fixture, CHECK, 10).await? else {
        return Err(Violation {
            check: CHECK,
            what: "after refused marks, nothing is claimable".into(),
        });
    };
    ensure!(
        CHECK,
        ids_of(&again) == [a, b],
        "after refused marks a claim got {:?}, expected both events",
        ids_of(&again)
    );
    for record in again.records() {
        ensure!(
            CHECK,
            record.status == EventStatus::Pending
                && record.attempts == 0
                && record.suspect_count == 0,
            "a refused mark changed event {}: {:?}, {} attempts, suspect count {}",
            record.id(),
            record.status,
            record.attempts,
            record.suspect_count
        );
    }
    finish(CHECK, again).await?;

    // The claim's own seq is marked as usual.
    let Some(mut mine) = claim(fixture, CHECK, 1).await? else {
        return Err(Violation {
            check: CHECK,
            what: "nothing claimable the second time".into(),
        });
    };
    ensure!(
        CHECK,
        ids_of(&mine) == [a],
        "the claim of one after refused marks took {:?}, expected [{a}]",
        ids_of(&mine)
    );
    let own = mine.records()[0].seq;
    mine.mark_failed(&[dead(own, 1)])
        .await
        .map_err(|e| failed(CHECK, "mark_failed of the claim's own seq", &e))?;
    finish(CHECK, mine).await?;
    let stats = fixture
        .store()
        .stats()
        .await
        .map_err(|e| failed(CHECK, "stats", &e))?;
    ensure!(
        CHECK,
        (stats.dead, stats.backlog) == (1, 1),
        "after marking its own seq dead: {} dead, backlog {}, expected 1 and 1",
        stats.dead,
        stats.backlog
    );
    Ok(())
}

/// One mark call names each event at most once: a seq named twice in one
/// [`mark_sent`](Claim::mark_sent), [`mark_suspect`](Claim::mark_suspect)
/// or [`mark_failed`](Claim::mark_failed) is refused with "duplicate seq"
/// naming the first seq named again, in call order, and nothing of the call
/// is marked (no attempt counted, no suspect
/// counted twice); the same seq named once is marked as usual afterwards.
///
/// # Errors
/// A [`Violation`] where the store breaks this (or fails).
pub async fn marks_refuse_a_seq_named_twice<F: Fixture>(fixture: &F) -> Result<(), Violation> {
    const CHECK: &str = "marks_refuse_a_seq_named_twice";
    let ids = record(fixture, CHECK, &[TestEvent::new("a"), TestEvent::new("a")]).await?;
    let Some(mut claimed) = claim(fixture, CHECK, 10).await? else {
        return Err(Violation {
            check: CHECK,
            what: "nothing claimable".into(),
        });
    };
    ensure!(
        CHECK,
        ids_of(&claimed) == ids,
        "a claim of 10 took {:?}, expected {ids:?}",
        ids_of(&claimed)
    );
    let first = claimed.records()[0].seq;
    let second = claimed.records()[1].seq;
    refused_twice::<F>(
        CHECK,
        "mark_sent",
        claimed.mark_sent(&[first, second, first]).await,
        first,
    )?;
    // Checked in call order: the first seq named again is the one named.
    refused_twice::<F>(
        CHECK,
        "mark_sent",
        claimed.mark_sent(&[second, first, second, first]).await,
        second,
    )?;
    refused_twice::<F>(
        CHECK,
        "mark_suspect",
        claimed.mark_suspect(&[second, second], "died").await,
        second,
    )?;
    refused_twice::<F>(
        CHECK,
        "mark_failed",
        claimed
            .mark_failed(&[dead(first, 1), dead(second, 1), dead(first, 2)])
            .await,
        first,
    )?;
    finish(CHECK, claimed).await?;

    let Some(mut again) = claim(fixture, CHECK, 10).await? else {
        return Err(Violation {
            check: CHECK,
            what: "after refused marks, nothing is claimable".into(),
        });
    };
    ensure!(
        CHECK,
        ids_of(&again) == ids,
        "after refused marks a claim got {:?}, expected both events",
        ids_of(&again)
    );
    for record in again.records() {
        ensure!(
            CHECK,
            record.status == EventStatus::Pending
                && record.attempts == 0
                && record.suspect_count == 0,
            "a refused mark changed event {}: {:?}, {} attempts, suspect count {}",
            record.id(),
            record.status,
            record.attempts,
            record.suspect_count
        );
    }
    let seqs: Vec<i64> = again.records().iter().map(|r| r.seq).collect();
    again
        .mark_sent(&seqs)
        .await
        .map_err(|e| failed(CHECK, "mark_sent naming each seq once", &e))?;
    finish(CHECK, again).await?;
    let stats = fixture
        .store()
        .stats()
        .await
        .map_err(|e| failed(CHECK, "stats", &e))?;
    ensure!(
        CHECK,
        stats.backlog == 0,
        "after marking both sent the backlog is {}, expected 0",
        stats.backlog
    );
    Ok(())
}

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
    let stats = |doing: &'static str| async move {
        store.stats().await.map_err(|e| failed(CHECK, doing, &e))
    };

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
    let now = stats("stats").await?;
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
    let now = stats("stats").await?;
    ensure!(
        CHECK,
        (now.dead, now.backlog, now.blocked_aggregates) == (0, 2, 1),
        "stats with only b0 waiting: {now:?}, expected 0 dead, backlog 2, 1 blocked aggregate"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The in-memory store, deliberately blind to its refusal: every
    /// refusal looks like another error.
    struct Blind(InMemoryStore);

    impl Fixture for Blind {
        type Store = InMemoryStore;

        fn store(&self) -> &InMemoryStore {
            &self.0
        }

        fn record(
            &self,
            events: &[TestEvent],
        ) -> impl Future<Output = Result<Vec<Uuid>, RecordError>> + Send {
            Fixture::record(&self.0, events)
        }

        fn refusal(_: &StoreError) -> Option<Refusal> {
            None
        }
    }

    #[tokio::test]
    async fn a_store_error_that_is_not_recognised_is_a_violation() {
        let violation = marks_refuse_seqs_not_in_the_claim(&Blind(InMemoryStore::new()))
            .await
            .unwrap_err();
        assert_eq!(violation.check, "marks_refuse_seqs_not_in_the_claim");
        assert!(violation.what.contains("mark_sent"), "{violation}");
    }
}
