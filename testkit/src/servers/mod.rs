//! Private server instances: a PostgreSQL cluster, a MariaDB server or a
//! RabbitMQ node
//! started for one test on ports of its own, so that it can be stopped,
//! restarted, frozen and broken without touching the shared servers
//! ([`urls`](crate::urls)) or any other test.
//!
//! Private instances need the server binaries of `scripts/dev-services`
//! (Debian's `postgresql`, `mariadb-server` and `rabbitmq-server`
//! packages). Run as root, the harness starts them as the `postgres`,
//! `mysql` and `rabbitmq` users (`runuser`), as those servers refuse to run
//! as root or keep their cookie there.
//!
//! [`PrivatePostgres`] lives in `postgres`, [`ReplicatedPostgres`] (a
//! primary and a streaming standby, for failovers) in `replicated`,
//! [`PrivateMariadb`] in `mariadb`, [`PrivateRabbit`] in `rabbit`,
//! [`PrivateRabbitCluster`] (three of them joined) in `rabbit_cluster`;
//! what they need to run a server program here.

mod mariadb;
mod postgres;
mod rabbit;
mod rabbit_cluster;
mod replicated;

pub use mariadb::PrivateMariadb;
pub use postgres::PrivatePostgres;
pub use rabbit::{Frozen, PrivateRabbit};
pub use rabbit_cluster::PrivateRabbitCluster;
pub use replicated::{ReplicatedPostgres, Replication};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// `program` as `user` when running as root (servers refuse root), else as
/// the current user.
fn as_service_user(user: &str, program: &Path) -> Command {
    if running_as_root() {
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", user, "--"]).arg(program);
        cmd
    } else {
        Command::new(program)
    }
}

/// A server's private directory, removed on drop (also when starting the
/// server fails half-way).
#[derive(Debug)]
struct ServerDir(PathBuf);

impl std::ops::Deref for ServerDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for ServerDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A private directory for a server, owned by `user` when running as root.
fn server_dir(kind: &str, user: &str) -> ServerDir {
    let dir = std::env::temp_dir().join(format!(
        "outbox-{kind}-{}-{}",
        std::process::id(),
        uuid::Uuid::now_v7().simple()
    ));
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    let dir = ServerDir(dir);
    if running_as_root() {
        run(Command::new("chown").arg(user).arg(&*dir), "chown");
    }
    dir
}

/// Runs `cmd` to completion; panics with its output when it fails.
fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}): {cmd:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn wait_for_port(port: u16, limit: Duration, what: &str) {
    let deadline = Instant::now() + limit;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{what} does not listen on 127.0.0.1:{port} after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
