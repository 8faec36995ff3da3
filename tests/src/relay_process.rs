//! A relay as a real child process (the `outbox-fault-relay` binary of this
//! package), so that a fault is a real `SIGKILL`: no destructor runs, the
//! kernel closes its sockets, PostgreSQL rolls back its claim.

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::Scenario;

/// The line the relay prints when it reaches the failpoint it was told to
/// crash at, just before it SIGKILLs itself.
pub const CRASH_LINE: &str = "OUTBOX-FAULT-RELAY CRASHING AT";
/// The line the relay prints once it runs.
pub const READY_LINE: &str = "OUTBOX-FAULT-RELAY RUNNING";

/// Environment variables the relay binary reads.
pub mod env {
    /// Database URL; its scheme chooses the store (`postgres://`,
    /// `mysql://`, `sqlite://`).
    pub const DATABASE_URL: &str = "DATABASE_URL";
    /// RabbitMQ URL.
    pub const AMQP_URL: &str = "AMQP_URL";
    /// Schema of the outbox (PostgreSQL only).
    pub const SCHEMA: &str = "OUTBOX_FAULT_SCHEMA";
    /// Exchange to publish to.
    pub const EXCHANGE: &str = "OUTBOX_FAULT_EXCHANGE";
    /// Name of the relay: AMQP connection name and prefix of its
    /// PostgreSQL `application_name`.
    pub const NAME: &str = "OUTBOX_FAULT_NAME";
    /// A failpoint name (`outbox::failpoints`): crash there.
    pub const CRASH_AT: &str = "OUTBOX_FAULT_CRASH_AT";
    /// Crash the n-th time the failpoint is reached (default 1).
    pub const CRASH_ON_HIT: &str = "OUTBOX_FAULT_CRASH_ON_HIT";
}

/// A running relay child process; SIGKILLed when dropped.
#[derive(Debug)]
pub struct RelayProcess {
    /// `<scenario>.<name>`.
    pub name: String,
    child: Child,
    /// Held open: the relay stops when it closes, so a relay never outlives
    /// a test process that was killed before it could kill the relay.
    _lifeline: Option<tokio::process::ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
}

impl RelayProcess {
    pub(crate) fn spawn(
        binary: &str,
        scenario: &Scenario,
        name: &str,
        crash_at: Option<(&'static str, u32)>,
    ) -> RelayProcess {
        let mut cmd = Command::new(binary);
        cmd.env(env::DATABASE_URL, &scenario.servers.database_url)
            .env(env::AMQP_URL, &scenario.servers.amqp_url)
            .env(env::SCHEMA, &scenario.schema)
            .env(env::EXCHANGE, &scenario.exchange)
            .env(env::NAME, name)
            .env_remove(env::CRASH_AT)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some((failpoint, nth)) = crash_at {
            cmd.env(env::CRASH_AT, failpoint)
                .env(env::CRASH_ON_HIT, nth.to_string());
        }
        let mut child = cmd.spawn().unwrap_or_else(|e| {
            panic!("cannot start the relay {binary}: {e} (cargo builds it with the tests)")
        });
        let (send, lines) = mpsc::unbounded_channel();
        if let Some(stdout) = child.stdout.take() {
            tokio::spawn(async move {
                let mut reader = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = reader.next_line().await {
                    if send.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        RelayProcess {
            name: name.to_owned(),
            _lifeline: child.stdin.take(),
            child,
            lines,
        }
    }

    /// Waits until the relay says it runs.
    pub async fn ready(&mut self) {
        self.expect_line(READY_LINE, Duration::from_secs(30)).await;
    }

    async fn expect_line(&mut self, prefix: &str, limit: Duration) -> String {
        let found = tokio::time::timeout(limit, async {
            while let Some(line) = self.lines.recv().await {
                if line.starts_with(prefix) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(line)) => line,
            Ok(None) => panic!(
                "relay {} ended without printing {prefix:?}: {:?}",
                self.name,
                self.child.try_wait()
            ),
            Err(_) => panic!(
                "relay {} did not print {prefix:?} within {limit:?}",
                self.name
            ),
        }
    }

    /// Waits until the relay crashed at the failpoint it was told to: it
    /// printed the crash line naming the failpoint and was killed by
    /// `SIGKILL`. Returns the failpoint name.
    pub async fn crashed(&mut self, limit: Duration) -> String {
        let line = self.expect_line(CRASH_LINE, limit).await;
        let status = tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("relay {} still runs after its crash line", self.name))
            .unwrap_or_else(|e| panic!("waiting for relay {}: {e}", self.name));
        assert_eq!(
            killed_by(&status),
            Some(9),
            "relay {} should have SIGKILLed itself, ended with {status}",
            self.name
        );
        line.trim_start_matches(CRASH_LINE).trim().to_owned()
    }

    /// SIGKILLs the relay and waits until it is gone.
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// SIGTERM: the relay finishes its batches in flight and exits; panics
    /// unless it exits with status 0 within `limit`.
    pub async fn terminate(&mut self, limit: Duration) {
        let Some(pid) = self.child.id() else {
            panic!("relay {} is not running", self.name);
        };
        let sent = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
        assert!(sent.is_ok_and(|s| s.success()), "kill -TERM {pid}");
        let status = tokio::time::timeout(limit, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("relay {} ignored SIGTERM for {limit:?}", self.name))
            .unwrap_or_else(|e| panic!("waiting for relay {}: {e}", self.name));
        assert!(status.success(), "relay {} exited with {status}", self.name);
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

fn killed_by(status: &ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}
