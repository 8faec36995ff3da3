//! [`DeadLetters`]: consumers' dead letters as admin verbs.

use std::future::Future;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{
    AdminError, AuditEntry, Caller, DeadLetterGroup, DeadLetterRecord, DlqReplayReport, Page,
    ReplayedMessage,
};

/// Where inbox consumers record the messages they dead-letter
/// ([`InboxDatabase::record_dead_letter`](crate::InboxDatabase::record_dead_letter)),
/// with the audit trail of the verbs that act on them.
pub trait DeadLetterStore: Send + Sync + 'static {
    /// The store's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Records with `id > after`, of the consumer queue `queue` (or of
    /// every queue), in `id` order, at most `limit`; only open ones unless
    /// `include_settled`.
    fn list(
        &self,
        queue: Option<&str>,
        after: Option<i64>,
        limit: usize,
        include_settled: bool,
    ) -> impl Future<Output = Result<Page<DeadLetterRecord>, Self::Error>> + Send;

    /// One record, open or not.
    fn show(
        &self,
        id: i64,
    ) -> impl Future<Output = Result<Option<DeadLetterRecord>, Self::Error>> + Send;

    /// Open records of `queue` (or of every queue) grouped by consumer,
    /// event type and normalized reason
    /// ([`group_dead_letters`](super::group_dead_letters)).
    fn groups(
        &self,
        queue: Option<&str>,
    ) -> impl Future<Output = Result<Vec<DeadLetterGroup>, Self::Error>> + Send;

    /// Marks the open records of `messages` replayed: by the dead letter's
    /// own id where it has one, else by event id within the queue it went
    /// back to. Returns how many records.
    fn mark_replayed(
        &self,
        messages: &[ReplayedMessage],
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send;

    /// Marks the open records of the consumer queues `queues` recorded
    /// before `before` (the store's clock, from [`now`](Self::now)) purged.
    /// Returns how many records.
    fn mark_purged(
        &self,
        queues: &[String],
        before: DateTime<Utc>,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send;

    /// The store's clock, the one records are stamped with.
    fn now(&self) -> impl Future<Output = Result<DateTime<Utc>, Self::Error>> + Send;

    /// Writes the audit row of a verb about to act; returns its id.
    fn begin_audit(
        &self,
        entry: &AuditEntry,
    ) -> impl Future<Output = Result<i64, Self::Error>> + Send;

    /// Sets the audit row's count (messages moved so far) and, when
    /// `outcome` is given, ends it with that outcome.
    fn record_audit(
        &self,
        audit: i64,
        count: u64,
        outcome: Option<&str>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// The broker side: dead-letter queues to count, replay and purge.
pub trait DeadLetterBroker: Send + Sync + 'static {
    /// The broker's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Messages ready in `queue`; `None` when there is no such queue.
    fn depth(&self, queue: &str) -> impl Future<Output = Result<Option<u32>, Self::Error>> + Send;

    /// Takes up to `limit` messages from `queue`, one at a time, and sends
    /// each back to the queue it was dead-lettered from, confirmed before
    /// it is acked. A message that cannot be sent back stops the replay
    /// (it stays in `queue`), or, when `skip_unreplayable`, moves to
    /// `queue`'s tail (confirmed, then acked) and the replay goes on.
    /// `progress` gets the count of messages taken so far.
    ///
    /// An `Err` means nothing was taken (no connection); a stop on a
    /// message is [`DlqReplayReport::error`].
    fn replay(
        &self,
        queue: &str,
        limit: usize,
        skip_unreplayable: bool,
        progress: &(dyn Fn(u64) + Sync),
    ) -> impl Future<Output = Result<DlqReplayReport, Self::Error>> + Send;

    /// Deletes every message ready in `queue`; returns how many.
    fn purge(&self, queue: &str) -> impl Future<Output = Result<u64, Self::Error>> + Send;
}

/// A replay of a dead-letter queue, as asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct DlqReplay {
    /// The dead-letter queue.
    pub queue: String,
    /// At most this many messages (default: as many as the queue holds
    /// when the replay starts; copies that fail again and return to its
    /// tail are not replayed twice in one run).
    #[serde(default)]
    pub limit: Option<usize>,
    /// Move messages that cannot be sent back (no known origin, origin
    /// queue gone) to the queue's tail and go on, instead of stopping at
    /// the first.
    #[serde(default)]
    pub skip_unreplayable: bool,
    /// Only count.
    #[serde(default)]
    pub dry_run: bool,
}

impl DlqReplay {
    /// Every message of `queue`, stopping at the first that cannot be sent
    /// back.
    pub fn new(queue: impl Into<String>) -> Self {
        DlqReplay {
            queue: queue.into(),
            limit: None,
            skip_unreplayable: false,
            dry_run: false,
        }
    }

    /// At most `limit` messages.
    #[must_use]
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = Some(limit);
        self
    }

    /// See [`skip_unreplayable`](Self::skip_unreplayable).
    #[must_use]
    pub fn skipping_unreplayable(mut self, skip: bool) -> Self {
        self.skip_unreplayable = skip;
        self
    }

    /// See [`dry_run`](Self::dry_run).
    #[must_use]
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }
}

