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
//! `ecommerce::config`); traces are exported by OTLP/HTTP when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set (see `ecommerce::telemetry`).
//! Ctrl-C or `SIGTERM` stops it gracefully.

use std::process::ExitCode;

use ecommerce::config::Config;
use ecommerce::shutdown::Shutdown;
use ecommerce::{Role, error_chain, telemetry};

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
  RUST_LOG      default info,lapin::returned_messages=error
  OTEL_EXPORTER_OTLP_ENDPOINT  unset: no traces exported; set (e.g. http://127.0.0.1:4318):
                spans exported by OTLP/HTTP, service OTEL_SERVICE_NAME (default ecommerce-<role>)";

fn main() -> ExitCode {
    let args = parse_args(std::env::args().skip(1));
    let role_name = match &args {
        Ok(Some(role)) => role.as_str(),
        _ => "all",
    };
    let tracing = telemetry::init_tracing(role_name);
    let code = match args {
        Ok(Some(role)) => run(role),
        Ok(None) => {
            print_usage();
            ExitCode::SUCCESS
        }
        Err(message) => {
            tracing::error!("{message}");
            print_usage();
            ExitCode::from(2)
        }
    };
    // After the runtime stopped: the last spans are exported by a blocking
    // HTTP call.
    tracing.shutdown();
    code
}

/// Runs `role` on a tokio runtime until a signal stops it.
fn run(role: Role) -> ExitCode {
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(error) => {
            tracing::error!(error = %error_chain(&error), "invalid configuration");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "the tokio runtime could not start");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        let shutdown = Shutdown::new();
        shutdown.trigger_on_signals();
        ecommerce::run(role, config, shutdown).await
    });
    drop(runtime);
    match outcome {
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
