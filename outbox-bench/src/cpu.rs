//! CPU per event: what a drain cost the machine's cores, next to its rate.
//!
//! On a small machine the database, the broker, the relay and the consumer
//! share the CPU, so the rate of a drain moves with what each of them
//! spends per event; the figure shows where the time goes and whether a
//! change to the relay made it cheaper.
//!
//! How it is measured (Linux `/proc`, read before the drain's clock starts
//! and again once the consumer has every event):
//! - **process**: `utime + stime` of `/proc/self/stat`, the bench process
//!   (every thread): it hosts the relay (or the raw publisher) *and* the
//!   consumer, so both are in the figure alike for the relay and for the
//!   ceilings.
//! - **database**, per back end ([`Db`]):
//!   - PostgreSQL: the backends serving the run's relay pool, found in
//!     `pg_stat_activity` by the `application_name` the bench gives that
//!     pool, then `utime + stime` of each `/proc/<pid>/stat` (a backend
//!     that appears during the drain counts from zero). PostgreSQL's
//!     background processes (WAL writer, checkpointer, autovacuum) are not
//!     counted: they are shared with whatever else uses the server, and
//!     the backends do the claim, the commit and its WAL flush.
//!   - MariaDB: the whole `mariadbd`/`mysqld` process (one process, a
//!     thread per connection): anything else that uses the server at the
//!     same time is counted too.
//!   - SQLite: none apart, the database runs inside the bench process.
//! - **broker**: RabbitMQ's server process (`beam.smp`) on this machine,
//!   all of it (W5 reports it): other clients of the broker count too.
//! - **busy**: the share of the whole machine's CPU time (`/proc/stat`,
//!   every process, every core) that was not idle, for telling a quiet
//!   machine's figures from a loaded one's.
//!
//! The unit is the kernel's clock tick (`getconf CLK_TCK`, 100 per second
//! on Linux), so a drain of a few seconds is measured to a few per cent;
//! the quick run's short drains are coarse. The window ends after the
//! consumer's 200 ms watch for duplicates, in which the relay only polls.

use std::sync::OnceLock;
use std::time::Duration;

use diesel_async::RunQueryDsl;

use crate::setup::{BoxError, database_url};

/// Where a run's database spends its CPU.
#[derive(Debug, Clone)]
pub(crate) enum Db {
    /// The PostgreSQL backends whose `application_name` is this.
    Postgres { application_name: String },
    /// The whole MariaDB server process.
    Mariadb,
    /// Inside the bench process (SQLite): no separate figure.
    InProcess,
    /// The drain touches no database (the raw ceilings).
    None,
}

impl Db {
    /// How the database column is measured, for the table's header.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Db::Postgres { .. } => {
                "PostgreSQL backends of the relay pool (pg_stat_activity by application_name)"
            }
            Db::Mariadb => "the whole mariadbd process (also counts other clients)",
            Db::InProcess => "in the bench process (SQLite runs inside it)",
            Db::None => "none",
        }
    }
}

/// CPU time a drain used.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cpu {
    /// The bench process: the relay or raw publisher, and the consumer.
    pub(crate) process: Duration,
    /// The database's share ([`Db`]); `None` where it has none apart.
    pub(crate) db: Option<Duration>,
    /// RabbitMQ's server process (`beam.smp`); zero where it does not run
    /// on this machine.
    pub(crate) broker: Duration,
    /// Share of the machine's CPU time busy (every process); NaN where
    /// `/proc/stat` cannot be read.
    pub(crate) busy: f64,
}

impl Cpu {
    /// Microseconds per event of the process and of the database.
    pub(crate) fn per_event_us(&self, events: usize) -> (f64, Option<f64>) {
        let per = |d: Duration| d.as_secs_f64() * 1e6 / events.max(1) as f64;
        (per(self.process), self.db.map(per))
    }
}

/// Readings taken when a drain starts, for [`Meter::stop`].
pub(crate) struct Meter {
    db: Db,
    process: u64,
    /// (pid, ticks) of each database process read at the start.
    db_start: Vec<(u32, u64)>,
    /// (pid, ticks) of each broker process read at the start.
    broker_start: Vec<(u32, u64)>,
    /// (busy, total) ticks of the machine at the start.
    machine_start: Option<(u64, u64)>,
}

impl Meter {
    /// Reads the counters of the process and of `db`.
    pub(crate) async fn start(db: &Db) -> Result<Meter, BoxError> {
        let db_start = db_ticks(db).await?;
        Ok(Meter {
            db: db.clone(),
            process: ticks("self").unwrap_or(0),
            db_start,
            broker_start: named_ticks(&["beam.smp"]),
            machine_start: machine_ticks(),
        })
    }

    /// The CPU used since [`Meter::start`].
    pub(crate) async fn stop(self) -> Result<Cpu, BoxError> {
        let process = ticks("self").unwrap_or(0).saturating_sub(self.process);
        let machine_end = machine_ticks();
        let broker = used_since(&self.broker_start, &named_ticks(&["beam.smp"]));
        let db = match self.db {
            Db::InProcess | Db::None => None,
            Db::Postgres { .. } | Db::Mariadb => {
                let end = db_ticks(&self.db).await?;
                // No process found (a database on another machine): no figure.
                (!end.is_empty()).then(|| from_ticks(used_since(&self.db_start, &end)))
            }
        };
        let busy = match (self.machine_start, machine_end) {
            (Some((busy, total)), Some((busy_end, total_end))) if total_end > total => {
                busy_end.saturating_sub(busy) as f64 / (total_end - total) as f64
            }
            _ => f64::NAN,
        };
        Ok(Cpu {
            process: from_ticks(process),
            db,
            broker: from_ticks(broker),
            busy,
        })
    }
}

