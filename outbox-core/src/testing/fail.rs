//! [`fail_claimed`]: put events into `Retry` or `Dead` the way a relay
//! does, through a claim of any [`OutboxStore`].

use uuid::Uuid;

use crate::{Claim as _, FailedAttempt, NextStep, OutboxStore};

/// Why [`fail_claimed`] marked nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FailClaimed<E> {
    /// The store had nothing claimable.
    #[error("nothing is claimable: record the events first (and do not hold them in a claim)")]
    NothingClaimable,
    /// An event to fail was not part of the claim (not recorded, not
    /// claimable, or beyond the claim's limit of 1,000).
    #[error("event {0} is not part of the claim: it is not claimable now")]
    NotClaimed(Uuid),
    /// The store failed.
    #[error("the store failed: {0}")]
    Store(#[source] E),
}

/// Claims what is claimable (up to 1,000 events) and marks the events `ids`
/// failed, each with `attempts` spent, `next` (a retry time or `Dead`)
/// and the error `error(id)`, as a relay would; the rest of the claim is
/// released. Returns once the claim is finished.
///
/// ```
/// use outbox_core::testing::{InMemoryStore, TestEvent, fail_claimed};
/// use outbox_core::{EventStatus, NextStep};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store = InMemoryStore::new();
/// let id = store.record(&TestEvent::new("a")).unwrap();
/// fail_claimed(&store, &[id], 5, NextStep::Dead, |id| format!("nack ({id})"))
///     .await
///     .unwrap();
/// assert_eq!(store.get(id).unwrap().status, EventStatus::Dead);
/// # });
/// ```
///
/// # Errors
/// [`FailClaimed`]: nothing was claimable, an id was not part of the
/// claim (then nothing was marked), or the store failed.
pub async fn fail_claimed<S: OutboxStore>(
    store: &S,
    ids: &[Uuid],
    attempts: u32,
    next: NextStep,
    error: impl Fn(Uuid) -> String,
) -> Result<(), FailClaimed<S::Error>> {
    let mut claim = store
        .claim(1_000)
        .await
        .map_err(FailClaimed::Store)?
        .ok_or(FailClaimed::NothingClaimable)?;
    let failures = ids
        .iter()
        .map(|id| {
            let record = claim
                .records()
                .iter()
                .find(|r| r.id() == *id)
                .ok_or(FailClaimed::NotClaimed(*id))?;
            Ok(FailedAttempt::new(record.seq, attempts, error(*id), next))
        })
        .collect::<Result<Vec<_>, _>>()?;
    claim
        .mark_failed(&failures)
        .await
        .map_err(FailClaimed::Store)?;
    claim.finish().await.map_err(FailClaimed::Store)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EventStatus;
    use crate::testing::{InMemoryStore, TestEvent};

    #[tokio::test]
    async fn fails_the_named_events_and_releases_the_rest() {
        let store = InMemoryStore::new();
        let a = store.record(&TestEvent::new("a")).unwrap();
        let b = store.record(&TestEvent::new("b")).unwrap();
        fail_claimed(&store, &[a], 5, NextStep::Dead, |_| "nack".into())
            .await
            .unwrap();
        let dead = store.get(a).unwrap();
        assert_eq!(
            (dead.status, dead.attempts, dead.last_error.as_deref()),
            (EventStatus::Dead, 5, Some("nack"))
        );
        assert_eq!(store.get(b).unwrap().status, EventStatus::Pending);
        assert_eq!(store.claimed(), 0);

        let unknown = Uuid::now_v7();
        assert!(matches!(
            fail_claimed(&store, &[b, unknown], 1, NextStep::Dead, |_| "x".into()).await,
            Err(FailClaimed::NotClaimed(id)) if id == unknown
        ));
        assert_eq!(store.get(b).unwrap().status, EventStatus::Pending);
        fail_claimed(&store, &[b], 1, NextStep::Dead, |_| "x".into())
            .await
            .unwrap();
        assert!(matches!(
            fail_claimed(&store, &[b], 1, NextStep::Dead, |_| "x".into()).await,
            Err(FailClaimed::NothingClaimable)
        ));
    }
}
