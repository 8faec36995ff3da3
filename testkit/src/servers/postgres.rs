//! [`PrivatePostgres`]: a throwaway `initdb` cluster on a port of its own.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{ServerDir, as_service_user, run, running_as_root, server_dir};
use crate::net::free_port;

/// The directory of PostgreSQL's server programs (`initdb`, `pg_ctl`):
/// `PG_BIN`, else `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/*/bin` holding `initdb`.
pub(super) fn postgres_bin() -> PathBuf {
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

/// `initdb` of a new cluster in `data`: trust auth for user `postgres`,
/// UTF8, no fsync of the new files.
pub(super) fn initdb(bin: &Path, data: &Path) {
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
            .arg(data),
        "initdb",
    );
}

/// A throwaway PostgreSQL cluster (`initdb`) on its own port, for
/// scenarios that restart or stop the database. Removed on drop.
#[derive(Debug)]
pub struct PrivatePostgres {
    dir: ServerDir,
    bin: PathBuf,
    port: u16,
    tls: bool,
    /// `-c name=value` given after the defaults (so they override them).
    settings: Vec<(String, String)>,
}

impl PrivatePostgres {
    /// Creates and starts the cluster (a few seconds). Trust auth for user
    /// `postgres` on 127.0.0.1 only; `fsync` off, since only the server
    /// process (never the machine) goes down in these tests.
    pub fn start() -> PrivatePostgres {
        Self::start_with(None, &[])
    }

    /// As [`PrivatePostgres::start`], with server settings (`-c name=value`)
    /// given after the defaults, so they override them: `("fsync", "on")`
    /// for a cluster that flushes as a production one does,
    /// `("autovacuum", "on")` to make sure autovacuum runs whatever the
    /// installation's `postgresql.conf` says. They hold across
    /// [`PrivatePostgres::crash_restart`].
    pub fn start_with_settings(settings: &[(&str, &str)]) -> PrivatePostgres {
        Self::start_with(None, settings)
    }

    /// As [`PrivatePostgres::start`], with `ssl = on` serving `pki`'s server
    /// certificate, and TLS only: a plaintext connection over TCP is
    /// rejected (`hostnossl ... reject`), so a client that connects at all
    /// connected encrypted.
    pub fn start_tls(pki: &crate::pki::TestPki) -> PrivatePostgres {
        Self::start_with(Some(pki), &[])
    }

    fn start_with(pki: Option<&crate::pki::TestPki>, settings: &[(&str, &str)]) -> PrivatePostgres {
        let bin = postgres_bin();
        let dir = server_dir("pg", "postgres");
        let data = dir.join("data");
        initdb(&bin, &data);
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
            settings: settings
                .iter()
                .map(|&(name, value)| (name.to_owned(), value.to_owned()))
                .collect(),
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
        for (name, value) in &self.settings {
            options.push_str(&format!(" -c {name}={value}"));
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
