//! Arguments of the verbs on the outbox table: `events`, `dead`, `replay`,
//! `skip`, `retry-now`, `purge`, `relays`, `audit`, `migrate`, `explain-claim`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use outbox_core::EventStatus;
use outbox_core::admin::EventFilter;
use uuid::Uuid;

use super::parse::{parse_aggregate, parse_duration, parse_status, parse_time};

/// `events ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum EventsCommand {
    /// A page of events in `seq` order; prints the cursor of the next page.
    #[command(
        after_help = "Examples:\n  outbox events list --status dead --since 1h\n  outbox events list --aggregate order:42\n  \
                      outbox events list --after 1234 --limit 100"
    )]
    List(ListArgs),
    /// One event with its failed attempts.
    #[command(after_help = "Example:\n  outbox events show 0190... --payload")]
    Show(ShowArgs),
}

/// `events list`.
#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// The cursor printed by the previous page.
    #[arg(long, value_name = "CURSOR")]
    pub(crate) after: Option<i64>,
    /// Events per page (1 to 10000).
    #[arg(long, default_value_t = 50)]
    pub(crate) limit: usize,
    #[command(flatten)]
    pub(crate) filter: FilterArgs,
}

/// `events show`.
#[derive(Debug, Args)]
pub(crate) struct ShowArgs {
    /// The event's id.
    pub(crate) id: Uuid,
    /// Print the payload and headers too.
    #[arg(long)]
    pub(crate) payload: bool,
}

/// `dead ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum DeadCommand {
    /// Dead and retrying events grouped by event type and normalized error.
    #[command(after_help = "Example:\n  outbox dead groups --event-type order.placed")]
    Groups(FilterArgs),
}

/// Which events: every criterion given must hold.
#[derive(Debug, Args, Default)]
#[command(next_help_heading = "Filters")]
pub(crate) struct FilterArgs {
    /// Status (pending, retry, held, dead, sent, skipped); repeat for several.
    #[arg(long = "status", value_name = "STATUS", value_parser = parse_status)]
    pub(crate) statuses: Vec<EventStatus>,
    /// One aggregate, as TYPE:ID.
    #[arg(long, value_name = "TYPE:ID", value_parser = parse_aggregate, conflicts_with = "aggregate_type")]
    pub(crate) aggregate: Option<(String, String)>,
    /// Aggregate type.
    #[arg(long, value_name = "TYPE")]
    pub(crate) aggregate_type: Option<String>,
    /// Event type.
    #[arg(long, value_name = "TYPE")]
    pub(crate) event_type: Option<String>,
    /// The last error contains this text (case-insensitive).
    #[arg(long, value_name = "TEXT")]
    pub(crate) error: Option<String>,
    /// A failure group's id (see `outbox dead groups`).
    #[arg(long, value_name = "GROUP")]
    pub(crate) group: Option<String>,
    /// Occurred at or after: RFC 3339 time or a duration ago (30s, 15m, 7d).
    #[arg(long, value_name = "TIME|DURATION", value_parser = parse_time)]
    pub(crate) since: Option<DateTime<Utc>>,
    /// Occurred before: RFC 3339 time or a duration ago.
    #[arg(long, value_name = "TIME|DURATION", value_parser = parse_time)]
    pub(crate) until: Option<DateTime<Utc>>,
}

impl FilterArgs {
    /// The filter these flags describe.
    pub(crate) fn to_filter(&self) -> EventFilter {
        let mut filter = EventFilter::new();
        for status in &self.statuses {
            filter = filter.with_status(*status);
        }
        if let Some((t, i)) = &self.aggregate {
            filter = filter.with_aggregate(t, i);
        }
        if let Some(t) = &self.aggregate_type {
            filter = filter.with_aggregate_type(t);
        }
        if let Some(t) = &self.event_type {
            filter = filter.with_event_type(t);
        }
        if let Some(t) = &self.error {
            filter = filter.with_error_containing(t);
        }
        if let Some(g) = &self.group {
            filter = filter.with_group(g);
        }
        if self.since.is_some() || self.until.is_some() {
            filter = filter.with_occurred(self.since, self.until);
        }
        filter
    }
}

/// `replay`.
#[derive(Debug, Args)]
pub(crate) struct ReplayArgs {
    /// These events (repeat the flag for several).
    #[arg(long = "id", value_name = "ID")]
    pub(crate) ids: Vec<Uuid>,
    /// Every dead event.
    #[arg(long)]
    pub(crate) all_dead: bool,
    /// Only count what would change.
    #[arg(long)]
    pub(crate) dry_run: bool,
    #[command(flatten)]
    pub(crate) filter: FilterArgs,
}

/// `skip`.
#[derive(Debug, Args)]
pub(crate) struct SkipArgs {
    /// A dead or retrying event.
    #[arg(long, value_name = "ID")]
    pub(crate) id: Option<Uuid>,
    /// The dead or retrying event that holds an aggregate back, as TYPE:ID.
    #[arg(long, value_name = "TYPE:ID", value_parser = parse_aggregate)]
    pub(crate) head: Option<(String, String)>,
    /// Only count what would change.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

/// `retry-now`.
#[derive(Debug, Args)]
pub(crate) struct RetryNowArgs {
    /// These events (repeat the flag for several).
    #[arg(long = "id", value_name = "ID")]
    pub(crate) ids: Vec<Uuid>,
    /// Every retrying event.
    #[arg(long)]
    pub(crate) all: bool,
    /// Only count what would change.
    #[arg(long)]
    pub(crate) dry_run: bool,
    #[command(flatten)]
    pub(crate) filter: FilterArgs,
}

/// `purge ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum PurgeCommand {
    /// Sent and skipped events (never dead ones) published before a while ago.
    #[command(after_help = "Example:\n  outbox purge sent --older-than 7d --yes")]
    Sent(PurgeArgs),
    /// Inbox entries received before a while ago.
    #[command(after_help = "Example:\n  outbox purge inbox --older-than 14d --yes")]
    Inbox(PurgeArgs),
}

/// `purge sent|inbox`.
#[derive(Debug, Args)]
pub(crate) struct PurgeArgs {
    /// Age: 30s, 15m, 7d, ...
    #[arg(long, value_parser = parse_duration)]
    pub(crate) older_than: Duration,
    /// Say what would be purged, change nothing.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

/// `relays ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum RelaysCommand {
    /// Registered relays, live or stale.
    List,
    /// Pause a relay (it claims nothing from its next claim on and finishes
    /// the batches it holds).
    #[command(after_help = "Example:\n  outbox relays pause relay-1")]
    Pause {
        /// The relay's name.
        name: String,
    },
    /// Resume a paused relay (it claims again after its next heartbeat,
    /// within 5 s).
    Resume {
        /// The relay's name.
        name: String,
    },
}

/// `audit`.
#[derive(Debug, Args)]
pub(crate) struct AuditArgs {
    /// Rows to show.
    #[arg(long, default_value_t = 50)]
    pub(crate) limit: usize,
    /// Only rows older than this audit id (paging).
    #[arg(long)]
    pub(crate) before: Option<i64>,
}

/// `migrate`.
#[derive(Debug, Args)]
pub(crate) struct MigrateArgs {
    /// Also apply the contract phase (after every relay runs the new version).
    #[arg(long)]
    pub(crate) contract: bool,
}

/// `explain-claim`.
#[derive(Debug, Args)]
pub(crate) struct ExplainArgs {
    /// Events per claim.
    #[arg(long, default_value_t = 100)]
    pub(crate) limit: usize,
}