/// What a [`DeadLetters::replay`] did (or, in a dry run, found).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DlqReplayOutcome {
    /// The dead-letter queue.
    pub queue: String,
    /// Only counted.
    pub dry_run: bool,
    /// Messages in the queue when it started.
    pub depth: u32,
    /// What moved, and why it stopped early if it did.
    #[serde(flatten)]
    pub report: DlqReplayReport,
    /// Records marked replayed in the store.
    pub marked: u64,
    /// The audit row (`None` in a dry run).
    pub audit_id: Option<i64>,
}

/// A purge of a dead-letter queue, as asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct DlqPurge {
    /// The dead-letter queue.
    pub queue: String,
    /// The consumer queues that dead-letter into it, whose open records
    /// are marked purged (default: `queue` without its `.dead` suffix, as
    /// [`QueueTopology`] names them; name every one for a shared
    /// dead-letter queue).
    ///
    /// [`QueueTopology`]: https://docs.rs/outbox-lapin/latest/outbox_lapin/struct.QueueTopology.html
    #[serde(default)]
    pub origins: Vec<String>,
    /// Only count.
    #[serde(default)]
    pub dry_run: bool,
}

impl DlqPurge {
    /// Every message of `queue`; its origin from the name.
    pub fn new(queue: impl Into<String>) -> Self {
        DlqPurge {
            queue: queue.into(),
            origins: Vec::new(),
            dry_run: false,
        }
    }

    /// The consumer queues whose records to mark purged.
    #[must_use]
    pub fn origins<I, Q>(mut self, origins: I) -> Self
    where
        I: IntoIterator<Item = Q>,
        Q: Into<String>,
    {
        self.origins = origins.into_iter().map(Into::into).collect();
        self
    }

    /// See [`dry_run`](Self::dry_run).
    #[must_use]
    pub fn dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// The origins asked for, else the one the queue's name implies.
    fn resolved_origins(&self) -> Option<Vec<String>> {
        if !self.origins.is_empty() {
            return Some(self.origins.clone());
        }
        self.queue
            .strip_suffix(".dead")
            .filter(|origin| !origin.is_empty())
            .map(|origin| vec![origin.to_owned()])
    }
}

/// What a [`DeadLetters::purge`] did (or, in a dry run, found).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DlqPurgeOutcome {
    /// The dead-letter queue.
    pub queue: String,
    /// The consumer queues whose records were marked.
    pub origins: Vec<String>,
    /// Only counted.
    pub dry_run: bool,
    /// Messages in the queue when it started.
    pub depth: u32,
    /// Messages deleted.
    pub purged: u64,
    /// Records marked purged in the store.
    pub marked: u64,
    /// The audit row (`None` in a dry run).
    pub audit_id: Option<i64>,
}

