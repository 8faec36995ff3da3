//! [`HookedStore`]: any [`OutboxStore`] behind hooks a test sets, instead
//! of a hand-written wrapper store per test.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use futures_util::stream::{BoxStream, Stream};
use uuid::Uuid;

use crate::{Claimed, DeadSelector, OutboxStats, OutboxStore, RelayControl, RelayRegistration};

type ClaimResult<S> = Result<Option<<S as OutboxStore>::Claim>, <S as OutboxStore>::Error>;
type ClaimHook<S> = dyn Fn(S, usize) -> BoxFuture<'static, ClaimResult<S>> + Send + Sync;

/// Forwards every call to the store it wraps, except where a test hooked
/// it: it counts claims ([`claims`](Self::claims)), can answer claims
/// itself ([`on_claim`](Self::on_claim)) and can hand the relay a wakeup
/// stream of the test's ([`with_wakeups`](Self::with_wakeups)).
///
/// Cloning gives another handle to the same hooks and counter.
///
/// ```
/// use outbox_core::OutboxStore as _;
/// use outbox_core::testing::{HookedStore, InMemoryStore, TestEvent};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let inner = InMemoryStore::new();
/// inner.record(&TestEvent::new("a")).unwrap();
/// // Every claim finds nothing.
/// let store = HookedStore::new(inner).on_claim(|_inner, _limit| async { Ok(None) });
/// assert!(store.claim(10).await.unwrap().is_none());
/// assert_eq!(store.claims(), 1);
/// # });
/// ```
pub struct HookedStore<S: OutboxStore> {
    inner: S,
    claims: Arc<AtomicUsize>,
    on_claim: Option<Arc<ClaimHook<S>>>,
    wakeups: Arc<Mutex<Option<BoxStream<'static, ()>>>>,
}

impl<S: OutboxStore + Clone> HookedStore<S> {
    /// `inner` without hooks: every call is forwarded, claims are counted.
    pub fn new(inner: S) -> Self {
        HookedStore {
            inner,
            claims: Arc::default(),
            on_claim: None,
            wakeups: Arc::default(),
        }
    }

    /// Answers every [`claim`](OutboxStore::claim) and
    /// [`claim_for`](OutboxStore::claim_for) with `hook(inner, limit)`
    /// instead of the inner store's (given a handle to the inner store, so
    /// the hook can still claim there). With this hook, `claim_for` ignores
    /// relay pauses, as the trait's default does.
    #[must_use]
    pub fn on_claim<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(S, usize) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ClaimResult<S>> + Send + 'static,
    {
        self.on_claim = Some(Arc::new(move |inner, limit| Box::pin(hook(inner, limit))));
        self
    }

    /// Hands `wakeups` to the first caller of
    /// [`wakeups`](OutboxStore::wakeups) (the relay takes it once when it
    /// starts); later callers, and every caller when none was given, get
    /// the inner store's.
    #[must_use]
    pub fn with_wakeups(self, wakeups: impl Stream<Item = ()> + Send + 'static) -> Self {
        *self.lock_wakeups() = Some(wakeups.boxed());
        self
    }

    /// The store it wraps.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// How many times `claim` and `claim_for` were called (through this
    /// store or any clone).
    pub fn claims(&self) -> usize {
        self.claims.load(Ordering::SeqCst)
    }

    fn lock_wakeups(&self) -> std::sync::MutexGuard<'_, Option<BoxStream<'static, ()>>> {
        // Poisoned only by a panic in a failing test; the slot stays usable.
        self.wakeups
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn claim_hooked(&self, limit: usize) -> Option<ClaimResult<S>> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        match &self.on_claim {
            Some(hook) => Some(hook(self.inner.clone(), limit).await),
            None => None,
        }
    }
}

impl<S: OutboxStore> Clone for HookedStore<S>
where
    S: Clone,
{
    fn clone(&self) -> Self {
        HookedStore {
            inner: self.inner.clone(),
            claims: Arc::clone(&self.claims),
            on_claim: self.on_claim.clone(),
            wakeups: Arc::clone(&self.wakeups),
        }
    }
}

