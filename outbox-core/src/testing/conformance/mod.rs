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
//! The checks, by concern: how marks name events (`marks.rs`:
//! [`marks_refuse_seqs_not_in_the_claim`], [`marks_refuse_a_seq_named_twice`])
//! and per-aggregate order (`order.rs`:
//! [`a_dead_event_holds_back_only_its_aggregate`]); the fixture and the
//! checks' helpers here.
//!
//! Each check returns a [`Violation`] naming the check and what broke
//! (a store error included) instead of panicking, so the test shows it
//! with `unwrap()`.

use std::fmt;
use std::future::Future;

use uuid::Uuid;

use crate::{Claim, FailedAttempt, NextStep, OutboxStats, OutboxStore};

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

async fn stats<F: Fixture>(fixture: &F, check: &'static str) -> Result<OutboxStats, Violation> {
    fixture
        .store()
        .stats()
        .await
        .map_err(|e| failed(check, "stats", &e))
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

mod marks;
mod order;

pub use marks::{marks_refuse_a_seq_named_twice, marks_refuse_seqs_not_in_the_claim};
pub use order::a_dead_event_holds_back_only_its_aggregate;

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
