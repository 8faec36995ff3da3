//! Private server instances: a PostgreSQL cluster or a RabbitMQ node
//! started for one test on ports of its own, so that it can be stopped,
//! restarted, frozen and broken without touching the shared servers
//! ([`urls`](crate::urls)) or any other test.
//!
//! Private instances need the server binaries of `scripts/dev-services`
//! (Debian's `postgresql` and `rabbitmq-server` packages). Run as root, the
//! harness starts them as the `postgres` and `rabbitmq` users (`runuser`),
//! as those servers refuse to run as root or keep their cookie there.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::amqp::parse_connections;
use crate::net::free_port;

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

/// The directory of PostgreSQL's server programs (`initdb`, `pg_ctl`):
/// `PG_BIN`, else `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/*/bin` holding `initdb`.
fn postgres_bin() -> PathBuf {
    if let Ok(dir) = std::env::var("PG_BIN") {
        return PathBuf::from(dir);
    }
    let has_initdb = |dir: &Path| dir.join("initdb").is_file();
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if has_initdb(&dir) {
            return dir;
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("bin"))
        .filter(|dir| has_initdb(dir))
        .collect();
    found.sort_by_key(|dir| {
        dir.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found.pop().unwrap_or_else(|| {
        panic!(
            "PostgreSQL's initdb not found (set PG_BIN, or install the server with \
             scripts/dev-services)"
        )
    })
}

/// A throwaway PostgreSQL cluster (`initdb`) on its own port, for
/// scenarios that restart or stop the database. Removed on drop.
#[derive(Debug)]
pub struct PrivatePostgres {
    dir: ServerDir,
    bin: PathBuf,
    port: u16,
    tls: bool,
}

impl PrivatePostgres {
    /// Creates and starts the cluster (a few seconds). Trust auth for user
    /// `postgres` on 127.0.0.1 only; `fsync` off, since only the server
    /// process (never the machine) goes down in these tests.
    pub fn start() -> PrivatePostgres {
        Self::start_with(None)
    }

    /// As [`PrivatePostgres::start`], with `ssl = on` serving `pki`'s server
    /// certificate, and TLS only: a plaintext connection over TCP is
    /// rejected (`hostnossl ... reject`), so a client that connects at all
    /// connected encrypted.
    pub fn start_tls(pki: &crate::pki::TestPki) -> PrivatePostgres {
        Self::start_with(Some(pki))
    }

    fn start_with(pki: Option<&crate::pki::TestPki>) -> PrivatePostgres {
        let bin = postgres_bin();
        let dir = server_dir("pg", "postgres");
        let data = dir.join("data");
        run(
            as_service_user("postgres", &bin.join("initdb"))
                .args([
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                    "-E",
                    "UTF8",
                    "--no-sync",
                    "-D",
                ])
                .arg(&data),
            "initdb",
        );
        if let Some(pki) = pki {
            for (from, to) in [
                (pki.server_cert(), "server.crt"),
                (pki.server_key(), "server.key"),
            ] {
                let to = dir.join(to);
                std::fs::copy(&from, &to)
                    .unwrap_or_else(|e| panic!("cannot copy {}: {e}", from.display()));
                // PostgreSQL refuses a key others may read.
                run(Command::new("chmod").arg("600").arg(&to), "chmod");
                if running_as_root() {
                    run(Command::new("chown").arg("postgres").arg(&to), "chown");
                }
            }
            std::fs::write(
                data.join("pg_hba.conf"),
                "local all all trust\n\
                 hostssl all all 127.0.0.1/32 trust\n\
                 hostnossl all all 127.0.0.1/32 reject\n",
            )
            .unwrap_or_else(|e| panic!("cannot write pg_hba.conf: {e}"));
        }
        let pg = PrivatePostgres {
            dir,
            bin,
            port: free_port(),
            tls: pki.is_some(),
        };
        pg.pg_ctl_start();
        pg
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    fn pg_ctl(&self) -> Command {
        let mut cmd = as_service_user("postgres", &self.bin.join("pg_ctl"));
        cmd.arg("-D").arg(self.dir.join("data"));
        cmd
    }

    fn pg_ctl_start(&self) {
        let mut options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off -c max_connections=100",
            self.port,
            self.dir.display()
        );
        if self.tls {
            options.push_str(&format!(
                " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                self.dir.join("server.crt").display(),
                self.dir.join("server.key").display()
            ));
        }
        run(
            self.pg_ctl()
                .args(["-w", "-t", "60", "-l"])
                .arg(self.dir.join("log"))
                .args(["-o", &options, "start"]),
            "pg_ctl start",
        );
    }

    /// Stops the server the hard way (`pg_ctl stop -m immediate`: every
    /// backend dies without a checkpoint, as in a crash) and starts it
    /// again; it runs crash recovery on start.
    pub fn crash_restart(&self, down_for: Duration) {
        run(
            self.pg_ctl().args(["-w", "-m", "immediate", "stop"]),
            "pg_ctl stop",
        );
        std::thread::sleep(down_for);
        self.pg_ctl_start();
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self
            .pg_ctl()
            .args(["-w", "-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

const RABBITMQ_LIB: &str = "/usr/lib/rabbitmq/bin";

/// A second RabbitMQ node on its own ports, for scenarios that stop the
/// broker. Stopped and removed on drop.
#[derive(Debug)]
pub struct PrivateRabbit {
    dir: ServerDir,
    node: String,
    port: u16,
    server: std::process::Child,
}

impl PrivateRabbit {
    /// Boots the node (10–20 s on two cores) and waits until it accepts
    /// AMQP connections. No plugins, guest allowed on loopback.
    pub fn start() -> PrivateRabbit {
        let dir = server_dir("rabbit", "rabbitmq");
        let port = free_port();
        let dist_port = free_port();
        let node = format!(
            "outbox-{}-{}@localhost",
            std::process::id(),
            uuid::Uuid::now_v7().simple()
        );
        let config = dir.join("rabbitmq.conf");
        let plugins = dir.join("enabled_plugins");
        let written = std::fs::write(
            &config,
            format!("listeners.tcp.default = 127.0.0.1:{port}\n"),
        )
        .and_then(|()| std::fs::write(&plugins, "[].\n"));
        written.unwrap_or_else(|e| panic!("cannot write {}: {e}", dir.display()));
        if running_as_root() {
            run(
                Command::new("chown").arg("-R").arg("rabbitmq").arg(&*dir),
                "chown",
            );
        }
        let program = Path::new(RABBITMQ_LIB).join("rabbitmq-server");
        assert!(
            program.is_file(),
            "{} not found: install RabbitMQ with scripts/dev-services",
            program.display()
        );
        let log = std::fs::File::create(dir.join("server.log"))
            .unwrap_or_else(|e| panic!("cannot create the node's log: {e}"));
        let log_err = log
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot clone the log handle: {e}"));
        let server = Self::env(as_service_user("rabbitmq", &program), &dir)
            .env("RABBITMQ_NODENAME", &node)
            .env("RABBITMQ_NODE_PORT", port.to_string())
            .env("RABBITMQ_DIST_PORT", dist_port.to_string())
            .env("RABBITMQ_CONFIG_FILE", &config)
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", &plugins)
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start rabbitmq-server: {e}"));
        let rabbit = PrivateRabbit {
            dir,
            node,
            port,
            server,
        };
        wait_for_port(
            rabbit.port,
            Duration::from_secs(90),
            "the private RabbitMQ node",
        );
        rabbit.ctl(&["await_startup"]);
        rabbit
    }

    /// The environment every RabbitMQ script of this node gets: the
    /// rabbitmq user's home (its Erlang cookie) and no system env file
    /// (which would pin the node name of the shared broker).
    fn env(mut cmd: Command, dir: &Path) -> Command {
        let home = if running_as_root() {
            PathBuf::from("/var/lib/rabbitmq")
        } else {
            std::env::var_os("HOME").map_or_else(|| dir.to_path_buf(), PathBuf::from)
        };
        cmd.current_dir(dir)
            .env("HOME", home)
            .env("RABBITMQ_CONF_ENV_FILE", "/dev/null");
        cmd
    }

    /// `amqp://guest:guest@127.0.0.1:PORT/%2f`.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// Runs `rabbitmqctl -n NODE ARGS...` and returns its output.
    pub fn ctl(&self, args: &[&str]) -> String {
        let program = Path::new(RABBITMQ_LIB).join("rabbitmqctl");
        let mut cmd = Self::env(as_service_user("rabbitmq", &program), &self.dir);
        cmd.args(["-q", "-n", &self.node]).args(args);
        run(&mut cmd, "rabbitmqctl")
    }

    /// `rabbitmqctl stop_app`: every connection drops and the port closes;
    /// durable queues and persistent messages stay on disk.
    pub fn stop_app(&self) {
        self.ctl(&["stop_app"]);
    }

    /// `rabbitmqctl start_app`, then waits until the port accepts again.
    pub fn start_app(&self) {
        self.ctl(&["start_app"]);
        wait_for_port(
            self.port,
            Duration::from_secs(60),
            "the restarted RabbitMQ node",
        );
    }

    /// The names of the client connections starting with `prefix`.
    pub fn connections(&self, prefix: &str) -> Vec<String> {
        parse_connections(&self.ctl(&["list_connections", "pid", "client_properties"]))
            .into_iter()
            .filter(|c| c.name.starts_with(prefix))
            .map(|c| c.name)
            .collect()
    }

    /// Force-closes every client connection whose name starts with
    /// `prefix`; returns how many.
    pub fn close_connections(&self, prefix: &str) -> usize {
        let program = Path::new(RABBITMQ_LIB).join("rabbitmqctl");
        parse_connections(&self.ctl(&["list_connections", "pid", "client_properties"]))
            .iter()
            .filter(|c| c.name.starts_with(prefix))
            .filter(|c| {
                Self::env(as_service_user("rabbitmq", &program), &self.dir)
                    .args(["-q", "-n", &self.node])
                    .args(["close_connection", &c.pid, "fault injected by test"])
                    .output()
                    .is_ok_and(|out| out.status.success())
            })
            .count()
    }
}

/// A [`PrivateRabbit`] node stopped with SIGSTOP (its sockets stay open,
/// nothing answers, not even heartbeats: a hung VM or a long GC pause);
/// continued when dropped, also when the test fails.
#[derive(Debug)]
pub struct Frozen {
    pid: String,
}

impl PrivateRabbit {
    /// Freezes the node until the returned guard is dropped.
    pub fn freeze(&self) -> Frozen {
        let pid = self
            .ctl(&["eval", "os:getpid()."])
            .trim()
            .trim_matches('"')
            .to_owned();
        assert!(
            pid.chars().all(|c| c.is_ascii_digit()) && !pid.is_empty(),
            "the node's OS pid: {pid:?}"
        );
        signal(&pid, "-STOP");
        Frozen { pid }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(&self.pid, "-CONT");
    }
}

fn signal(pid: &str, which: &str) {
    let status = Command::new("kill").args([which, pid]).status();
    assert!(
        status.is_ok_and(|s| s.success()),
        "kill {which} {pid} failed"
    );
}

impl Drop for PrivateRabbit {
    fn drop(&mut self) {
        let program = Path::new(RABBITMQ_LIB).join("rabbitmqctl");
        let _ = Self::env(as_service_user("rabbitmq", &program), &self.dir)
            .args(["-q", "-n", &self.node, "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = self.server.kill();
        let _ = self.server.wait();
        // Run as root, `server` is the `runuser` wrapper: make sure the
        // node itself is gone even if `rabbitmqctl stop` failed.
        let _ = Command::new("pkill")
            .args(["-KILL", "-f", &self.node])
            .status();
    }
}
