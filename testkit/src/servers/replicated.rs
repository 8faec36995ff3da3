//! [`ReplicatedPostgres`]: a primary and a streaming standby, two throwaway
//! clusters on ports of their own, for failover scenarios.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::postgres::{initdb, postgres_bin};
use super::{ServerDir, as_service_user, run, server_dir};
use crate::net::free_port;

/// How the standby confirms commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// `synchronous_standby_names = '*'` on the primary (with
    /// `synchronous_commit = on`): a `COMMIT` returns once the standby has
    /// flushed its WAL, so a commit the client saw survives the primary.
    Synchronous,
    /// PostgreSQL's default: a `COMMIT` returns once the primary has it; the
    /// standby may lag, and what it had not received when the primary died
    /// is gone with it.
    Asynchronous,
}

/// A primary and a standby streaming from it (`pg_basebackup -R`), each an
/// `initdb` cluster on its own port; removed on drop. Trust auth for user
/// `postgres` on 127.0.0.1; `fsync` off (only server processes go down in
/// these tests, never the machine).
///
/// A failover: [`kill_primary`](Self::kill_primary) (`pg_ctl stop -m
/// immediate`, as a crash; it is never started again, which would make two
/// primaries), then [`promote_standby`](Self::promote_standby). Clients on
/// [`url`](Self::url), which names both servers, find the one that takes
/// writes with `target_session_attrs=read-write`.
///
/// After the promotion the new primary has no standby: its commits are
/// asynchronous whatever the mode was (its `synchronous_standby_names` is
/// empty, or every commit would wait forever).
#[derive(Debug)]
pub struct ReplicatedPostgres {
    primary: ServerDir,
    standby: ServerDir,
    bin: PathBuf,
    primary_port: u16,
    standby_port: u16,
    replication: Replication,
}

impl ReplicatedPostgres {
    /// Creates the primary, copies it into the standby with
    /// `pg_basebackup`, starts both and waits until the standby streams
    /// (and, with [`Replication::Synchronous`], is the synchronous one): a
    /// few seconds.
    pub fn start(replication: Replication) -> ReplicatedPostgres {
        let bin = postgres_bin();
        let primary = server_dir("pg-primary", "postgres");
        let standby = server_dir("pg-standby", "postgres");
        initdb(&bin, &primary.join("data"));
        // initdb's pg_hba.conf (with `-A trust`) already lets replication
        // connections in from 127.0.0.1.
        let sync_names = match replication {
            Replication::Synchronous => "'*'",
            Replication::Asynchronous => "''",
        };
        append(
            &primary.join("data").join("postgresql.conf"),
            &format!(
                "\n# ReplicatedPostgres\nwal_level = replica\nmax_wal_senders = 5\n\
                 synchronous_commit = on\nsynchronous_standby_names = {sync_names}\n"
            ),
        );
        let pair = ReplicatedPostgres {
            primary,
            standby,
            bin,
            primary_port: free_port(),
            standby_port: free_port(),
            replication,
        };
        pair.pg_ctl_start(&pair.primary, pair.primary_port);
        run(
            as_service_user("postgres", &pair.bin.join("pg_basebackup"))
                .args(["-h", "127.0.0.1", "-p"])
                .arg(pair.primary_port.to_string())
                .args([
                    "-U",
                    "postgres",
                    "-X",
                    "stream",
                    "-c",
                    "fast",
                    "-R",
                    "--no-sync",
                ])
                .arg("-D")
                .arg(pair.standby.join("data")),
            "pg_basebackup",
        );
        // The copy has the primary's settings: a promoted standby with a
        // synchronous standby name would wait forever on every commit.
        append(
            &pair.standby.join("data").join("postgresql.conf"),
            "\n# the standby of ReplicatedPostgres\nsynchronous_standby_names = ''\n",
        );
        pair.pg_ctl_start(&pair.standby, pair.standby_port);
        pair.wait_streaming(Duration::from_secs(30));
        pair
    }

