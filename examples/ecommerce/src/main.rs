//! The example e-commerce service. **Not implemented yet**: it needs the
//! PostgreSQL, RabbitMQ and Axum adapters, which are on the roadmap.
//!
//! Run with:
//! ```text
//! scripts/demo
//! ```
#![allow(clippy::print_stderr)]

use std::process::ExitCode;

fn main() -> ExitCode {
    eprintln!(
        "ecommerce: the example service is not implemented yet; it lands with the \
         PostgreSQL, RabbitMQ and Axum adapters (see README.md, \"Roadmap\")."
    );
    ExitCode::from(2)
}
