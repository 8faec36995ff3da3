//! The command line, as clap derive types.

use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{ArgGroup, Args, Parser, Subcommand};
use outbox_core::EventStatus;
use outbox_core::admin::EventFilter;
use uuid::Uuid;

const EXIT_CODES: &str = "\
Exit codes:
  0  ok (a dry run too, whatever it found)
  1  the store, the broker or the output failed
  2  usage: unknown flag, missing argument (clap's)
  3  not found: no such event, aggregate head, relay or dead letter
  4  invalid request: empty selection, unconfirmed mutation (add --yes), bad value,
     a dead-letter queue with consumers (a replay of it runs: try again later)
  5  cannot connect to PostgreSQL (start it with scripts/dev-services, check DATABASE_URL)
  6  cannot connect to RabbitMQ (start it with scripts/dev-services, check AMQP_URL)
  7  a dead-letter replay stopped part way: nothing lost, the rest is still in the
     dead-letter queue (fix the cause, run it again)";

const EXAMPLES: &str = "\
Examples:
  export DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres
  outbox status
  outbox events list --status dead --limit 20
  outbox dead groups
  outbox replay --group 3f2a9c01 --dry-run
  outbox replay --aggregate order:42 --yes
  outbox skip --head order:42
  outbox purge sent --older-than 7d --yes
  outbox relays pause relay-1
  export AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f
  outbox dlq list billing.orders
  outbox dlq replay billing.orders.dead --dry-run
  outbox dlq replay billing.orders.dead --limit 100 --yes
  outbox dlq purge billing.orders.dead --yes
  outbox --json status | jq .counts";

/// See, fix and clean a transactional outbox on PostgreSQL.
#[derive(Debug, Parser)]
#[command(name = "outbox", version, after_help = format!("{EXAMPLES}\n\n{EXIT_CODES}"))]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) global: Global,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Flags every command takes.
#[derive(Debug, Args)]
#[command(next_help_heading = "Global options")]
pub(crate) struct Global {
    /// PostgreSQL URL (its password is never printed).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub(crate) database_url: Option<String>,
    /// RabbitMQ URL, used by `dlq replay` and `dlq purge` (its password is never printed).
    #[arg(long, env = "AMQP_URL", global = true, hide_env_values = true)]
    pub(crate) amqp_url: Option<String>,
    /// The outbox's schema.
    #[arg(long, env = "OUTBOX_SCHEMA", default_value = "public", global = true)]
    pub(crate) schema: String,
    /// Machine-readable JSON on stdout instead of tables.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// Who acts, in the audit trail (default: cli:$USER@$HOST).
    #[arg(long = "as", value_name = "NAME", global = true)]
    pub(crate) identity: Option<String>,
    /// Events changed per transaction by replay, skip, retry-now and purge;
    /// dead letters marked at a time by `dlq replay`.
    #[arg(long, default_value_t = 500, global = true)]
    pub(crate) chunk_size: usize,
    /// Confirm a mutation that selects more than one event (needed without a terminal).
    #[arg(long, short = 'y', global = true)]
    pub(crate) yes: bool,
    /// Consumers' dedup window: replaying older events warns.
    #[arg(long, default_value = "14d", value_parser = parse_duration, global = true)]
    pub(crate) dedup_window: Duration,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Counts per status, oldest unsent event, blocked aggregates, relays.
    #[command(after_help = "Example:\n  outbox status\n  outbox --json status")]
    Status,
    /// List and show events.
    #[command(subcommand)]
    Events(EventsCommand),
    /// Dead and retrying events.
    #[command(subcommand)]
    Dead(DeadCommand),
    /// Dead events back to pending (their id and order kept).
    #[command(
        after_help = "Examples:\n  outbox replay --id 0190...\n  outbox replay --aggregate order:42 --yes\n  \
                      outbox replay --group 3f2a9c01 --dry-run\n  outbox replay --all-dead --yes"
    )]
    Replay(ReplayArgs),
    /// Skip a dead or retrying event, or what holds an aggregate back.
    #[command(
        group(ArgGroup::new("which").required(true).args(["id", "head"])),
        after_help = "Examples:\n  outbox skip --id 0190...\n  outbox skip --head order:42 --dry-run"
    )]
    Skip(SkipArgs),
    /// Make waiting retries due now.
    #[command(
        after_help = "Examples:\n  outbox retry-now --aggregate order:42\n  outbox retry-now --all --yes"
    )]
    RetryNow(RetryNowArgs),
    /// Delete old sent events or inbox entries.
    #[command(subcommand)]
    Purge(PurgeCommand),
    /// Registered relays, pause and resume.
    #[command(subcommand)]
    Relays(RelaysCommand),
    /// The audit trail of mutations, newest first.
    #[command(after_help = "Example:\n  outbox audit --limit 20")]
    Audit(AuditArgs),
    /// Apply the outbox's migrations to the schema.
    #[command(
        after_help = "Examples:\n  outbox migrate\n  outbox --schema billing migrate --contract"
    )]
    Migrate(MigrateArgs),
    /// Consumers' dead letters: list them (from the database), replay or purge
    /// their dead-letter queue (on RabbitMQ).
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Print the SQL of every migration (for a DBA to apply).
    #[command(after_help = "Example:\n  outbox --schema billing ddl > outbox.sql")]
    Ddl,
    /// EXPLAIN ANALYZE of the relay's claim (rolled back: nothing stays claimed).
    #[command(after_help = "Example:\n  outbox explain-claim --limit 100")]
    ExplainClaim(ExplainArgs),
}

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

