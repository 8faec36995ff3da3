//! [`PrivateRabbit`]: a RabbitMQ node of its own, which a test may stop,
//! restart or freeze ([`Frozen`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{ServerDir, as_service_user, run, running_as_root, server_dir, wait_for_port};
use crate::amqp::parse_connections;
use crate::net::free_port;

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
        let rabbit = PrivateRabbit::spawn();
        rabbit.await_startup();
        rabbit
    }

    /// Starts booting the node and returns at once (several nodes then
    /// boot in parallel); [`await_startup`](Self::await_startup) waits.
    pub(super) fn spawn() -> PrivateRabbit {
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
        PrivateRabbit {
            dir,
            node,
            port,
            server,
        }
    }

    /// Waits until the node accepts AMQP connections and has booted.
    pub(super) fn await_startup(&self) {
        wait_for_port(
            self.port,
            Duration::from_secs(90),
            "the private RabbitMQ node",
        );
        self.ctl(&["await_startup"]);
    }

    /// The Erlang node name (`outbox-…@localhost`).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The AMQP port.
    pub fn port(&self) -> u16 {
        self.port
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