/// `url` with `application_name` set to `name`, so the backends of a pool
/// built on it can be found in `pg_stat_activity`.
pub(crate) fn url_with_application_name(url: &str, name: &str) -> String {
    if url.contains("://") {
        let separator = if url.contains('?') { '&' } else { '?' };
        format!("{url}{separator}application_name={name}")
    } else {
        format!("{url} application_name={name}")
    }
}

/// Ticks the processes of `end` used since `start` (a process that
/// appeared in between counts from zero).
fn used_since(start: &[(u32, u64)], end: &[(u32, u64)]) -> u64 {
    end.iter()
        .map(|&(pid, t)| {
            let before = start.iter().find(|(p, _)| *p == pid).map_or(0, |&(_, b)| b);
            t.saturating_sub(before)
        })
        .sum()
}

fn from_ticks(ticks: u64) -> Duration {
    Duration::from_secs_f64(ticks as f64 / clock_ticks_per_second() as f64)
}

/// `getconf CLK_TCK` (read once; 100, Linux's value, if it cannot be run).
fn clock_ticks_per_second() -> u64 {
    static TICKS: OnceLock<u64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .filter(|&t| t > 0)
            .unwrap_or(100)
    })
}

/// `utime + stime` of `/proc/<pid>/stat` in clock ticks (`None` when the
/// process is gone or unreadable).
fn ticks(pid: &str) -> Option<u64> {
    parse_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// `utime + stime` of the text of a `/proc/<pid>/stat`.
fn parse_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) is in parentheses and may hold spaces:
    // count fields after its closing one. Field 3 (state) is index 0,
    // so utime (14) and stime (15) are 11 and 12.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// (pid, ticks) of each process of `db` now.
async fn db_ticks(db: &Db) -> Result<Vec<(u32, u64)>, BoxError> {
    Ok(match db {
        Db::InProcess | Db::None => Vec::new(),
        Db::Postgres { application_name } => {
            #[derive(diesel::QueryableByName)]
            struct Pid {
                #[diesel(sql_type = diesel::sql_types::Integer)]
                pid: i32,
            }
            let mut conn = outbox::postgres::connect(&database_url()).await?;
            let pids: Vec<Pid> =
                diesel::sql_query("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
                    .bind::<diesel::sql_types::Text, _>(application_name.as_str())
                    .load(&mut conn)
                    .await?;
            pids.into_iter()
                .filter_map(|p| {
                    let pid = u32::try_from(p.pid).ok()?;
                    Some((pid, ticks(&pid.to_string())?))
                })
                .collect()
        }
        Db::Mariadb => named_ticks(&["mariadbd", "mysqld"]),
    })
}

/// (pid, ticks) of each process whose command name (`/proc/<pid>/comm`) is
/// one of `names`; none where `/proc` cannot be read.
fn named_ticks(names: &[&str]) -> Vec<(u32, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let entry = entry.ok()?;
        let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(entry.path().join("comm")).ok()?;
        if !names.contains(&comm.trim()) {
            return None;
        }
        Some((pid, ticks(&pid.to_string())?))
    })
    .collect()
}

/// (busy, total) clock ticks of the whole machine, from the first line of
/// `/proc/stat` (user nice system idle iowait irq softirq steal …; idle
/// and iowait are not busy).
fn machine_ticks() -> Option<(u64, u64)> {
    parse_machine_ticks(&std::fs::read_to_string("/proc/stat").ok()?)
}

fn parse_machine_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect();
    let total: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
    Some((total - idle.min(total), total))
}

#[cfg(test)]
mod tests {
    use super::parse_ticks;

    #[test]
    fn utime_and_stime_are_read_after_a_command_name_with_spaces_and_parentheses() {
        // Fields 14 (utime) = 1234 and 15 (stime) = 56.
        let stat = "4242 (tokio (w) 1) S 1 4242 4242 0 -1 4194560 900 0 0 0 1234 56 0 0 20 0 \
                    6 0 1000 2000000 500 18446744073709551615";
        assert_eq!(parse_ticks(stat), Some(1290));
    }

    #[test]
    fn a_truncated_line_is_no_figure() {
        assert_eq!(parse_ticks("4242 (postgres) S 1 4242"), None);
    }

    #[test]
    fn the_machine_is_busy_outside_idle_and_iowait() {
        // user 10, nice 1, system 4, idle 80, iowait 5, irq 0, softirq 0,
        // steal 0; guest fields after the eighth are in user already.
        let stat = "cpu  10 1 4 80 5 0 0 0 3 0\ncpu0 5 0 2 40 3 0 0 0 0 0\n";
        assert_eq!(super::parse_machine_ticks(stat), Some((15, 100)));
    }

    #[test]
    fn this_process_has_a_reading() {
        assert!(super::ticks("self").is_some());
    }
}
