//! [`DeadLetters`]: consumers' dead letters as admin verbs.

use std::future::Future;

use serde::{Deserialize, Serialize};

use super::{
    AdminError, AuditEntry, Caller, DeadLetterGroup, DeadLetterRecord, DlqReplayReport, Page,
    ReplayedMessage, StopCause,
};

/// Which dead-letter records to list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DeadLetterQuery {
    /// Only those a consumer read from this queue (its own queue, not the
    /// dead-letter queue).
    pub queue: Option<String>,
    /// Only records with a greater id (the previous page's `next`).
    pub after: Option<i64>,
    /// At most this many (1 to 10,000).
    pub limit: usize,
    /// Replayed and purged ones too.
    pub include_settled: bool,
    /// Read payloads and headers (when `false` they are left out, the
    /// records [redacted](DeadLetterRecord::redacted), and not read at all).
    pub payloads: bool,
}

impl DeadLetterQuery {
    /// Open records of every queue, the first 100, with payloads.
    pub fn new() -> Self {
        DeadLetterQuery {
            queue: None,
            after: None,
            limit: 100,
            include_settled: false,
            payloads: true,
        }
    }

    /// Only those a consumer read from `queue`.
    #[must_use]
    pub fn queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// After the cursor `after`.
    #[must_use]
    pub fn after(mut self, after: Option<i64>) -> Self {
        self.after = after;
        self
    }

    /// At most `limit`.
    #[must_use]
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Replayed and purged ones too.
    #[must_use]
    pub fn include_settled(mut self, include: bool) -> Self {
        self.include_settled = include;
        self
    }

    /// With payloads and headers, or without.
    #[must_use]
    pub fn payloads(mut self, payloads: bool) -> Self {
        self.payloads = payloads;
        self
    }
}

impl Default for DeadLetterQuery {
    fn default() -> Self {
        Self::new()
    }
}

