//! The run every admin mutation shares: its selection checked, the caller
//! authorized, the matching events counted, an audit row written, the
//! chunks run (with their pause), and how the run ended recorded.

use super::{ActionReport, Admin, AdminError};
use crate::EventStatus;
use crate::admin::{AuditEntry, Caller, Chunk, EventFilter, OutboxAdmin};

impl<S: OutboxAdmin> Admin<S> {
    /// `filter` bounded by the highest `seq` now
    /// ([`EventFilter::seq_at_most`]): a run that starts here counts, and
    /// changes in each chunk (the bound holds inside the chunk's
    /// statement), only events recorded before it began.
    pub(super) async fn up_to_now(&self, filter: EventFilter) -> Result<EventFilter, AdminError> {
        let last = self.store.last_seq().await.map_err(AdminError::store)?;
        // An empty outbox: a bound below every `seq` (they start at 1).
        Ok(filter.with_seq_at_most(last.unwrap_or(0)))
    }

    /// Text criteria a database cannot compare (NUL) are the caller's
    /// mistake, not the store's failure.
    pub(super) fn check_text(filter: &EventFilter) -> Result<(), AdminError> {
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

    pub(super) fn authorize(caller: &Caller, action: &'static str) -> Result<(), AdminError> {
        caller.authorize(action)
    }

    /// The selection restricted to the statuses a verb changes; an empty
    /// selection (everything) is refused unless it names a status.
    pub(super) fn selection(
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
    pub(super) async fn run<F, Fut>(
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
    pub(super) async fn ended<T>(
        &self,
        audit: i64,
        result: Result<T, AdminError>,
    ) -> Result<T, AdminError> {
        let outcome = match &result {
            Ok(_) => "done".to_owned(),
            Err(error) => format!("failed: {error}"),
        };
        if let Err(error) = self.store.finish_audit(audit, &outcome).await {
            tracing::warn!(%error, audit, "outbox admin: recording how a run ended failed");
        }
        result
    }

    pub(super) async fn pause(&self) {
        if !self.chunk_pause.is_zero() {
            tokio::time::sleep(self.chunk_pause).await;
        }
    }
}