    /// Both servers, the primary first:
    /// `postgres://postgres@127.0.0.1:PRIMARY,127.0.0.1:STANDBY/postgres`.
    /// It sets no `target_session_attrs`: the outbox's connections add
    /// `read-write`; other clients should add it themselves.
    pub fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres",
            self.primary_port, self.standby_port
        )
    }

    /// The primary alone.
    pub fn primary_url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.primary_port
        )
    }

    /// The standby alone (read-only until promoted).
    pub fn standby_url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.standby_port
        )
    }

    /// The primary's port.
    pub fn primary_port(&self) -> u16 {
        self.primary_port
    }

    /// The standby's port.
    pub fn standby_port(&self) -> u16 {
        self.standby_port
    }

    /// The replication mode it was started with.
    pub fn replication(&self) -> Replication {
        self.replication
    }

    /// Cuts the replication: the standby's `primary_conninfo` is pointed at
    /// a closed port and reloaded, which restarts its WAL receiver; returns
    /// once the primary has no standby connected (within 30 s). From then
    /// on the standby receives nothing: with [`Replication::Asynchronous`]
    /// the primary commits on alone (what it commits now is lost if it
    /// dies), with [`Replication::Synchronous`] every `COMMIT` waits for a
    /// standby that does not come.
    pub fn cut_replication(&self) {
        append(
            &self.standby.join("data").join("postgresql.auto.conf"),
            &format!(
                "primary_conninfo = 'host=127.0.0.1 port={} user=postgres'\n",
                free_port()
            ),
        );
        run(self.pg_ctl(&self.standby).arg("reload"), "pg_ctl reload");
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.psql(
            self.primary_port,
            "SELECT count(*) FROM pg_stat_replication",
        ) != "0"
        {
            assert!(
                Instant::now() < deadline,
                "the standby on port {} still streams 30 s after its primary_conninfo changed",
                self.standby_port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the primary the hard way (`pg_ctl stop -m immediate`: every
    /// backend dies at once, as in a crash). It is never started again.
    pub fn kill_primary(&self) {
        run(
            self.pg_ctl(&self.primary)
                .args(["-w", "-m", "immediate", "stop"]),
            "pg_ctl stop (primary)",
        );
    }

    /// Promotes the standby (`pg_ctl promote -w`): it replays the WAL it
    /// received and takes writes.
    pub fn promote_standby(&self) {
        run(
            self.pg_ctl(&self.standby)
                .args(["-w", "-t", "60", "promote"]),
            "pg_ctl promote",
        );
    }

    /// Runs `sql` on the server at `port` with `psql`; its output, unaligned
    /// and without headers.
    pub fn psql(&self, port: u16, sql: &str) -> String {
        run(
            as_service_user("postgres", &self.bin.join("psql"))
                .args(["-X", "-A", "-t", "-h", "127.0.0.1", "-U", "postgres", "-p"])
                .arg(port.to_string())
                .args(["-d", "postgres", "-c", sql]),
            "psql",
        )
        .trim()
        .to_owned()
    }

    fn wait_streaming(&self, limit: Duration) {
        let state = match self.replication {
            Replication::Synchronous => "sync",
            Replication::Asynchronous => "async",
        };
        let sql = format!(
            "SELECT count(*) FROM pg_stat_replication \
             WHERE state = 'streaming' AND sync_state = '{state}'"
        );
        let deadline = Instant::now() + limit;
        loop {
            if self.psql(self.primary_port, &sql) == "1" {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the standby on port {} does not stream ({state}) from the primary on port {} \
                 after {limit:?}; see {}",
                self.standby_port,
                self.primary_port,
                self.standby.join("log").display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn pg_ctl(&self, dir: &Path) -> Command {
        let mut cmd = as_service_user("postgres", &self.bin.join("pg_ctl"));
        cmd.arg("-D").arg(dir.join("data"));
        cmd
    }

    fn pg_ctl_start(&self, dir: &Path, port: u16) {
        let options = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -k {} -c fsync=off -c max_connections=100",
            dir.display()
        );
        run(
            self.pg_ctl(dir)
                .args(["-w", "-t", "60", "-l"])
                .arg(dir.join("log"))
                .args(["-o", &options, "start"]),
            "pg_ctl start",
        );
    }
}

/// Appends `text` to the file at `path`.
fn append(path: &Path, text: &str) {
    use std::io::Write as _;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .unwrap_or_else(|e| panic!("cannot append to {}: {e}", path.display()));
}

impl Drop for ReplicatedPostgres {
    fn drop(&mut self) {
        for dir in [&self.standby, &self.primary] {
            let _ = self
                .pg_ctl(dir)
                .args(["-w", "-m", "immediate", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}