/// Consumers' dead letters as admin verbs: it drives a
/// [`DeadLetterStore`] (the records consumers write when they dead-letter a
/// message: listed and grouped without touching the queue) and a
/// [`DeadLetterBroker`] (the dead-letter queues themselves: replayed and
/// purged there). The `outbox` CLI's `dlq` commands and the admin router's
/// `/dead-letters` endpoints are both thin shells over it.
///
/// Implementations: `outbox_diesel::PgDeadLetters` (store) and
/// `outbox_lapin::DeadLetterQueues` (broker).
///
/// # What a replay guarantees
/// Each message is published to the queue it came from and confirmed there
/// before it is acked in the dead-letter queue, so a replay killed at any
/// point loses nothing (at worst a message is in both queues, and the
/// consumer's inbox drops the second copy). It runs in chunks; after each,
/// the records of the moved messages are marked replayed and the audit
/// row's count is brought up to date, so a replay killed half way leaves an
/// audit row (written before the first message moved) that says how far it
/// got, and at most one chunk of moved messages still shown as open.
#[derive(Debug, Clone)]
pub struct DeadLetters<S, B> {
    store: S,
    broker: B,
    chunk_size: usize,
}

impl<S: DeadLetterStore, B: DeadLetterBroker> DeadLetters<S, B> {
    /// The verbs over `store` and `broker`; replays in chunks of 100.
    pub fn new(store: S, broker: B) -> Self {
        DeadLetters {
            store,
            broker,
            chunk_size: 100,
        }
    }

