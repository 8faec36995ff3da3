//! One module per verb group; [`run`] dispatches.

use std::io::{BufRead as _, IsTerminal as _, Write as _};

use outbox_core::admin::{Admin, Caller};
use outbox_diesel::PgSettings;
use outbox_diesel::mysql::MysqlSettings;
use outbox_diesel::sqlite::SqliteSettings;

use crate::backend::{AnyDeadLetters, AnyStore, Backend};

use crate::cli::{Cli, Command, Global};
use crate::error::{Error, Result};
use crate::output::Output;

mod dead;
mod dlq;
mod events;
mod mutate;
mod relays;
mod schema;
mod status;

/// Runs the parsed command line.
pub(crate) async fn run(cli: Cli) -> Result<()> {
    let out = Output::new(cli.global.json);
    match cli.command {
        Command::Ddl => schema::ddl(&cli.global, out),
        Command::Migrate(args) => schema::migrate(&cli.global, out, &args).await,
        Command::Dlq(cmd) => dlq::run(&cli.global, out, cmd).await,
        command => {
            let ctx = Context::connect(&cli.global, out).await?;
            match command {
                Command::Status => status::status(&ctx).await,
                Command::Events(cmd) => events::run(&ctx, cmd).await,
                Command::Dead(cmd) => dead::run(&ctx, cmd).await,
                Command::Replay(args) => mutate::replay(&ctx, &args).await,
                Command::Skip(args) => mutate::skip(&ctx, &args).await,
                Command::RetryNow(args) => mutate::retry_now(&ctx, &args).await,
                Command::Purge(cmd) => mutate::purge(&ctx, cmd).await,
                Command::Relays(cmd) => relays::run(&ctx, cmd).await,
                Command::Audit(args) => relays::audit(&ctx, &args).await,
                Command::ExplainClaim(args) => schema::explain_claim(&ctx, &args).await,
                Command::Ddl | Command::Migrate(_) | Command::Dlq(_) => Ok(()),
            }
        }
    }
}

/// What a command against the database works with.
#[derive(Debug)]
pub(crate) struct Context {
    pub(crate) admin: Admin<AnyStore>,
    /// Consumers' dead letters, in the same schema.
    pub(crate) dead_letters: AnyDeadLetters,
    pub(crate) caller: Caller,
    pub(crate) out: Output,
    pub(crate) yes: bool,
    /// Rows (or messages) per chunk of a long run.
    pub(crate) chunk_size: usize,
}

impl Context {
    pub(crate) async fn connect(global: &Global, out: Output) -> Result<Context> {
        let url = database_url(global)?;
        let prepared = !global.no_prepared_statements;
        // One direct connection first: an unreachable server is exit code 5
        // with a hint, not a pool timeout later.
        let (store, dead_letters) = match backend_for(global, url)? {
            Backend::Postgres => {
                drop(outbox_diesel::connect(url).await.map_err(connect_error)?);
                let pool = outbox_diesel::pool(url, 2)?;
                let settings = PgSettings::new(&global.schema)?.prepared_statements(prepared);
                let dead_letters = settings.dead_letters(pool.clone());
                let store = settings.store(pool).build()?;
                (
                    AnyStore::Postgres(store),
                    AnyDeadLetters::Postgres(dead_letters),
                )
            }
            Backend::Mysql => {
                drop(
                    outbox_diesel::mysql::connect(url)
                        .await
                        .map_err(connect_error)?,
                );
                let pool = outbox_diesel::mysql::pool(url, 2)?;
                let settings = MysqlSettings::default().prepared_statements(prepared);
                let dead_letters = outbox_diesel::mysql::MysqlDeadLetters::new(pool.clone());
                let store = settings.store(pool);
                (AnyStore::Mysql(store), AnyDeadLetters::Mysql(dead_letters))
            }
            Backend::Sqlite => {
                // Opening a mistyped path would create an empty database
                // (and report "no outbox table"): only `migrate` creates one.
                if let Some(file) = outbox_diesel::sqlite::database_file(url)
                    && !file.exists()
                {
                    return Err(Error::Invalid(format!(
                        "no SQLite database at {}: check DATABASE_URL (`outbox migrate` creates \
                         the database and its tables)",
                        file.display()
                    )));
                }
                drop(
                    outbox_diesel::sqlite::connect(url)
                        .await
                        .map_err(connect_error)?,
                );
                let pool = outbox_diesel::sqlite::pool(url, 2)?;
                let settings = SqliteSettings::default().prepared_statements(prepared);
                let dead_letters = outbox_diesel::sqlite::SqliteDeadLetters::new(pool.clone());
                let store = settings.store(pool);
                (
                    AnyStore::Sqlite(store),
                    AnyDeadLetters::Sqlite(dead_letters),
                )
            }
        };
        let admin = Admin::new(store)
            .chunk_size(global.chunk_size)
            .dedup_window(global.dedup_window);
        let identity = global.identity.clone().unwrap_or_else(default_identity);
        Ok(Context {
            admin,
            dead_letters,
            caller: Caller::operator(identity),
            out,
            yes: global.yes,
            chunk_size: global.chunk_size,
        })
    }

