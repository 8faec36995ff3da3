//! The command line, as clap derive types: the top level and the global
//! flags here, the outbox table's verbs in [`events`], the consumers' dead
//! letters in [`dlq`], value parsers in [`parse`].

mod dlq;
mod events;
mod parse;

pub(crate) use dlq::{DlqCommand, DlqListArgs, DlqPurgeArgs, DlqReplayArgs};
pub(crate) use events::{
    AuditArgs, DeadCommand, EventsCommand, ExplainArgs, ListArgs, MigrateArgs, PurgeCommand,
    RelaysCommand, ReplayArgs, RetryNowArgs, ShowArgs, SkipArgs,
};
use parse::parse_duration;

use std::time::Duration;

use clap::builder::BoolishValueParser;
use clap::{ArgGroup, Args, Parser, Subcommand};

const EXIT_CODES: &str = "\
Exit codes:
  0  ok (a dry run too, whatever it found)
  1  the store, the broker or the output failed
  2  usage: unknown flag, missing argument (clap's)
  3  not found: no such event, aggregate head, relay or dead letter
  4  invalid request: empty selection, unconfirmed mutation (add --yes), bad value,
     a dead-letter queue with consumers (a replay of it runs: try again later)
  5  cannot connect to the database (start it with scripts/dev-services, check DATABASE_URL)
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

/// See, fix and clean a transactional outbox on PostgreSQL, MariaDB or SQLite.
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
    /// Database URL: postgres://…, mysql://… (MariaDB) or sqlite://path
    /// (its password is never printed).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub(crate) database_url: Option<String>,
    /// RabbitMQ URL, used by `dlq replay` and `dlq purge` (its password is never printed);
    /// for a cluster, every node's URL separated by commas.
    #[arg(long, env = "AMQP_URL", global = true, hide_env_values = true)]
    pub(crate) amqp_url: Option<String>,
    /// The outbox's schema (PostgreSQL; on MariaDB and SQLite leave it unset).
    #[arg(long, env = "OUTBOX_SCHEMA", default_value = crate::commands::DEFAULT_SCHEMA, global = true)]
    pub(crate) schema: String,
    /// Send every statement unprepared, for a PgBouncer in transaction
    /// pooling mode (older than 1.21) between the CLI and PostgreSQL.
    #[arg(
        long,
        env = "OUTBOX_NO_PREPARED_STATEMENTS",
        global = true,
        value_parser = BoolishValueParser::new()
    )]
    pub(crate) no_prepared_statements: bool,
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
