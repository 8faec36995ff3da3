//! Cross-crate end-to-end tests of the outbox workspace, and the
//! fault-injection harness they use.
//!
//! The tests (in `tests/`) use the `outbox` facade exactly as an
//! application does, against the real PostgreSQL and RabbitMQ. The harness
//! in this library runs one fault-injection scenario:
//!
//! - [`servers`]: the shared servers, or private ones
//!   ([`PrivatePostgres`], a throwaway `initdb` cluster; [`PrivateRabbit`],
//!   a second RabbitMQ node) that a scenario may stop and restart;
//! - [`Scenario`]: its own schema (or, on the [`Backend`] MariaDB, its own
//!   database; on SQLite its own file), exchange and queues, removed on
//!   drop, and [`Scenario::verify`], which checks every guarantee at the
//!   end and prints one summary line;
//! - [`Producers`]: commit business rows with their events, roll some back
//!   on purpose, survive connection loss;
//! - [`RelayProcess`]: a relay as a real child process, SIGKILLed at random
//!   or at a named failpoint;
//! - [`Tap`] (records every message) and [`Inbox`] (the library's inbox
//!   consumer, whose effects must happen exactly once);
//! - [`TestPki`]: a throwaway CA and server certificate, for
//!   [`PrivatePostgres::start_tls`];
//! - [`example_binary`]: the example service, built once per run;
//! - [`Pipeline`]: a schema, an exchange and a queue of one test, and
//!   relays started on them (the relay and hostile-input tests).
//!
//! The servers' URLs, unique names, schema and broker guards, the private
//! servers and certificates come from the workspace's test kit,
//! `outbox-testkit`; this crate keeps what needs the library's types.
//! - [`KillingProxy`]: a TCP proxy in front of RabbitMQ that cuts a
//!   connection when the client sends a marker (a message that kills the
//!   connection it is sent on).
//!
//! ```no_run
//! # async fn scenario() {
//! use std::time::Duration;
//! use outbox_tests::*;
//!
//! let scenario = Scenario::new("example", Servers::shared()).await;
//! let tap = Tap::start(&scenario);
//! let inbox = Inbox::start(&scenario, 50, HandlerFaults::default());
//! let producers = Producers::start(&scenario, ProducerConfig::default());
//! let mut relay = scenario.spawn_relay("target/debug/outbox-fault-relay", "relay", None);
//! relay.ready().await;
//! tokio::time::sleep(Duration::from_secs(2)).await;
//! relay.kill().await;
//! scenario.fault("relay SIGKILL");
//! let mut relay = scenario.spawn_relay("target/debug/outbox-fault-relay", "relay", None);
//! let produced = producers.stop().await;
//! scenario.verify(&tap, &produced, Duration::from_secs(60)).await;
//! # }
//! ```

pub mod events;
mod example;
mod pipeline;
pub mod proxy;
pub mod relay_process;
mod scenario;
mod traffic;

/// The private servers and certificates, from the workspace's test kit
/// ([`outbox_testkit::pki`]).
pub use outbox_testkit::pki;

/// The servers: the shared ones' URLs and the private instances, from the
/// workspace's test kit ([`outbox_testkit::servers`], [`outbox_testkit::urls`]).
pub mod servers {
    pub use outbox_testkit::amqp::close_connections as close_shared_connections;
    pub use outbox_testkit::net::free_port;
    pub use outbox_testkit::servers::*;
    pub use outbox_testkit::urls::{amqp_url, database_url};
}

pub use example::example_binary;
pub use outbox_testkit::pki::TestPki;
pub use outbox_testkit::servers::{
    Frozen, PrivatePostgres, PrivateRabbit, PrivateRabbitCluster, ReplicatedPostgres, Replication,
};
pub use pipeline::Pipeline;
pub use proxy::KillingProxy;
pub use relay_process::RelayProcess;
pub use scenario::FailoverLoss;
pub use scenario::{Backend, Committed, Scenario, Servers, Summary, connect_amqp, connect_db};
/// Logs of the library parts running in the test process (inbox consumer,
/// producers, relays) go to the test's captured output, shown when it
/// fails: `RUST_LOG`, else warnings (returned messages only as errors).
pub fn test_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("warn,lapin::returned_messages=error")
            }),
        )
        .with_test_writer()
        .try_init();
}

pub use traffic::{
    Delivery, HandlerFaults, Inbox, Late, Produced, ProducerConfig, Producers, Tap, Tick,
    commit_burst,
};