    /// Messages moved between two updates of the records and the audit row
    /// (default 100, at least 1): a replay killed half way leaves at most
    /// this many moved messages shown as open.
    #[must_use]
    pub fn chunk_size(mut self, n: usize) -> Self {
        self.chunk_size = n.max(1);
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The broker.
    pub fn broker(&self) -> &B {
        &self.broker
    }

    /// A page of records (see [`DeadLetterStore::list`]).
    ///
    /// # Errors
    /// [`AdminError::Invalid`] for a `limit` of 0 or over 10,000 or a
    /// queue name with a NUL; [`AdminError::Store`].
    pub async fn list(
        &self,
        queue: Option<&str>,
        after: Option<i64>,
        limit: usize,
        include_settled: bool,
    ) -> Result<Page<DeadLetterRecord>, AdminError> {
        if !(1..=10_000).contains(&limit) {
            return Err(AdminError::Invalid(format!(
                "limit must be between 1 and 10000, not {limit}"
            )));
        }
        if let Some(queue) = queue {
            check_name("queue", queue)?;
        }
        self.store
            .list(queue, after, limit, include_settled)
            .await
            .map_err(AdminError::store)
    }

    /// One record.
    ///
    /// # Errors
    /// [`AdminError::NotFound`]; [`AdminError::Store`].
    pub async fn show(&self, id: i64) -> Result<DeadLetterRecord, AdminError> {
        self.store
            .show(id)
            .await
            .map_err(AdminError::store)?
            .ok_or_else(|| AdminError::NotFound(format!("no dead letter has the id {id}")))
    }

    /// Open records grouped (see [`DeadLetterStore::groups`]).
    ///
    /// # Errors
    /// [`AdminError::Invalid`] for a queue name with a NUL;
    /// [`AdminError::Store`].
    pub async fn groups(&self, queue: Option<&str>) -> Result<Vec<DeadLetterGroup>, AdminError> {
        if let Some(queue) = queue {
            check_name("queue", queue)?;
        }
        self.store.groups(queue).await.map_err(AdminError::store)
    }

    /// Sends the messages of a dead-letter queue back to the queues they
    /// came from (see the [type docs](Self)); `progress` gets the count
    /// of messages taken so far. A replay that stops on a message answers
    /// `Ok` with the reason in [`DlqReplayReport::error`]: what moved
    /// before it is done and counted.
    ///
    /// # Errors
    /// [`AdminError::Forbidden`] for a read-only caller;
    /// [`AdminError::Invalid`] for an empty or invalid queue name or a
    /// limit of 0; [`AdminError::Broker`] when the queue cannot be read
    /// (before anything moved); [`AdminError::Store`] when the audit row
    /// cannot be written (before anything moved).
    pub async fn replay(
        &self,
        caller: &Caller,
        request: &DlqReplay,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<DlqReplayOutcome, AdminError> {
        authorize(caller, "dlq replay")?;
        let queue = request.queue.as_str();
        check_name("queue", queue)?;
        if request.limit == Some(0) {
            return Err(AdminError::Invalid(
                "limit must be at least 1 (leave it out for every message)".into(),
            ));
        }
        let depth = self.depth(queue).await?;
        let mut outcome = DlqReplayOutcome {
            queue: queue.to_owned(),
            dry_run: request.dry_run,
            depth,
            report: DlqReplayReport::default(),
            marked: 0,
            audit_id: None,
        };
        if request.dry_run {
            return Ok(outcome);
        }
        // At most what the queue held at the start: a copy that fails again
        // at once comes back to its tail and must not be replayed forever.
        let total = request
            .limit
            .map_or(depth as usize, |limit| limit.min(depth as usize));
        let target = serde_json::json!({
            "queue": queue,
            "limit": request.limit,
            "skip_unreplayable": request.skip_unreplayable,
        });
        let audit = self.begin(caller, "dlq_replay", target).await?;
        outcome.audit_id = Some(audit);
        while outcome.report.handled() < total {
            let this = (total - outcome.report.handled()).min(self.chunk_size);
            let before = outcome.report.handled() as u64;
            let part = match self
                .broker
                .replay(queue, this, request.skip_unreplayable, &|n| {
                    progress(before + n);
                })
                .await
            {
                Ok(part) => part,
                Err(error) => {
                    outcome.report.error = Some(format!("the broker failed: {error}"));
                    break;
                }
            };
            let moved = part.handled();
            match self.store.mark_replayed(&part.messages).await {
                Ok(n) => outcome.marked += n,
                Err(error) => {
                    let n = part.messages.len();
                    outcome.report.extend(part);
                    outcome.report.error = Some(format!(
                        "the last {n} replayed message(s) were sent back, but marking their \
                         records failed ({error}): the dead-letter list still shows them open"
                    ));
                    break;
                }
            }
            outcome.report.extend(part);
            if let Err(error) = self
                .store
                .record_audit(audit, outcome.report.replayed, None)
                .await
            {
                tracing::warn!(%error, audit, "outbox admin: updating a dlq replay's audit row failed");
            }
            if outcome.report.error.is_some() || moved < this {
                break;
            }
        }
        self.end(
            audit,
            outcome.report.replayed,
            outcome.report.error.as_deref(),
        )
        .await;
        tracing::info!(
            queue,
            replayed = outcome.report.replayed,
            skipped = outcome.report.skipped.len(),
            marked = outcome.marked,
            stopped = outcome.report.error.is_some(),
            audit,
            "outbox admin: dlq replay ended"
        );
        Ok(outcome)
    }

    /// Deletes every message of a dead-letter queue and marks the open
    /// records of its origin queues recorded before it began purged
    /// (letters that arrive meanwhile stay open).
    ///
    /// # Errors
    /// [`AdminError::Forbidden`] for a read-only caller;
    /// [`AdminError::Invalid`] for an invalid queue name, or a queue whose
    /// name does not end in `.dead` without origins;
    /// [`AdminError::Broker`]; [`AdminError::Store`] (when marking fails
    /// after the purge, the message says so).
    pub async fn purge(
        &self,
        caller: &Caller,
        request: &DlqPurge,
    ) -> Result<DlqPurgeOutcome, AdminError> {
        authorize(caller, "dlq purge")?;
        let queue = request.queue.as_str();
        check_name("queue", queue)?;
        let Some(origins) = request.resolved_origins() else {
            return Err(AdminError::Invalid(format!(
                "`{queue}` does not end in `.dead`: name the consumer queues that dead-letter \
                 into it (origins), whose records to mark purged"
            )));
        };
        for origin in &origins {
            check_name("origin", origin)?;
        }
        let depth = self.depth(queue).await?;
        let mut outcome = DlqPurgeOutcome {
            queue: queue.to_owned(),
            origins,
            dry_run: request.dry_run,
            depth,
            purged: 0,
            marked: 0,
            audit_id: None,
        };
        if request.dry_run {
            return Ok(outcome);
        }
        let target = serde_json::json!({ "queue": queue, "origins": outcome.origins });
        let audit = self.begin(caller, "dlq_purge", target).await?;
        outcome.audit_id = Some(audit);
        let result = self.purge_and_mark(queue, &mut outcome).await;
        let failure = result.as_ref().err().map(ToString::to_string);
        self.end(audit, outcome.purged, failure.as_deref()).await;
        result.map(|()| outcome)
    }

    /// Writes the audit row of `action` on `target` before it acts.
    async fn begin(
        &self,
        caller: &Caller,
        action: &str,
        target: serde_json::Value,
    ) -> Result<i64, AdminError> {
        let entry = AuditEntry::new(&caller.identity, action, target);
        let audit = self
            .store
            .begin_audit(&entry)
            .await
            .map_err(AdminError::store)?;
        tracing::info!(identity = %caller.identity, action, target = %entry.target, audit, "outbox admin: {action}");
        Ok(audit)
    }

    /// Ends the audit row with its count and `done`, or `failed: <why>`; a
    /// failure to write it is logged (what it records is done).
    async fn end(&self, audit: i64, count: u64, failure: Option<&str>) {
        let outcome = failure.map_or_else(|| "done".to_owned(), |why| format!("failed: {why}"));
        if let Err(error) = self.store.record_audit(audit, count, Some(&outcome)).await {
            tracing::warn!(%error, audit, "outbox admin: recording how a dlq run ended failed");
        }
    }

    /// The messages ready in `queue`; [`AdminError::NotFound`] when the
    /// broker has no such queue.
    async fn depth(&self, queue: &str) -> Result<u32, AdminError> {
        self.broker
            .depth(queue)
            .await
            .map_err(AdminError::broker)?
            .ok_or_else(|| AdminError::NotFound(format!("the broker has no queue named `{queue}`")))
    }

    async fn purge_and_mark(
        &self,
        queue: &str,
        outcome: &mut DlqPurgeOutcome,
    ) -> Result<(), AdminError> {
        // Letters recorded after this are still in the queue after the purge.
        let before = self.store.now().await.map_err(AdminError::store)?;
        outcome.purged = self.broker.purge(queue).await.map_err(AdminError::broker)?;
        outcome.marked = self
            .store
            .mark_purged(&outcome.origins, before)
            .await
            .map_err(|error| {
                AdminError::Store(
                    format!(
                        "{} message(s) were purged from `{queue}`, but marking their records \
                         failed ({error}): the dead-letter list still shows them open",
                        outcome.purged
                    )
                    .into(),
                )
            })?;
        tracing::info!(
            queue,
            purged = outcome.purged,
            marked = outcome.marked,
            "outbox admin: dlq purge ended"
        );
        Ok(())
    }
}

fn authorize(caller: &Caller, action: &'static str) -> Result<(), AdminError> {
    if caller.may_act() {
        Ok(())
    } else {
        Err(AdminError::Forbidden {
            identity: caller.identity.clone(),
            action,
        })
    }
}

/// A queue name the broker accepts: 1 to 255 bytes, no NUL.
fn check_name(what: &str, name: &str) -> Result<(), AdminError> {
    if name.is_empty() || name.len() > 255 || name.contains('\0') {
        return Err(AdminError::Invalid(format!(
            "the {what} name must be 1 to 255 bytes without NUL characters"
        )));
    }
    Ok(())
}
