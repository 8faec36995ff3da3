//! Who did what: callers and the audit trail of every mutation.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// What a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Role {
    /// Read: status, list, show, groups, relays, audit.
    ReadOnly,
    /// Read and act: replay, skip, retry-now, purge, pause.
    Operator,
}

/// Who calls the admin API: recorded in the audit trail of every mutation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Caller {
    /// Identity (a user, a token's name, `cli:alice@host`).
    pub identity: String,
    /// What it may do.
    pub role: Role,
}

impl Caller {
    /// A caller that may act.
    pub fn operator(identity: impl Into<String>) -> Self {
        Caller {
            identity: identity.into(),
            role: Role::Operator,
        }
    }

    /// A caller that may only read.
    pub fn read_only(identity: impl Into<String>) -> Self {
        Caller {
            identity: identity.into(),
            role: Role::ReadOnly,
        }
    }

    /// Whether it may run mutations.
    pub fn may_act(&self) -> bool {
        self.role >= Role::Operator
    }

    /// `Ok` when it may run `action`.
    ///
    /// # Errors
    /// [`AdminError::Forbidden`](super::AdminError::Forbidden) for a
    /// read-only caller.
    pub fn authorize(&self, action: &'static str) -> Result<(), super::AdminError> {
        if self.may_act() {
            Ok(())
        } else {
            Err(super::AdminError::Forbidden {
                identity: self.identity.clone(),
                action,
            })
        }
    }
}

/// A mutation about to run, as the audit trail records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AuditEntry {
    /// Who.
    pub identity: String,
    /// The verb (`replay`, `skip`, `retry_now`, `purge_sent`, `purge_inbox`,
    /// `pause`, `resume`; the CLI's `dlq_replay`, `dlq_purge`).
    pub action: String,
    /// What it selected, as JSON (a filter, an id, a duration).
    pub target: serde_json::Value,
}

impl AuditEntry {
    /// An entry.
    pub fn new(
        identity: impl Into<String>,
        action: impl Into<String>,
        target: serde_json::Value,
    ) -> Self {
        AuditEntry {
            identity: identity.into(),
            action: action.into(),
            target,
        }
    }
}

/// A row of the audit trail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct AuditRecord {
    /// Its id (grows with time).
    pub id: i64,
    /// When the mutation began.
    pub at: DateTime<Utc>,
    /// What was asked.
    #[serde(flatten)]
    pub entry: AuditEntry,
    /// Events (or inbox entries) it changed so far: each chunk adds its count
    /// in the chunk's own transaction, so a run stopped half way says how far
    /// it got.
    pub count: u64,
    /// When the run ended; `None` while it runs, and for ever if its process
    /// was killed ([`count`](Self::count) says how far it got).
    pub finished_at: Option<DateTime<Utc>>,
    /// How it ended: `done` (the dead-letter verbs: `done: <counts>`), or
    /// `failed: <why>`.
    pub outcome: Option<String>,
}

impl AuditRecord {
    /// A record.
    pub fn new(id: i64, at: DateTime<Utc>, entry: AuditEntry, count: u64) -> Self {
        AuditRecord {
            id,
            at,
            entry,
            count,
            finished_at: None,
            outcome: None,
        }
    }

    /// The same record, ended at `at` with `outcome`.
    #[must_use]
    pub fn finished(mut self, at: DateTime<Utc>, outcome: impl Into<String>) -> Self {
        self.finished_at = Some(at);
        self.outcome = Some(outcome.into());
        self
    }
}