impl<S: OutboxStore + fmt::Debug> fmt::Debug for HookedStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HookedStore")
            .field("inner", &self.inner)
            .field("claims", &self.claims.load(Ordering::SeqCst))
            .field("on_claim", &self.on_claim.is_some())
            .finish_non_exhaustive()
    }
}

impl<S: OutboxStore + Clone> OutboxStore for HookedStore<S> {
    type Error = S::Error;
    type Claim = S::Claim;

    async fn claim(&self, limit: usize) -> ClaimResult<S> {
        match self.claim_hooked(limit).await {
            Some(result) => result,
            None => self.inner.claim(limit).await,
        }
    }

    async fn claim_for(
        &self,
        relay: &str,
        limit: usize,
    ) -> Result<Claimed<Self::Claim>, Self::Error> {
        match self.claim_hooked(limit).await {
            Some(result) => Ok(match result? {
                Some(batch) => Claimed::Batch(batch),
                None => Claimed::Empty,
            }),
            None => self.inner.claim_for(relay, limit).await,
        }
    }

    async fn stats(&self) -> Result<OutboxStats, Self::Error> {
        self.inner.stats().await
    }

    async fn purge_sent(&self, before: DateTime<Utc>, limit: usize) -> Result<u64, Self::Error> {
        self.inner.purge_sent(before, limit).await
    }

    async fn replay_dead(&self, selector: DeadSelector) -> Result<u64, Self::Error> {
        self.inner.replay_dead(selector).await
    }

    async fn skip_dead(&self, id: Uuid) -> Result<bool, Self::Error> {
        self.inner.skip_dead(id).await
    }

    async fn maintain(&self) -> Result<(), Self::Error> {
        self.inner.maintain().await
    }

    async fn register_relay(&self, relay: &RelayRegistration) -> Result<(), Self::Error> {
        self.inner.register_relay(relay).await
    }

    async fn heartbeat(&self, name: &str, in_flight: u32) -> Result<RelayControl, Self::Error> {
        self.inner.heartbeat(name, in_flight).await
    }

    async fn deregister_relay(&self, name: &str) -> Result<(), Self::Error> {
        self.inner.deregister_relay(name).await
    }

    fn wakeups(&self) -> impl Stream<Item = ()> + Send + 'static {
        match self.lock_wakeups().take() {
            Some(given) => given.left_stream(),
            None => self.inner.wakeups().right_stream(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Claim as _;
    use crate::testing::{InMemoryStore, TestEvent};

    #[tokio::test]
    async fn forwards_counts_and_hooks() {
        let inner = InMemoryStore::new();
        let id = inner.record(&TestEvent::new("a")).unwrap();
        let plain = HookedStore::new(inner.clone());
        match plain.claim_for("relay", 10).await.unwrap() {
            Claimed::Batch(claim) => assert_eq!(claim.records()[0].id(), id),
            other => panic!("forwarded claim_for: {other:?}"),
        }
        assert_eq!(plain.stats().await.unwrap().backlog, 1);
        assert_eq!(plain.claims(), 1);

        let empty = HookedStore::new(inner.clone()).on_claim(|_, _| async { Ok(None) });
        assert!(matches!(
            empty.claim_for("relay", 10).await.unwrap(),
            Claimed::Empty
        ));
        assert!(empty.clone().claim(10).await.unwrap().is_none());
        assert_eq!(empty.claims(), 2, "clones share the counter");

        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let fed = HookedStore::new(inner).with_wakeups(futures_util::stream::unfold(
            rx,
            |mut rx: tokio::sync::mpsc::UnboundedReceiver<()>| async move {
                rx.recv().await.map(|()| ((), rx))
            },
        ));
        let mut wakeups = Box::pin(fed.wakeups());
        tx.send(()).unwrap();
        assert_eq!(wakeups.next().await, Some(()));
        drop(tx);
        assert_eq!(wakeups.next().await, None, "the given stream, to its end");
    }
}
