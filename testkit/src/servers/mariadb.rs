//! [`PrivateMariadb`]: a throwaway `mariadbd` with TLS on a port of its own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{ServerDir, as_service_user, run, running_as_root, server_dir, wait_for_port};
use crate::net::free_port;
use crate::pki::TestPki;

/// The server program (`mariadbd`) and `mariadb-install-db`, installed by
/// `scripts/dev-services` (Debian's `mariadb-server`).
const MARIADBD: &str = "/usr/sbin/mariadbd";
const INSTALL_DB: &str = "/usr/bin/mariadb-install-db";

/// A throwaway MariaDB server (`mariadb-install-db`, then `mariadbd`) on
/// its own port of 127.0.0.1, serving `pki`'s server certificate (for
/// `localhost`) over TLS, with a user [`USER`](Self::USER) /
/// [`PASSWORD`](Self::PASSWORD) (created over the server's Unix socket)
/// and a database [`DATABASE`](Self::DATABASE). Killed and its directory
/// removed on drop.
#[derive(Debug)]
pub struct PrivateMariadb {
    child: Child,
    port: u16,
    // Last: removed after the server is killed.
    dir: ServerDir,
}

impl PrivateMariadb {
    /// The user it creates, with every privilege.
    pub const USER: &str = "outbox_tls";
    /// Its password.
    pub const PASSWORD: &str = "outbox-tls-secret";
    /// The database it creates for the test.
    pub const DATABASE: &str = "outbox_tls";

    /// Starts a server that offers TLS and also accepts plaintext.
    ///
    /// # Panics
    /// When the MariaDB binaries are missing (saying how to install them)
    /// or the server does not start.
    pub fn start(pki: &TestPki) -> PrivateMariadb {
        Self::start_with(pki, false)
    }

    /// As [`PrivateMariadb::start`], with `--require-secure-transport`: a
    /// plaintext connection over TCP is refused.
    ///
    /// # Panics
    /// As [`PrivateMariadb::start`].
    pub fn start_tls_only(pki: &TestPki) -> PrivateMariadb {
        Self::start_with(pki, true)
    }

    fn start_with(pki: &TestPki, tls_only: bool) -> PrivateMariadb {
        for program in [MARIADBD, INSTALL_DB] {
            assert!(
                Path::new(program).is_file(),
                "{program} not found: install MariaDB's server with scripts/dev-services"
            );
        }
        let dir = server_dir("mariadb", "mysql");
        let data = dir.join("data");
        // A temporary directory of its own: bootstraps running at the same
        // time collide on their temporary tables' names in /tmp.
        let tmp = dir.join("tmp");
        std::fs::create_dir(&tmp)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", tmp.display()));
        if running_as_root() {
            run(Command::new("chown").arg("mysql").arg(&tmp), "chown");
        }
        run(
            as_service_user("mysql", Path::new(INSTALL_DB))
                .arg("--no-defaults")
                .arg(format!("--datadir={}", data.display()))
                .arg(format!("--tmpdir={}", tmp.display()))
                .args(["--auth-root-authentication-method=socket", "--skip-test-db"]),
            "mariadb-install-db",
        );
        for (from, to) in [
            (pki.ca(), "ca.crt"),
            (pki.server_cert(), "server.crt"),
            (pki.server_key(), "server.key"),
        ] {
            let to = dir.join(to);
            std::fs::copy(&from, &to)
                .unwrap_or_else(|e| panic!("cannot copy {}: {e}", from.display()));
            if running_as_root() {
                run(Command::new("chown").arg("mysql").arg(&to), "chown");
            }
        }
        let port = free_port();
        let socket = dir.join("sock");
        let path_arg = |name: &str, path: PathBuf| format!("--{name}={}", path.display());
        let mut cmd = as_service_user("mysql", Path::new(MARIADBD));
        cmd.arg("--no-defaults")
            .arg(path_arg("datadir", data))
            .arg(path_arg("tmpdir", tmp))
            .arg(path_arg("socket", socket.clone()))
            .arg(path_arg("pid-file", dir.join("pid")))
            .arg(path_arg("log-error", dir.join("error.log")))
            .arg(format!("--port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg(path_arg("ssl-ca", dir.join("ca.crt")))
            .arg(path_arg("ssl-cert", dir.join("server.crt")))
            .arg(path_arg("ssl-key", dir.join("server.key")))
            .args([
                "--skip-log-bin",
                "--innodb-buffer-pool-size=16M",
                "--innodb-flush-log-at-trx-commit=0",
            ]);
        if tls_only {
            cmd.arg("--require-secure-transport=ON");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {MARIADBD}: {e}"));
        let server = PrivateMariadb { child, port, dir };
        server.wait_ready(&socket);
        let (user, password, database) = (Self::USER, Self::PASSWORD, Self::DATABASE);
        let sql = format!(
            "CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'; \
             GRANT ALL ON *.* TO '{user}'@'%'; \
             CREATE DATABASE {database} CHARACTER SET utf8mb4;"
        );
        run(
            Command::new("mariadb")
                .args(["--no-defaults", "-u", "root"])
                .arg(format!("--socket={}", socket.display()))
                .args(["-e", &sql]),
            "mariadb (creating the test user)",
        );
        server
    }

    /// Waits for the socket and the port (the server answers on both once
    /// it is ready), or panics with the server's log.
    fn wait_ready(&self, socket: &Path) {
        let limit = Duration::from_secs(60);
        let deadline = Instant::now() + limit;
        while !socket.exists() {
            assert!(
                Instant::now() < deadline,
                "mariadbd did not start within {limit:?}; its log:\n{}",
                std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        wait_for_port(self.port, limit, "mariadbd");
    }

    /// `mysql://USER:PASSWORD@localhost:PORT/DATABASE`: `localhost` (which
    /// the server's certificate names) on 127.0.0.1, over TCP.
    pub fn url(&self) -> String {
        format!(
            "mysql://{}:{}@localhost:{}/{}",
            Self::USER,
            Self::PASSWORD,
            self.port,
            Self::DATABASE
        )
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for PrivateMariadb {
    fn drop(&mut self) {
        // mariadbd itself first (by its pid file: as root, `child` is
        // `runuser`, which a SIGKILL would not pass on), then `runuser`
        // exits and reaps it; a test server needs no clean shutdown.
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("pid")) {
            let _ = Command::new("kill")
                .args(["-9", pid.trim()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
