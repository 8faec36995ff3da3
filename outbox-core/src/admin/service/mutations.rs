//! The admin mutations (replay, skip, retry now, purge, pause and resume),
//! each a chunked, audited run, and what they report.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{Admin, AdminError, ago, humanize};
use crate::EventStatus;
use crate::admin::{AuditEntry, Caller, EventFilter, OutboxAdmin};

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
    /// when their chunk ran (see the [module docs](crate::admin), "Runs are
    /// bounded when they start", for the one case where it can be more).
    pub changed: u64,
    /// The audit row (`None` in a dry run).
    pub audit_id: Option<i64>,
    /// What the operator should know (e.g. events older than the dedup
    /// window).
    pub warnings: Vec<String>,
}

impl<S: OutboxAdmin> Admin<S> {
    /// Replays the `dead` events matching `selection` (statuses other than
    /// `dead` in it are an error; none means `dead`), in chunks in `seq`
    /// order. An empty selection is refused: select everything dead with
    /// [`EventFilter::with_status`]`(Dead)`. `progress` is called with the
    /// count done after each chunk.
    ///
    /// The run is bounded when it starts (see the [module docs](crate::admin),
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
}
