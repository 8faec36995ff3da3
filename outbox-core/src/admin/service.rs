//! [`Admin`]: chunked, audited, permission-checked admin verbs over any
//! [`OutboxAdmin`].

use std::time::Duration;

use chrono::Utc;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{
    AuditEntry, AuditRecord, Caller, Chunk, EventDetail, EventFilter, EventSummary, FailureGroup,
    OutboxAdmin, Page, RelayInfo, StatusReport,
};
use crate::EventStatus;

/// Why an admin call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// The request makes no sense (an empty selection for a mutation, a
    /// status a verb cannot change, ...). The message says what to change.
    #[error("{0}")]
    Invalid(String),
    /// The caller may only read.
    #[error("{identity} may only read; {action} needs the operator role")]
    Forbidden {
        /// Who asked.
        identity: String,
        /// What they asked for.
        action: &'static str,
    },
    /// No such event, aggregate, relay, dead letter or queue.
    #[error("{0}")]
    NotFound(String),
    /// The request clashes with what is running (e.g. a replay of the same
    /// dead-letter queue). The message says what.
    #[error("{0}")]
    Conflict(String),
    /// The store failed.
    #[error("the outbox store failed: {0}")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The broker failed (dead-letter queues).
    #[error("the broker failed: {0}")]
    Broker(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl AdminError {
    pub(crate) fn store<E: std::error::Error + Send + Sync + 'static>(error: E) -> Self {
        AdminError::Store(Box::new(error))
    }

    pub(crate) fn broker<E: std::error::Error + Send + Sync + 'static>(error: E) -> Self {
        AdminError::Broker(Box::new(error))
    }
}

/// What to purge.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PurgeTarget {
    /// `sent` and `skipped` events (never `dead` ones) with their attempt
    /// history.
    Sent,
    /// Inbox entries.
    Inbox,
}

/// What a mutation did (or, in a dry run, would do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ActionReport {
    /// The verb.
    pub action: String,
    /// Only counted, nothing changed.
    pub dry_run: bool,
    /// Events (or entries) selected when it started.
    pub matched: u64,
    /// Events (or entries) changed: those of `matched` that still matched
    /// when their chunk ran (see the [module docs](super), "Runs are
    /// bounded when they start", for the one case where it can be more).
    pub changed: u64,
    /// The audit row (`None` in a dry run).
    pub audit_id: Option<i64>,
    /// What the operator should know (e.g. events older than the dedup
    /// window).
    pub warnings: Vec<String>,
}

/// The admin verbs over a store: see the [module docs](super).
#[derive(Debug, Clone)]
pub struct Admin<S> {
    store: S,
    chunk_size: usize,
    chunk_pause: Duration,
    dedup_window: Duration,
}

impl<S: OutboxAdmin> Admin<S> {
    /// Admin verbs over `store`: chunks of 500, no pause between chunks,
    /// a dedup window of 14 days.
    pub fn new(store: S) -> Self {
        Admin {
            store,
            chunk_size: 500,
            chunk_pause: Duration::ZERO,
            dedup_window: Duration::from_secs(14 * 24 * 3600),
        }
    }

    /// Rows changed per transaction (default 500, at least 1).
    #[must_use]
    pub fn chunk_size(mut self, n: usize) -> Self {
        self.chunk_size = n.max(1);
        self
    }

    /// Pause between chunks (default none).
    #[must_use]
    pub fn chunk_pause(mut self, pause: Duration) -> Self {
        self.chunk_pause = pause;
        self
    }

