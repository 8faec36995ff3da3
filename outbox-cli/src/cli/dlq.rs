//! Arguments of `dlq ...`: the consumers' dead letters.

use clap::{Args, Subcommand};

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