    /// Whether a mutation selecting `count` events may go on: always for
    /// at most one, with `--yes`, or when the operator says so on a
    /// terminal; refused (exit 4) otherwise.
    pub(crate) fn confirm(&self, what: &str, count: Option<u64>) -> Result<()> {
        if self.yes || count.is_some_and(|n| n <= 1) {
            return Ok(());
        }
        let selected = count.map_or_else(
            || "an unknown number of rows".to_owned(),
            |n| format!("{n} events"),
        );
        self.confirm_text(what, &selected)
    }

    /// Whether a mutation that would change `selected` may go on: with
    /// `--yes`, or when the operator says so on a terminal; refused (exit
    /// 4) otherwise.
    pub(crate) fn confirm_text(&self, what: &str, selected: &str) -> Result<()> {
        if self.yes {
            return Ok(());
        }
        if std::io::stdin().is_terminal() && std::io::stderr().is_terminal() && !self.out.json {
            let mut err = std::io::stderr().lock();
            write!(err, "{what} {selected}? [y/N] ")?;
            err.flush()?;
            let mut answer = String::new();
            std::io::stdin().lock().read_line(&mut answer)?;
            if matches!(answer.trim(), "y" | "Y" | "yes") {
                return Ok(());
            }
            return Err(Error::Invalid("not confirmed: nothing changed".to_owned()));
        }
        Err(Error::Invalid(format!(
            "{what} would change {selected}: add --yes to confirm (or --dry-run to count)"
        )))
    }
}

/// `--database-url` or `DATABASE_URL`.
pub(crate) fn database_url(global: &Global) -> Result<&str> {
    global
        .database_url
        .as_deref()
        .filter(|u| !u.is_empty())
        .ok_or(Error::NoDatabaseUrl)
}

/// The back end `url` names.
pub(crate) fn backend(url: &str) -> Result<Backend> {
    Backend::of(url).ok_or_else(|| {
        Error::Invalid(format!(
            "DATABASE_URL {:?} names no back end the CLI knows: use postgres://…, mysql://… or \
             sqlite://path",
            outbox_core::redact_url(url)
        ))
    })
}

/// The back end `url` names, refusing PostgreSQL's `--schema` on the
/// others (MariaDB's outbox is in the URL's database, SQLite's in the
/// file): a mutation must never act on another outbox than the one named.
pub(crate) fn backend_for(global: &Global, url: &str) -> Result<Backend> {
    let backend = backend(url)?;
    if backend != Backend::Postgres && global.schema != DEFAULT_SCHEMA {
        return Err(Error::Invalid(format!(
            "--schema (OUTBOX_SCHEMA) {:?} is PostgreSQL's: on {} the outbox is in the URL's \
             database; leave it unset",
            global.schema,
            backend.name()
        )));
    }
    Ok(backend)
}

/// The default of `--schema`.
pub(crate) const DEFAULT_SCHEMA: &str = "public";

/// A failed connect: exit code 5 when the server cannot be reached or
/// refuses the login, the error's own code otherwise (a bad setting).
pub(crate) fn connect_error(error: outbox_diesel::Error) -> Error {
    match error {
        error @ outbox_diesel::Error::Connect { .. } => Error::Connect(error),
        error => Error::Store(error),
    }
}

/// `cli:$USER@$HOST`.
fn default_identity() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("USERNAME"))
        .unwrap_or_else(|_| "unknown".to_owned());
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("cli:{user}@{host}")
}