/// `dlq ...`.
#[derive(Debug, Subcommand)]
pub(crate) enum DlqCommand {
    /// Recorded dead letters in the order they were dead-lettered (from the
    /// database: the broker's queue is not touched, so nothing is reordered or dropped).
    #[command(
        after_help = "Examples:\n  outbox dlq list\n  outbox dlq list billing.orders --limit 20\n  \
                      outbox dlq list billing.orders --all --after 1234"
    )]
    List(DlqListArgs),
    /// One recorded dead letter, with its headers and payload.
    #[command(after_help = "Example:\n  outbox dlq show 1234")]
    Show {
        /// The dead letter's id (from `outbox dlq list`).
        id: i64,
    },
    /// Open dead letters grouped by consumer, event type and normalized reason.
    #[command(after_help = "Example:\n  outbox dlq groups billing.orders")]
    Groups {
        /// Only those a consumer read from this queue.
        queue: Option<String>,
    },
    /// Send a dead-letter queue's messages back to the queues they came from
    /// (each confirmed before it leaves the dead-letter queue: a kill loses nothing).
    #[command(
        after_help = "Examples:\n  outbox dlq replay billing.orders.dead --dry-run\n  \
                      outbox dlq replay billing.orders.dead --limit 100 --yes\n  \
                      outbox dlq replay billing.orders.dead --skip-unreplayable --yes"
    )]
    Replay(DlqReplayArgs),
    /// Delete every message in a dead-letter queue and mark their records purged.
    #[command(
        after_help = "Examples:\n  outbox dlq purge billing.orders.dead --dry-run\n  \
                      outbox dlq purge billing.orders.dead --yes\n  \
                      outbox dlq purge shared-dlq --origin billing.orders --origin billing.refunds --yes"
    )]
    Purge(DlqPurgeArgs),
}

/// `dlq list`.
#[derive(Debug, Args)]
pub(crate) struct DlqListArgs {
    /// Only those a consumer read from this queue (the origin, not the dead-letter queue).
    pub(crate) queue: Option<String>,
    /// Replayed and purged ones too.
    #[arg(long)]
    pub(crate) all: bool,
    /// The cursor printed by the previous page.
    #[arg(long, value_name = "ID")]
    pub(crate) after: Option<i64>,
    /// Dead letters per page (1 to 10000).
    #[arg(long, default_value_t = 50)]
    pub(crate) limit: usize,
}

/// `dlq replay`.
#[derive(Debug, Args)]
pub(crate) struct DlqReplayArgs {
    /// The dead-letter queue, e.g. `billing.orders.dead`.
    pub(crate) queue: String,
    /// Replay at most this many (default: all).
    #[arg(long)]
    pub(crate) limit: Option<usize>,
    /// Move messages that cannot go back (no known origin, origin queue
    /// gone) to the dead-letter queue's tail and go on, instead of stopping
    /// at the first.
    #[arg(long)]
    pub(crate) skip_unreplayable: bool,
    /// Only print how many messages the dead-letter queue holds.
    #[arg(long)]
    pub(crate) dry_run: bool,
}

/// `dlq purge`.
#[derive(Debug, Args)]
pub(crate) struct DlqPurgeArgs {
    /// The dead-letter queue, e.g. `billing.orders.dead`.
    pub(crate) queue: String,
    /// A consumer queue that dead-letters into QUEUE, whose records to
    /// mark purged (default: QUEUE without its `.dead` suffix); repeat it
    /// for a dead-letter queue that several queues share.
    #[arg(long = "origin", value_name = "QUEUE")]
    pub(crate) origins: Vec<String>,
    /// Only print how many messages the dead-letter queue holds.
    #[arg(long)]
    pub(crate) dry_run: bool,
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

/// `30s`, `15m`, `7d`, `1h 30m`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (use e.g. 30s, 15m, 7d)"))
}

fn parse_status(text: &str) -> Result<EventStatus, String> {
    text.parse::<EventStatus>()
        .map_err(|_| "expected pending, retry, held, dead, sent or skipped".to_owned())
}

fn parse_aggregate(text: &str) -> Result<(String, String), String> {
    match text.split_once(':') {
        Some((t, i)) if !t.is_empty() && !i.is_empty() => Ok((t.to_owned(), i.to_owned())),
        _ => Err("expected TYPE:ID, e.g. order:42".to_owned()),
    }
}

fn parse_time(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let ago = parse_duration(text)
        .map_err(|_| "expected an RFC 3339 time or a duration ago (30s, 15m, 7d)".to_owned())?;
    chrono::Duration::from_std(ago)
        .ok()
        .and_then(|ago| Utc::now().checked_sub_signed(ago))
        .ok_or_else(|| format!("{text} ago is before the calendar's start"))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_and_aggregates_parse() {
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_duration("seven days").is_err());
        assert_eq!(
            parse_aggregate("order:4:2"),
            Ok(("order".to_owned(), "4:2".to_owned()))
        );
        assert!(parse_aggregate("order").is_err());
        assert!(parse_time("2026-01-01T00:00:00Z").is_ok());
        assert!(parse_time("1h").is_ok_and(|t| t < Utc::now()));
    }
}