/// Where inbox consumers record the messages they dead-letter
/// ([`InboxDatabase::record_dead_letter`](crate::InboxDatabase::record_dead_letter)),
/// with the audit trail of the verbs that act on them.
pub trait DeadLetterStore: Send + Sync + 'static {
    /// The store's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// A page of records in `id` (recording) order.
    fn list(
        &self,
        query: &DeadLetterQuery,
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
    /// own id where it has one; otherwise one open record without such an
    /// id, of its event in the queue it went back to, per message. Returns
    /// how many records.
    fn mark_replayed(
        &self,
        messages: &[ReplayedMessage],
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send;

    /// The greatest record id so far: read before a purge, the records up
    /// to it are of messages that were in the queue when it was purged.
    fn watermark(&self) -> impl Future<Output = Result<i64, Self::Error>> + Send;

    /// Marks the open records of the consumer queues `queues` with an id up
    /// to `watermark` purged. Returns how many records.
    fn mark_purged(
        &self,
        queues: &[String],
        watermark: i64,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send;

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

/// A queue as the broker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct QueueDepth {
    /// Messages ready to be taken.
    pub ready: u64,
    /// Consumers attached: a dead-letter queue has none, unless a replay of
    /// it is running.
    pub consumers: u32,
}

impl QueueDepth {
    /// A depth.
    pub fn new(ready: u64, consumers: u32) -> Self {
        QueueDepth { ready, consumers }
    }
}

/// The broker side: dead-letter queues to inspect, replay and purge.
pub trait DeadLetterBroker: Send + Sync + 'static {
    /// The broker's error.
    type Error: std::error::Error + Send + Sync + 'static;
    /// A replay's hold on one queue.
    type Session: DeadLetterSession<Error = Self::Error>;

    /// The queue's depth and consumers; `None` when there is no such queue.
    fn inspect(
        &self,
        queue: &str,
    ) -> impl Future<Output = Result<Option<QueueDepth>, Self::Error>> + Send;

    /// Takes `queue` for a replay: its only reader until the session is
    /// closed. `None` when another reader holds it (e.g. another replay).
    fn open(
        &self,
        queue: &str,
    ) -> impl Future<Output = Result<Option<Self::Session>, Self::Error>> + Send;

    /// Deletes every message ready in `queue`; returns how many.
    fn purge(&self, queue: &str) -> impl Future<Output = Result<u64, Self::Error>> + Send;
}

/// A replay's exclusive hold on a dead-letter queue
/// ([`DeadLetterBroker::open`]).
pub trait DeadLetterSession: Send {
    /// The broker's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Takes up to `limit` messages, one at a time, and sends each back to
    /// the queue it was dead-lettered from, confirmed there before it is
    /// acked. A message that cannot go back stops the replay (it stays in
    /// the queue), or, with [`DlqReplay::skip_unreplayable`], moves to the
    /// queue's tail (confirmed, then acked) and the replay goes on; a
    /// message with no sign of having been dead-lettered always stops it.
    /// `progress` gets the count of messages taken so far.
    ///
    /// An `Err` means nothing was taken; a stop on a message is
    /// [`DlqReplayReport::error`].
    fn replay(
        &mut self,
        limit: usize,
        request: &DlqReplay,
        progress: &(dyn Fn(u64) + Sync),
    ) -> impl Future<Output = Result<DlqReplayReport, Self::Error>> + Send;

    /// Lets the queue go.
    fn close(self) -> impl Future<Output = ()> + Send;
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
    /// Move messages that cannot go back (no known origin, origin queue
    /// gone) to the queue's tail and go on, instead of stopping at the
    /// first. A message with no sign of having been dead-lettered still
    /// stops the replay: the queue may be a live one.
    #[serde(default)]
    pub skip_unreplayable: bool,
    /// Only count.
    #[serde(default)]
    pub dry_run: bool,
}

impl DlqReplay {
    /// Every message of `queue`, stopping at the first that cannot go back.
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
    pub fn skip_unreplayable(mut self, skip: bool) -> Self {
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
    /// Messages ready in the queue when it started.
    pub depth: u64,
    /// Consumers of the queue when it started (a dry run reports them; a
    /// replay refuses a queue that has any).
    pub consumers: u32,
    /// What moved, and why it stopped early if it did.
    #[serde(flatten)]
    pub report: DlqReplayReport,
    /// Records marked replayed in the store.
    pub marked: u64,
    /// The audit row (`None` in a dry run or when there was nothing to
    /// replay).
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
    /// Messages ready in the queue when it started.
    pub depth: u64,
    /// Consumers of the queue when it started (a dry run reports them; a
    /// purge refuses a queue that has any).
    pub consumers: u32,
    /// Messages deleted.
    pub purged: u64,
    /// Records marked purged in the store.
    pub marked: u64,
    /// The audit row (`None` in a dry run).
    pub audit_id: Option<i64>,
    /// What the operator should know (e.g. the purge is done but marking
    /// the records failed).
    pub warnings: Vec<String>,
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
/// - **Nothing is lost.** Each message is published to the queue it came
///   from and confirmed there before it is acked in the dead-letter queue,
///   so a replay killed at any point leaves a message in one queue or, at
///   worst, in both (the consumer's inbox drops the second copy).
/// - **One replay of a queue at a time, and only of a dead-letter queue.**
///   A replay holds the queue as its only reader (an exclusive consumer in
///   RabbitMQ) until it ends; a queue with consumers is refused (another
///   replay runs, or it is a live queue), and so is a message that carries
///   no sign of having been dead-lettered.
/// - **Bounded.** At most the messages the queue held at the start: copies
///   that fail again and return to its tail wait for the next run.
/// - **Accounted for.** The audit row is written before the first message
///   moves; after each chunk the moved messages' records are marked
///   replayed and the row's count brought up to date, so a replay killed
///   half way leaves a row that says how far it got, and at most one chunk
///   of moved messages still listed open.
///
/// Broker and store failures are logged in full; the audit row and the
/// outcome's `error` say which failed, without the driver's text (which
/// may name hosts and users) in the audit row.
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
    /// this many moved messages listed open.
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

    /// A page of records.
    ///
    /// # Errors
    /// [`AdminError::Invalid`] for a `limit` of 0 or over 10,000 or a
    /// queue name with a NUL; [`AdminError::Store`].
    pub async fn list(
        &self,
        query: &DeadLetterQuery,
    ) -> Result<Page<DeadLetterRecord>, AdminError> {
        super::service::check_limit(query.limit)?;
        if let Some(queue) = &query.queue {
            check_name("queue", queue)?;
        }
        self.store.list(query).await.map_err(AdminError::store)
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
    /// came from (see the [type docs](Self)); `progress` gets the count of
    /// messages taken so far. A replay that stops on a message, or whose
    /// broker or store fails part way, answers `Ok` with the reason in
    /// [`DlqReplayReport::error`] and its cause in
    /// [`DlqReplayReport::stopped_by`]: what moved before is done and
    /// counted.
    ///
    /// # Errors
    /// Before anything moved: [`AdminError::Forbidden`] for a read-only
    /// caller; [`AdminError::Invalid`] for an empty or invalid queue name
    /// or a limit of 0; [`AdminError::NotFound`] when the broker has no
    /// such queue; [`AdminError::Conflict`] when the queue has consumers
    /// (another replay, or a live queue; a dry run reports them instead);
    /// [`AdminError::Broker`];
    /// [`AdminError::Store`] when the audit row cannot be written.
    pub async fn replay(
        &self,
        caller: &Caller,
        request: &DlqReplay,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<DlqReplayOutcome, AdminError> {
        caller.authorize("dlq replay")?;
        let queue = request.queue.as_str();
        check_name("queue", queue)?;
        if request.limit == Some(0) {
            return Err(AdminError::Invalid(
                "limit must be at least 1 (leave it out for every message)".into(),
            ));
        }
        let depth = self.depth(queue).await?;
        if !request.dry_run {
            idle(queue, depth, "replay")?;
        }
        let mut outcome = DlqReplayOutcome {
            queue: queue.to_owned(),
            dry_run: request.dry_run,
            depth: depth.ready,
            consumers: depth.consumers,
            report: DlqReplayReport::default(),
            marked: 0,
            audit_id: None,
        };
        // At most what the queue held at the start: a copy that fails again
        // at once comes back to its tail and must not be replayed forever.
        let total = request.limit.map_or(depth.ready, |limit| {
            (u64::try_from(limit).unwrap_or(u64::MAX)).min(depth.ready)
        });
        if request.dry_run || total == 0 {
            return Ok(outcome);
        }
        let Some(mut session) = self.broker.open(queue).await.map_err(AdminError::broker)? else {
            return Err(busy(queue));
        };
        let target = serde_json::json!({
            "queue": queue,
            "limit": request.limit,
            "skip_unreplayable": request.skip_unreplayable,
        });
        let audit = match self.begin(caller, "dlq_replay", target).await {
            Ok(audit) => audit,
            Err(error) => {
                session.close().await;
                return Err(error);
            }
        };
        outcome.audit_id = Some(audit);
        let total = usize::try_from(total).unwrap_or(usize::MAX);
        while outcome.report.handled() < total {
            let this = (total - outcome.report.handled()).min(self.chunk_size);
            let before = outcome.report.handled() as u64;
            let part = match session
                .replay(this, request, &|n| progress(before + n))
                .await
            {
                Ok(part) => part,
                Err(error) => {
                    outcome
                        .report
                        .stop(StopCause::Broker, format!("the broker failed: {error}"));
                    break;
                }
            };
            let taken = part.handled();
            match self.store.mark_replayed(&part.messages).await {
                Ok(n) => {
                    outcome.marked += n;
                    outcome.report.extend(part);
                }
                Err(error) => {
                    let n = part.messages.len();
                    outcome.report.extend(part);
                    let marking = format!(
                        "the last {n} replayed message(s) went back, but marking their records \
                         failed ({error}): the dead-letter list still shows them open"
                    );
                    // A stop on a message in this chunk stays the cause.
                    match outcome.report.error.take() {
                        Some(first) => {
                            outcome.report.error = Some(format!("{first}; and {marking}"))
                        }
                        None => outcome.report.stop(StopCause::Store, marking),
                    }
                }
            }
            let count = outcome.report.handled() as u64;
            if let Err(error) = self.store.record_audit(audit, count, None).await {
                tracing::warn!(%error, audit, "outbox admin: updating a dlq replay's audit row failed");
            }
            if outcome.report.error.is_some() || taken < this {
                break;
            }
        }
        session.close().await;
        let report = &outcome.report;
        let done = format!(
            "{} replayed, {} skipped, {} record(s) marked",
            report.replayed,
            report.skipped.len(),
            outcome.marked
        );
        self.end(
            audit,
            report.handled() as u64,
            &done,
            report.stopped_by.zip(report.error.as_deref()),
        )
        .await;
        Ok(outcome)
    }

    /// Deletes every message of a dead-letter queue and marks the open
    /// records of its origin queues recorded before it began purged
    /// (letters recorded meanwhile stay open).
    ///
    /// # Errors
    /// Before anything was deleted: [`AdminError::Forbidden`] for a
    /// read-only caller; [`AdminError::Invalid`] for an invalid queue name,
    /// origins that name the queue itself, or a queue whose name does not
    /// end in `.dead` without origins; [`AdminError::NotFound`];
    /// [`AdminError::Conflict`] when the queue has consumers (a dry run
    /// reports them instead);
    /// [`AdminError::Broker`]; [`AdminError::Store`]. When the purge is done
    /// but marking the records fails, the outcome says so in
    /// [`warnings`](DlqPurgeOutcome::warnings).
    pub async fn purge(
        &self,
        caller: &Caller,
        request: &DlqPurge,
    ) -> Result<DlqPurgeOutcome, AdminError> {
        caller.authorize("dlq purge")?;
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
            if origin == queue {
                return Err(AdminError::Invalid(format!(
                    "`{queue}` is named as its own origin: purge the dead-letter queue, and name \
                     the consumer queues that dead-letter into it as origins"
                )));
            }
        }
        let depth = self.depth(queue).await?;
        if !request.dry_run {
            idle(queue, depth, "purge")?;
        }
        let mut outcome = DlqPurgeOutcome {
            queue: queue.to_owned(),
            origins,
            dry_run: request.dry_run,
            depth: depth.ready,
            consumers: depth.consumers,
            purged: 0,
            marked: 0,
            audit_id: None,
            warnings: Vec::new(),
        };
        if request.dry_run {
            return Ok(outcome);
        }
        let target = serde_json::json!({ "queue": queue, "origins": outcome.origins });
        let audit = self.begin(caller, "dlq_purge", target).await?;
        outcome.audit_id = Some(audit);
        // Records up to this are of letters in the queue before the purge.
        let watermark = match self.store.watermark().await {
            Ok(watermark) => watermark,
            Err(error) => {
                let error = AdminError::store(error);
                self.end(audit, 0, "", Some((StopCause::Store, &error.to_string())))
                    .await;
                return Err(error);
            }
        };
        outcome.purged = match self.broker.purge(queue).await {
            Ok(purged) => purged,
            Err(error) => {
                let error = AdminError::broker(error);
                self.end(audit, 0, "", Some((StopCause::Broker, &error.to_string())))
                    .await;
                return Err(error);
            }
        };
        let mut done = format!("{} purged", outcome.purged);
        match self.store.mark_purged(&outcome.origins, watermark).await {
            Ok(marked) => {
                outcome.marked = marked;
                done.push_str(&format!(", {marked} record(s) marked"));
            }
            Err(error) => {
                tracing::error!(%error, queue, audit, "outbox admin: the dlq purge is done but marking its records failed");
                done.push_str("; marking the records failed (see the log)");
                outcome.warnings.push(format!(
                    "{} message(s) were purged from `{queue}` (done: do not purge again for \
                     them), but marking their records failed (see the log): the dead-letter \
                     list still shows them open",
                    outcome.purged
                ));
            }
        }
        self.end(audit, outcome.purged, &done, None).await;
        tracing::info!(
            queue,
            purged = outcome.purged,
            marked = outcome.marked,
            audit,
            "outbox admin: dlq purge ended"
        );
        Ok(outcome)
    }

    /// The queue's depth; [`AdminError::NotFound`] when there is no such
    /// queue.
    async fn depth(&self, queue: &str) -> Result<QueueDepth, AdminError> {
        self.broker
            .inspect(queue)
            .await
            .map_err(AdminError::broker)?
            .ok_or_else(|| AdminError::NotFound(format!("the broker has no queue named `{queue}`")))
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

    /// Ends the audit row with its count and `done: <what>`, or `failed:
    /// <why>` (broker and store failures by name only: their text, which
    /// may name hosts and users, goes to the log). A failure to write it is
    /// logged: what it records is done.
    async fn end(&self, audit: i64, count: u64, done: &str, failed: Option<(StopCause, &str)>) {
        let outcome = match failed {
            None => format!("done: {done}"),
            Some((cause, error)) => {
                tracing::warn!(audit, ?cause, error, "outbox admin: a dlq run stopped");
                match cause {
                    StopCause::Unreplayable => format!("failed: {error}"),
                    StopCause::Broker => "failed: the broker failed (see the log)".to_owned(),
                    StopCause::Store => "failed: the store failed (see the log)".to_owned(),
                }
            }
        };
        if let Err(error) = self.store.record_audit(audit, count, Some(&outcome)).await {
            tracing::warn!(%error, audit, "outbox admin: recording how a dlq run ended failed");
        }
    }
}

/// [`AdminError::Conflict`] for a queue with consumers.
fn idle(queue: &str, depth: QueueDepth, verb: &str) -> Result<(), AdminError> {
    if depth.consumers > 0 {
        return Err(AdminError::Conflict(format!(
            "`{queue}` has {} consumer(s): a replay of it is running, or it is not a dead-letter \
             queue (nothing consumes those); {verb} only a dead-letter queue nothing reads",
            depth.consumers
        )));
    }
    Ok(())
}

/// Another reader holds the queue.
fn busy(queue: &str) -> AdminError {
    AdminError::Conflict(format!(
        "`{queue}` is held by another reader (a replay of it is running): try again when it ends"
    ))
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
