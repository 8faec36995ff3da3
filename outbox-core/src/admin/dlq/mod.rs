//! [`DeadLetters`]: consumers' dead letters as admin verbs.
//!
//! This file holds the service; the parts:
//! - `request.rs`: what is asked and answered: [`DeadLetterQuery`],
//!   [`DlqReplay`] and [`DlqPurge`], their outcomes;
//! - `backend.rs`: what the service runs on: [`DeadLetterStore`] (the
//!   records), [`DeadLetterBroker`] and [`DeadLetterSession`] (the queues).

mod backend;
mod request;

pub use backend::{DeadLetterBroker, DeadLetterSession, DeadLetterStore, QueueDepth};
pub use request::{DeadLetterQuery, DlqPurge, DlqPurgeOutcome, DlqReplay, DlqReplayOutcome};

use super::{
    AdminError, AuditEntry, Caller, DeadLetterGroup, DeadLetterRecord, DlqReplayReport, Page,
    StopCause,
};

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
