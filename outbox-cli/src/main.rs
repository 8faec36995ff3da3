//! The `outbox` binary: see the `outbox_cli` crate docs for its commands,
//! flags and exit codes.

fn main() -> std::process::ExitCode {
    outbox_cli::run()
}
