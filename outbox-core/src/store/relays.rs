//! What a relay tells its store when it starts ([`RelayRegistration`]) and
//! learns from its heartbeat ([`RelayControl`]).

use std::time::Duration;

use chrono::{DateTime, Utc};

/// A relay as it registers itself with its store when it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayRegistration {
    /// Unique per outbox (see [`RelayBuilder::name`](crate::RelayBuilder::name)).
    pub name: String,
    /// The host it runs on.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// The library version.
    pub version: String,
    /// When it started.
    pub started_at: DateTime<Utc>,
    /// How often it heartbeats (its stats interval, at most 5 s).
    pub heartbeat_interval: Duration,
}

impl RelayRegistration {
    /// A registration for this process: host from `HOSTNAME` or
    /// `/etc/hostname`, this pid and library version, started now.
    pub fn new(name: impl Into<String>, heartbeat_interval: Duration) -> Self {
        RelayRegistration {
            name: name.into(),
            host: host_name(),
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            started_at: Utc::now(),
            heartbeat_interval,
        }
    }
}

/// This machine's name, or `unknown`.
pub(crate) fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// What a relay learns from its heartbeat (a pause also from its claims,
/// see [`OutboxStore::claim_for`](super::OutboxStore::claim_for)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayControl {
    /// An operator paused it: claim nothing until resumed.
    pub paused: bool,
}

impl RelayControl {
    /// Running, or paused.
    pub fn new(paused: bool) -> Self {
        RelayControl { paused }
    }
}