    /// How long consumers keep inbox entries (default 14 days, the
    /// janitor's default inbox retention): a replay of events older than
    /// this warns that consumers may process them again.
    #[must_use]
    pub fn dedup_window(mut self, window: Duration) -> Self {
        self.dedup_window = window;
        self
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The outbox at a glance.
    ///
    /// # Errors
    /// [`AdminError::Store`].
    pub async fn status(&self) -> Result<StatusReport, AdminError> {
        self.store.status().await.map_err(AdminError::store)
    }

    /// A page of events matching `filter` after the cursor `after`.
    ///
    /// # Errors
    /// [`AdminError::Invalid`] for a `limit` of 0 or over 10,000;
    /// [`AdminError::Store`].
    pub async fn list(
        &self,
        filter: &EventFilter,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Page<EventSummary>, AdminError> {
        check_limit(limit)?;
        Self::check_text(filter)?;
        self.store
            .list(filter, after, limit)
            .await
            .map_err(AdminError::store)
    }

    /// One event, whole.
    ///
    /// # Errors
    /// [`AdminError::NotFound`]; [`AdminError::Store`].
    pub async fn show(&self, id: Uuid) -> Result<EventDetail, AdminError> {
        self.store
            .show(id)
            .await
            .map_err(AdminError::store)?
            .ok_or_else(|| AdminError::NotFound(format!("no outbox event has the id {id}")))
    }

    /// Dead and retrying events grouped by event type and normalized error.
    ///
    /// # Errors
    /// [`AdminError::Store`].
    pub async fn failure_groups(
        &self,
        filter: &EventFilter,
    ) -> Result<Vec<FailureGroup>, AdminError> {
        Self::check_text(filter)?;
        self.store
            .failure_groups(filter)
            .await
            .map_err(AdminError::store)
    }

    /// Registered relays.
    ///
    /// # Errors
    /// [`AdminError::Store`].
    pub async fn relays(&self) -> Result<Vec<RelayInfo>, AdminError> {
        self.store.relays().await.map_err(AdminError::store)
    }

    /// The audit trail, newest first, rows with `id < before`.
    ///
    /// # Errors
    /// [`AdminError::Store`].
    pub async fn audit_log(
        &self,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<AuditRecord>, AdminError> {
        self.store
            .audit_log(before, limit.clamp(1, 10_000))
            .await
            .map_err(AdminError::store)
    }

    /// Replays the `dead` events matching `selection` (statuses other than
    /// `dead` in it are an error; none means `dead`), in chunks in `seq`
    /// order. An empty selection is refused: select everything dead with
    /// [`EventFilter::with_status`]`(Dead)`. `progress` is called with the
    /// count done after each chunk.
    ///
    /// The run is bounded when it starts (see the [module docs](super),
    /// "Runs are bounded when they start"): it counts and replays only
    /// events recorded before it began.
    ///
    /// # Errors
    /// [`AdminError::Forbidden`], [`AdminError::Invalid`], [`AdminError::Store`].
    pub async fn replay(
        &self,
        caller: &Caller,
        selection: &EventFilter,
        dry_run: bool,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<ActionReport, AdminError> {
        Self::authorize(caller, "replay")?;
        let filter = Self::selection(selection, &[EventStatus::Dead], "replay")?;
        let filter = self.up_to_now(filter).await?;
        let mut warnings = Vec::new();
        // A dedup window reaching before the calendar's start warns of nothing.
        if let Some(cutoff) = ago(self.dedup_window) {
            let mut old = filter.clone();
            old.occurred_before = Some(filter.occurred_before.map_or(cutoff, |b| b.min(cutoff)));
            let old = self.store.count(&old).await.map_err(AdminError::store)?;
            if old > 0 {
                warnings.push(format!(
                    "{old} of these events occurred more than {} ago, beyond the dedup window: \
                     a consumer whose inbox no longer holds an event's id processes it again",
                    humanize(self.dedup_window)
                ));
            }
        }
        self.run(
            caller,
            "replay",
            &filter,
            dry_run,
            warnings,
            progress,
            |after, audit| {
                self.store
                    .replay_chunk(&filter, after, self.chunk_size, audit)
            },
        )
        .await
    }

    /// Skips one event (`dead` or `retry`: it will never be published) and
    /// releases what it held back.
    ///
    /// # Errors
    /// [`AdminError::NotFound`] when no `dead` or `retry` event has that id;
    /// [`AdminError::Forbidden`], [`AdminError::Store`].
    pub async fn skip(
        &self,
        caller: &Caller,
        id: Uuid,
        dry_run: bool,
    ) -> Result<ActionReport, AdminError> {
        let filter = EventFilter::id(id)
            .with_status(EventStatus::Dead)
            .with_status(EventStatus::Retry);
        self.skip_filter(
            caller,
            filter,
            dry_run,
            format!("no dead or retrying event has the id {id}"),
        )
        .await
    }

    /// Skips the head of an aggregate when it holds the aggregate back
    /// (`dead` or `retry`), releasing the events behind it.
    ///
    /// # Errors
    /// [`AdminError::NotFound`] when the aggregate has no such head (nothing
    /// holds it back); [`AdminError::Forbidden`], [`AdminError::Store`].
    pub async fn skip_head(
        &self,
        caller: &Caller,
        aggregate_type: &str,
        aggregate_id: &str,
        dry_run: bool,
    ) -> Result<ActionReport, AdminError> {
        Self::authorize(caller, "skip")?;
        let head = self
            .store
            .head(aggregate_type, aggregate_id)
            .await
            .map_err(AdminError::store)?;
        let missing = || {
            AdminError::NotFound(format!(
                "nothing holds back the aggregate {aggregate_type}:{aggregate_id} (its first \
                 unsent event is not dead or retrying)"
            ))
        };
        let head = head.ok_or_else(missing)?;
        let filter = EventFilter::id(head.id)
            .with_status(EventStatus::Dead)
            .with_status(EventStatus::Retry);
        self.skip_filter(caller, filter, dry_run, missing().to_string())
            .await
    }

    async fn skip_filter(
        &self,
        caller: &Caller,
        filter: EventFilter,
        dry_run: bool,
        missing: String,
    ) -> Result<ActionReport, AdminError> {
        Self::authorize(caller, "skip")?;
        let filter = self.up_to_now(filter).await?;
        let report = self
            .run(
                caller,
                "skip",
                &filter,
                dry_run,
                Vec::new(),
                &|_| {},
                |after, audit| {
                    self.store
                        .skip_chunk(&filter, after, self.chunk_size, audit)
                },
            )
            .await?;
        if report.matched == 0 {
            return Err(AdminError::NotFound(missing));
        }
        Ok(report)
    }

    /// Makes the `retry` events matching `selection` due now (e.g. held
    /// unroutable events once their binding exists), among those recorded
    /// before the run began (see [`replay`](Self::replay)).
    ///
    /// # Errors
    /// [`AdminError::Forbidden`], [`AdminError::Invalid`], [`AdminError::Store`].
    pub async fn retry_now(
        &self,
        caller: &Caller,
        selection: &EventFilter,
        dry_run: bool,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<ActionReport, AdminError> {
        Self::authorize(caller, "retry_now")?;
        let filter = Self::selection(selection, &[EventStatus::Retry], "retry-now")?;
        let filter = self.up_to_now(filter).await?;
        self.run(
            caller,
            "retry_now",
            &filter,
            dry_run,
            Vec::new(),
            progress,
            |after, audit| {
                self.store
                    .retry_now_chunk(&filter, after, self.chunk_size, audit)
            },
        )
        .await
    }

    /// Deletes sent events (with their attempt history) or inbox entries
    /// older than `older_than`, in chunks. Dead events are never purged.
    /// The run is bounded when it starts by its cutoff, `older_than` before
    /// then, which every chunk's statement applies (it reports no count
    /// before it changes anything: `matched` is `changed`).
    ///
    /// # Errors
    /// [`AdminError::Forbidden`], [`AdminError::Store`].
    pub async fn purge(
        &self,
        caller: &Caller,
        target: PurgeTarget,
        older_than: Duration,
        dry_run: bool,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<ActionReport, AdminError> {
        let action = match target {
            PurgeTarget::Sent => "purge_sent",
            PurgeTarget::Inbox => "purge_inbox",
        };
        Self::authorize(caller, action)?;
        let before = ago(older_than).ok_or_else(|| {
            AdminError::Invalid(format!(
                "older than {} reaches before the calendar's start: give a shorter age",
                humanize(older_than)
            ))
        })?;
        if dry_run {
            // Counting what a purge would delete is a scan; say what it would
            // select instead of scanning a table of millions of rows twice.
            return Ok(ActionReport {
                action: action.to_owned(),
                dry_run: true,
                matched: 0,
                changed: 0,
                audit_id: None,
                warnings: vec![format!(
                    "a dry run does not count: the purge would delete {} before {before}",
                    match target {
                        PurgeTarget::Sent => "sent and skipped events published",
                        PurgeTarget::Inbox => "inbox entries received",
                    }
                )],
            });
        }
        let entry = AuditEntry::new(
            &caller.identity,
            action,
            serde_json::json!({ "older_than_seconds": older_than.as_secs(), "before": before }),
        );
        let audit = self
            .store
            .begin_audit(&entry)
            .await
            .map_err(AdminError::store)?;
        let run = async {
            let mut changed = 0;
            match target {
                PurgeTarget::Sent => {
                    let mut after = None;
                    loop {
                        let chunk = self
                            .store
                            .purge_sent_chunk(before, after, self.chunk_size, Some(audit))
                            .await
                            .map_err(AdminError::store)?;
                        changed += chunk.changed;
                        progress(changed);
                        match chunk.last {
                            Some(last) => after = Some(last),
                            None => break,
                        }
                        self.pause().await;
                    }
                }
                PurgeTarget::Inbox => loop {
                    let n = self
                        .store
                        .purge_inbox_chunk(before, self.chunk_size, Some(audit))
                        .await
                        .map_err(AdminError::store)?;
                    changed += n;
                    progress(changed);
                    if n < self.chunk_size as u64 {
                        break;
                    }
                    self.pause().await;
                },
            }
            Ok(changed)
        };
        let changed = self.ended(audit, run.await).await?;
        tracing::info!(
            identity = %caller.identity, action, changed, audit, %before,
            "outbox admin: purged"
        );
        Ok(ActionReport {
            action: action.to_owned(),
            dry_run: false,
            matched: changed,
            changed,
            audit_id: Some(audit),
            warnings: Vec::new(),
        })
    }

    /// Pauses (`true`) or resumes a relay. Paused, it claims nothing from
    /// its next claim on (a claim that starts once this returned reads the
    /// pause, see [`OutboxStore::claim_for`](crate::OutboxStore::claim_for))
    /// and finishes the batches it holds; resumed, it claims again after
    /// its next heartbeat (within its stats interval, at most 5 s).
    ///
    /// # Errors
    /// [`AdminError::NotFound`] for an unknown relay; [`AdminError::Forbidden`],
    /// [`AdminError::Store`].
    pub async fn set_paused(
        &self,
        caller: &Caller,
        relay: &str,
        paused: bool,
    ) -> Result<ActionReport, AdminError> {
        let action = if paused { "pause" } else { "resume" };
        Self::authorize(caller, action)?;
        let missing = || {
            AdminError::NotFound(format!(
                "no relay named {relay:?} is registered (see `outbox relays list`)"
            ))
        };
        let relays = self.store.relays().await.map_err(AdminError::store)?;
        if !relays.iter().any(|r| r.name == relay) {
            return Err(missing());
        }
        let entry = AuditEntry::new(
            &caller.identity,
            action,
            serde_json::json!({ "relay": relay }),
        );
        let audit = self
            .store
            .begin_audit(&entry)
            .await
            .map_err(AdminError::store)?;
        let found = self
            .store
            .set_paused(relay, paused, audit)
            .await
            .map_err(AdminError::store);
        let found = self.ended(audit, found).await?;
        if !found {
            return Err(missing());
        }
        tracing::info!(identity = %caller.identity, action, relay, audit, "outbox admin: relay {action}d");
        Ok(ActionReport {
            action: action.to_owned(),
            dry_run: false,
            matched: 1,
            changed: 1,
            audit_id: Some(audit),
            warnings: Vec::new(),
        })
    }

    /// `filter` bounded by the highest `seq` now
    /// ([`EventFilter::seq_at_most`]): a run that starts here counts, and
    /// changes in each chunk (the bound holds inside the chunk's
    /// statement), only events recorded before it began.
    async fn up_to_now(&self, filter: EventFilter) -> Result<EventFilter, AdminError> {
        let last = self.store.last_seq().await.map_err(AdminError::store)?;
        // An empty outbox: a bound below every `seq` (they start at 1).
        Ok(filter.with_seq_at_most(last.unwrap_or(0)))
    }

    /// Text criteria a database cannot compare (NUL) are the caller's
    /// mistake, not the store's failure.
    fn check_text(filter: &EventFilter) -> Result<(), AdminError> {
        let texts = [
            ("aggregate_type", &filter.aggregate_type),
            ("aggregate_id", &filter.aggregate_id),
            ("event_type", &filter.event_type),
            ("error_contains", &filter.error_contains),
            ("group", &filter.group),
        ];
        for (name, text) in texts {
            if text.as_ref().is_some_and(|t| t.contains('\0')) {
                return Err(AdminError::Invalid(format!(
                    "{name} contains a NUL character; no event has one"
                )));
            }
        }
        Ok(())
    }

    fn authorize(caller: &Caller, action: &'static str) -> Result<(), AdminError> {
        caller.authorize(action)
    }

    /// The selection restricted to the statuses a verb changes; an empty
    /// selection (everything) is refused unless it names a status.
    fn selection(
        selection: &EventFilter,
        statuses: &[EventStatus],
        verb: &str,
    ) -> Result<EventFilter, AdminError> {
        Self::check_text(selection)?;
        if selection.is_empty() {
            return Err(AdminError::Invalid(format!(
                "{verb}: select the events (an id, an aggregate, a filter, a group), or select \
                 every {} event explicitly by its status",
                statuses[0]
            )));
        }
        if let Some(other) = selection.statuses.iter().find(|s| !statuses.contains(s)) {
            return Err(AdminError::Invalid(format!(
                "{verb} changes only {} events, not {other} ones",
                statuses
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(" or ")
            )));
        }
        selection.restricted_to(statuses).ok_or_else(|| {
            AdminError::Invalid(format!(
                "{verb}: the selection names no status it can change"
            ))
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn run<F, Fut>(
        &self,
        caller: &Caller,
        action: &'static str,
        filter: &EventFilter,
        dry_run: bool,
        warnings: Vec<String>,
        progress: &(dyn Fn(u64) + Sync),
        chunk: F,
    ) -> Result<ActionReport, AdminError>
    where
        F: Fn(Option<i64>, i64) -> Fut,
        Fut: std::future::Future<Output = Result<Chunk, S::Error>>,
    {
        Self::authorize(caller, action)?;
        let matched = self.store.count(filter).await.map_err(AdminError::store)?;
        for warning in &warnings {
            tracing::warn!(identity = %caller.identity, action, "outbox admin: {warning}");
        }
        if dry_run || matched == 0 {
            return Ok(ActionReport {
                action: action.to_owned(),
                dry_run,
                matched,
                changed: 0,
                audit_id: None,
                warnings,
            });
        }
        let target = serde_json::to_value(filter).unwrap_or(serde_json::Value::Null);
        let entry = AuditEntry::new(&caller.identity, action, target);
        let audit = self
            .store
            .begin_audit(&entry)
            .await
            .map_err(AdminError::store)?;
        let run = async {
            let mut changed = 0;
            let mut after = None;
            loop {
                let done = chunk(after, audit).await.map_err(AdminError::store)?;
                changed += done.changed;
                progress(changed);
                match done.last {
                    Some(last) => after = Some(last),
                    None => break,
                }
                self.pause().await;
            }
            Ok(changed)
        };
        let changed = self.ended(audit, run.await).await?;
        tracing::info!(
            identity = %caller.identity, action, matched, changed, audit,
            filter = %entry.target, "outbox admin: {action} done"
        );
        Ok(ActionReport {
            action: action.to_owned(),
            dry_run: false,
            matched,
            changed,
            audit_id: Some(audit),
            warnings,
        })
    }

    /// Records how the run of audit row `audit` ended (best effort: a
    /// failure to record it is logged), and passes `result` on.
    async fn ended<T>(&self, audit: i64, result: Result<T, AdminError>) -> Result<T, AdminError> {
        let outcome = match &result {
            Ok(_) => "done".to_owned(),
            Err(error) => format!("failed: {error}"),
        };
        if let Err(error) = self.store.finish_audit(audit, &outcome).await {
            tracing::warn!(%error, audit, "outbox admin: recording how a run ended failed");
        }
        result
    }

    async fn pause(&self) {
        if !self.chunk_pause.is_zero() {
            tokio::time::sleep(self.chunk_pause).await;
        }
    }
}

/// A page size between 1 and 10,000.
pub(crate) fn check_limit(limit: usize) -> Result<(), AdminError> {
    if (1..=10_000).contains(&limit) {
        Ok(())
    } else {
        Err(AdminError::Invalid(format!(
            "limit must be between 1 and 10000, not {limit}"
        )))
    }
}

/// The time `age` ago, `None` when that is out of the calendar's range.
pub(crate) fn ago(age: Duration) -> Option<chrono::DateTime<Utc>> {
    chrono::Duration::from_std(age)
        .ok()
        .and_then(|age| Utc::now().checked_sub_signed(age))
}

/// `14 days`, `3 h`, `90 s`.
fn humanize(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 86_400 && secs.is_multiple_of(86_400) {
        format!("{} days", secs / 86_400)
    } else if secs >= 3_600 && secs.is_multiple_of(3_600) {
        format!("{} h", secs / 3_600)
    } else {
        format!("{secs} s")
    }
}
