//! The example e-commerce service: an HTTP API for orders and stock, an
//! outbox relay to RabbitMQ, and inventory and loyalty consumers with an
//! inbox, all on the `outbox` facade. See `examples/ecommerce/README.md`.
//!
//! Run with:
//! ```text
//! scripts/demo                                # fresh machine: starts PostgreSQL + RabbitMQ, then this
//! cargo run -p ecommerce                      # servers running: every role in one process, on 127.0.0.1:3000
//! cargo run -p ecommerce -- api               # or one role per process: api | relay | inventory | loyalty
//! curl -s localhost:3000/healthz
//! ```
//!
//! Settings come from `DATABASE_URL`, `AMQP_URL`, `BIND`, `EXCHANGE`,
//! `QUEUE_PREFIX`, `ADMIN_TOKEN`, `ADMIN_READ_TOKEN` and `RUST_LOG` (see
//! `ecommerce::config`). Ctrl-C or `SIGTERM` stops it gracefully.

use std::io::IsTerminal;
use std::process::ExitCode;

use ecommerce::config::Config;
use ecommerce::shutdown::Shutdown;
use ecommerce::{Role, error_chain};
use tracing_subscriber::EnvFilter;

const USAGE: &str = "usage: ecommerce [all|api|relay|inventory|loyalty]  (default: all)

Environment:
  DATABASE_URL  default postgres://postgres@127.0.0.1:5432/ecommerce (created if missing)
  AMQP_URL      default amqp://guest:guest@127.0.0.1:5672/%2f
                (a cluster: every node's URL, comma-separated)
  BIND          default 127.0.0.1:3000 (roles api and all)
  EXCHANGE      default ecommerce.events
  QUEUE_PREFIX  default ecommerce
  ADMIN_TOKEN   unset: no admin API; set: the admin API at /admin (operator bearer token)
  ADMIN_READ_TOKEN  unset; a read-only bearer token for the admin API
  RUST_LOG      default info,lapin::returned_messages=error";

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,lapin::returned_messages=error".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    let role = match parse_args(std::env::args().skip(1)) {
        Ok(Some(role)) => role,
        Ok(None) => {
            print_usage();
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            tracing::error!("{message}");
            print_usage();
            return ExitCode::from(2);
        }
    };
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(error) => {
            tracing::error!(error = %error_chain(&error), "invalid configuration");
            return ExitCode::from(2);
        }
    };

    let shutdown = Shutdown::new();
    shutdown.trigger_on_signals();
    match ecommerce::run(role, config, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(error = %error_chain(&error), "ecommerce stopped with an error");
            ExitCode::FAILURE
        }
    }
}

/// The role from the arguments; `None` for `--help`.
fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Option<Role>, String> {
    let role = match args.next().as_deref() {
        None => Role::All,
        Some("-h" | "--help" | "help") => return Ok(None),
        Some(name) => name
            .parse()
            .map_err(|e: ecommerce::UnknownRole| e.to_string())?,
    };
    match args.next() {
        None => Ok(Some(role)),
        Some(extra) => Err(format!("unexpected argument {extra:?}")),
    }
}

#[allow(clippy::print_stderr)] // the command line's own help text
fn print_usage() {
    eprintln!("{USAGE}");
}
