//! `outbox`: see, fix and clean a transactional outbox on PostgreSQL,
//! MariaDB or SQLite.
//!
//! A thin shell over the admin API of `outbox-core`
//! (`outbox_core::admin::Admin`) on the store of `outbox-diesel` for the
//! back end `DATABASE_URL`'s scheme names (`postgres://…` in `--schema`,
//! `mysql://…` in the URL's database, `sqlite://path`; `explain-claim` is
//! PostgreSQL's only, and `ddl` prints the SQL of the URL's back end):
//! every mutation is chunked, audited (as `--as NAME`, by default
//! `cli:$USER@$HOST`) and can be tried with `--dry-run` first.
//!
//! ```text
//! export DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres
//! outbox status
//! outbox events list --status dead --limit 20
//! outbox events show 0190c2b1-... --payload
//! outbox dead groups
//! outbox replay --group 3f2a9c01 --dry-run
//! outbox replay --aggregate order:42 --yes
//! outbox skip --head order:42
//! outbox purge sent --older-than 7d --yes
//! outbox relays pause relay-1
//! outbox --json status | jq .counts
//!
//! # consumers' dead letters (RabbitMQ)
//! export AMQP_URL=amqp://guest:guest@127.0.0.1:5672/%2f
//! outbox dlq list billing.orders
//! outbox dlq show 1234
//! outbox dlq groups
//! outbox dlq replay billing.orders.dead --dry-run
//! outbox dlq replay billing.orders.dead --limit 100
//! outbox dlq purge billing.orders.dead --yes
//! ```
//!
//! The same command in a binary of your own (e.g. one that ships with a
//! service's image):
//!
//! ```no_run
//! fn main() -> std::process::ExitCode {
//!     outbox_cli::run()
//! }
//! ```
//!
//! # Commands
//! | Command | Does |
//! |---|---|
//! | `status` | counts per status, oldest unsent event, blocked aggregates, unroutable, per event type, relays |
//! | `events list [filters] [--after CURSOR] [--limit N]` | a page of events in `seq` order, and the next page's cursor |
//! | `events show ID [--payload]` | one event with its failed attempts; payload and headers only with `--payload` |
//! | `dead groups [filters]` | dead and retrying events grouped by event type and normalized error |
//! | `replay (--id ID... \| --aggregate TYPE:ID \| --group G \| --all-dead \| filters) [--dry-run]` | dead events back to pending, id and order kept |
//! | `skip (--id ID \| --head TYPE:ID) [--dry-run]` | skips a dead or retrying event, or an aggregate's blocking head |
//! | `retry-now (--id ID... \| --aggregate TYPE:ID \| --all \| filters) [--dry-run]` | makes waiting retries due now |
//! | `purge sent\|inbox --older-than 7d [--dry-run]` | deletes old sent/skipped events (never dead ones) or inbox entries |
//! | `relays list\|pause NAME\|resume NAME` | registered relays; pause through a row the relay reads at each claim (resumed: at its next heartbeat, within 5 s) |
//! | `audit [--limit N] [--before ID]` | the audit trail, newest first |
//! | `migrate [--contract]` | applies the migrations to `--schema` |
//! | `ddl` | prints the migrations' SQL (no database needed) |
//! | `explain-claim [--limit N]` | `EXPLAIN ANALYZE` of the relay's claim, rolled back |
//! | `dlq list [QUEUE] [--all] [--after ID] [--limit N]` | consumers' dead letters in the order they were dead-lettered, from the database (never the broker: nothing reordered or dropped); `QUEUE` is the consumer's queue; `--all` adds replayed and purged ones |
//! | `dlq show ID` | one dead letter with its reason, headers and payload |
//! | `dlq groups [QUEUE]` | open dead letters grouped by consumer, event type and normalized reason |
//! | `dlq replay DLQ [--limit N] [--dry-run]` | sends the dead-letter queue's messages back to the queue each came from, then marks their records replayed; `--dry-run` prints the queue's depth |
//! | `dlq purge DLQ [--origin QUEUE] [--dry-run]` | deletes every message in the dead-letter queue (needs `--yes`), then marks the records of `--origin` (default: `DLQ` without `.dead`) purged |
//!
//! # Dead letters
//! A consumer (`outbox-lapin`'s `InboxConsumer`) records each message it
//! dead-letters in its database (`inbox_dead_letters`, in `--schema`);
//! `dlq list|show|groups` read those records and need only `DATABASE_URL`.
//! `dlq replay` and `dlq purge` act on the dead-letter queue in RabbitMQ
//! (`--amqp-url`, env `AMQP_URL`) and then mark the records, so they need
//! both URLs (a dry run too). They go through
//! `outbox_core::admin::DeadLetters`, as the admin router does. A replay
//! holds the dead-letter queue as its only reader while it runs (a queue
//! with consumers, i.e. another replay or a live queue, is refused with exit
//! 4; a dry run shows the consumers), moves one message at a
//! time and acks it in the dead-letter queue only after the broker confirmed
//! its copy in the origin queue: **killed half way, it loses nothing** (a
//! message is in one queue or, at worst, in both, and the consumer's inbox
//! drops the duplicate); run it again to finish. It marks the records in
//! chunks of `--chunk-size` as it goes, so a killed replay leaves at most
//! one chunk of records open whose messages did go back. A replay that stops on a
//! message (origin queue gone, no origin header, never dead-lettered) leaves
//! it and the rest in the dead-letter queue and exits with 7
//! (`--skip-unreplayable` moves those that cannot go back to the queue's
//! tail and goes on). Both write an audit row (`dlq_replay`, `dlq_purge`)
//! before the first message moves, ended with their counts and outcome.
//! `dlq replay` moves exactly the count it asked to confirm (`--yes`, or a
//! `y` on a terminal, for more than one message), at most what the queue
//! held when it started.
//!
//! Filters: `--status S` (repeatable), `--aggregate TYPE:ID` or
//! `--aggregate-type T`, `--event-type E`, `--error TEXT`, `--group G`,
//! `--since` and `--until` (RFC 3339 or a duration ago: `30s`, `15m`, `7d`).
//!
//! # Global flags
//! `--database-url` (env `DATABASE_URL`; its password is never printed),
//! `--schema` (env `OUTBOX_SCHEMA`, default `public`), `--json` (JSON on
//! stdout for scripts, on every command), `--as NAME`, `--chunk-size N`
//! (default 500), `--yes`, `--dedup-window` (default `14d`: replaying older
//! events warns), `--amqp-url` (env `AMQP_URL`, used by `dlq replay` and
//! `dlq purge`; its password is never printed), `--no-prepared-statements`
//! (env `OUTBOX_NO_PREPARED_STATEMENTS`: every statement sent unprepared, for
//! a PgBouncer in transaction pooling mode older than 1.21).
//!
//! A mutation that selects more than one event (and every purge) needs
//! `--yes`, or a `y` on a terminal; without a terminal it is refused with
//! exit code 4. Tables are coloured only on a terminal without `NO_COLOR`;
//! replays and purges show a spinner with a count on a terminal, never with
//! `--json`; `dlq replay` shows a progress bar to the queue's depth.
//! Warnings (e.g. events older than the dedup window) go to stderr.
//!
//! # Exit codes
//! | Code | Meaning |
//! |---|---|
//! | 0 | ok (a dry run too, whatever it found) |
//! | 1 | the store, the broker or the output failed |
//! | 2 | usage: unknown flag, missing argument |
//! | 3 | not found: no such event, aggregate head, relay or dead letter |
//! | 4 | invalid request: empty selection, unconfirmed mutation, no database or RabbitMQ URL, a dead-letter queue with consumers (a replay of it runs: try again when it ends) |
//! | 5 | the database not reachable (start it with `scripts/dev-services`, check `DATABASE_URL`) |
//! | 6 | RabbitMQ not reachable (start it with `scripts/dev-services`, check `AMQP_URL`) |
//! | 7 | a `dlq replay` stopped part way: nothing was lost, what it replayed is printed, the rest is still in the dead-letter queue; the message says why (a message that cannot go back; the broker failed; marking the records failed: those messages went back but stay listed open) |
//!
//! # Feature flags
//! | feature | default | enables |
//! |---|---|---|
//! | `postgres-tls` | no | TLS to PostgreSQL (rustls): `sslmode` and `sslrootcert` in the URL |

use std::io::Write as _;
use std::process::ExitCode;

use clap::Parser as _;

mod backend;
mod cli;
mod commands;
mod error;
mod output;

/// Parses the command line, runs the command and returns its exit code
/// (see [Exit codes](crate#exit-codes)); what the `outbox` binary does.
pub fn run() -> ExitCode {
    let cli = cli::Cli::parse();
    // Multi-thread (two workers are plenty): the SQLite back end waits for
    // a cancelled statement with `block_in_place`, which the current-thread
    // runtime does not allow.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(&error::Error::Io(e)),
    };
    match runtime.block_on(commands::run(cli)) {
        Ok(()) => ExitCode::from(error::code::OK),
        Err(e) => fail(&e),
    }
}

fn fail(e: &error::Error) -> ExitCode {
    if let error::Error::Io(io) = e
        && io.kind() == std::io::ErrorKind::BrokenPipe
    {
        // The reader stopped reading (`outbox ddl | head`): not a failure.
        return ExitCode::from(error::code::OK);
    }
    // Nothing more to do if stderr is gone.
    let _ = writeln!(std::io::stderr().lock(), "error: {e}");
    e.exit_code()
}
