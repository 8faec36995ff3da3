//! What the dead-letter verbs are asked and answer: the query of the
//! records, and a replay's and a purge's request and outcome.

use serde::{Deserialize, Serialize};

use crate::admin::DlqReplayReport;

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
    /// records [redacted](crate::admin::DeadLetterRecord::redacted), and not read at all).
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

/// What a [`DeadLetters::replay`](super::DeadLetters::replay) did (or, in a dry run, found).
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
    pub(super) fn resolved_origins(&self) -> Option<Vec<String>> {
        if !self.origins.is_empty() {
            return Some(self.origins.clone());
        }
        self.queue
            .strip_suffix(".dead")
            .filter(|origin| !origin.is_empty())
            .map(|origin| vec![origin.to_owned()])
    }
}

/// What a [`DeadLetters::purge`](super::DeadLetters::purge) did (or, in a dry run, found).
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
