//! The relay of the fault-injection suite, run as a child process by
//! `outbox_tests::RelayProcess`: the outbox store of the back end
//! `DATABASE_URL`'s scheme names (`postgres://`: PostgreSQL, in the schema
//! `OUTBOX_FAULT_SCHEMA`; `mysql://`: MariaDB; `sqlite://`: SQLite) and the
//! RabbitMQ publisher of the library, configured from the environment (see
//! `outbox_tests::relay_process::env`). With `OUTBOX_FAULT_CRASH_AT` set to
//! a failpoint name it SIGKILLs itself the n-th time the relay reaches that
//! point, after printing a line saying so. SIGTERM, or the end of its stdin
//! (the parent test process is gone), stops it gracefully.

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use outbox::mysql::MysqlSettings;
use outbox::postgres::PgOutboxStore;
use outbox::rabbitmq::LapinPublisher;
use outbox::sqlite::SqliteSettings;
use outbox::{OutboxStore, Relay, RetryPolicy, UnroutablePolicy};
use outbox_tests::relay_process::{CRASH_LINE, READY_LINE, env};

fn var(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set"))
}

/// Writes `line` to stdout at once (the parent reads it line by line).
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The crash: a real SIGKILL from outside the process, with this thread
/// stopped at the failpoint until it lands.
fn crash(failpoint: &str) -> ! {
    say(&format!("{CRASH_LINE} {failpoint}"));
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &std::process::id().to_string()])
        .status();
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

fn arm_crash() -> Result<(), String> {
    let Ok(wanted) = std::env::var(env::CRASH_AT) else {
        return Ok(());
    };
    let failpoint = outbox::failpoints::ALL
        .into_iter()
        .find(|f| *f == wanted)
        .ok_or_else(|| {
            format!(
                "{} = {wanted:?} is not a failpoint; one of {:?}",
                env::CRASH_AT,
                outbox::failpoints::ALL
            )
        })?;
    let nth: u32 = match std::env::var(env::CRASH_ON_HIT) {
        Ok(n) => n
            .parse()
            .map_err(|e| format!("{} = {n:?}: {e}", env::CRASH_ON_HIT))?,
        Err(_) => 1,
    };
    let hits = AtomicU32::new(0);
    fail::cfg_callback(failpoint, move || {
        if hits.fetch_add(1, Ordering::SeqCst) + 1 == nth {
            crash(failpoint);
        }
    })
}

/// `url` with `application_name` set, so tests can find (and terminate)
/// this relay's database sessions.
fn with_application_name(url: &str, name: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}application_name={name}")
}

/// How long a claim may take (PostgreSQL, MariaDB) or its lease lasts
/// (SQLite): on SQLite the rows a SIGKILLed relay had leased are taken
/// again after it, so it bounds the drain after a kill there. Above the
/// publisher's confirm timeout (5 s), as the stores require.
const CLAIM_TIMEOUT: Duration = Duration::from_secs(10);

async fn run() -> Result<(), String> {
    arm_crash()?;
    let database_url = var(env::DATABASE_URL)?;
    let name = var(env::NAME)?;
    if database_url.starts_with("mysql://") || database_url.starts_with("mariadb://") {
        let pool = outbox::mysql::pool(&database_url, 4).map_err(|e| e.to_string())?;
        let store = MysqlSettings::default()
            .store(pool)
            .claim_timeout(CLAIM_TIMEOUT);
        serve(store, &name).await
    } else if database_url.starts_with("sqlite:") {
        let pool = outbox::sqlite::pool(&database_url, 4).map_err(|e| e.to_string())?;
        let store = SqliteSettings::default()
            .store(pool)
            .claim_timeout(CLAIM_TIMEOUT);
        serve(store, &name).await
    } else {
        let schema = var(env::SCHEMA)?;
        let url = with_application_name(&database_url, &name);
        let pool = outbox::postgres::pool(&url, 4).map_err(|e| e.to_string())?;
        let store = PgOutboxStore::builder(pool)
            .schema(&schema)
            .listen(&url)
            .claim_timeout(CLAIM_TIMEOUT)
            .build()
            .map_err(|e| e.to_string())?;
        serve(store, &name).await
    }
}

/// Runs the relay on `store` until SIGTERM or the end of stdin.
async fn serve<S: OutboxStore>(store: S, name: &str) -> Result<(), String> {
    let amqp_url = var(env::AMQP_URL)?;
    let exchange = var(env::EXCHANGE)?;
    let publisher = LapinPublisher::builder(amqp_url)
        .exchange(&exchange)
        .source("/outbox-fault-relay")
        .connection_name(name)
        .confirm_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| e.to_string())?;
    let relay = Relay::builder(store, publisher)
        .batch_size(50)
        .poll_interval(Duration::from_millis(250))
        .pause(Duration::from_millis(50), Duration::from_secs(1))
        .retry(RetryPolicy::default().max_attempts(100))
        // Unroutable events are held (the default policy) but tried again
        // every second, not up to a minute apart: the `poison` scenario's
        // drain after a binding appears then measures the relay, not the
        // policy's cap.
        .unroutable(UnroutablePolicy::hold(
            Duration::from_secs(7 * 24 * 3600),
            Duration::from_secs(1),
        ))
        .shutdown_grace(Duration::from_secs(10))
        .build()
        .map_err(|e| e.to_string())?;
    let handle = relay.handle();
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("SIGTERM handler: {e}"))?;
    let on_term = handle.clone();
    tokio::spawn(async move {
        terminate.recv().await;
        on_term.shutdown();
    });
    // The parent holds our stdin open; when it goes away (even SIGKILLed),
    // stdin ends and the relay stops instead of living on as an orphan.
    std::thread::spawn(move || {
        use std::io::Read as _;
        let mut buf = [0u8; 64];
        while matches!(std::io::stdin().read(&mut buf), Ok(n) if n > 0) {}
        handle.shutdown();
    });
    say(READY_LINE);
    relay.run().await;
    Ok(())
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,lapin::returned_messages=error")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("outbox-fault-relay: {e}");
            ExitCode::from(2)
        }
    }
}
