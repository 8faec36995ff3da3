//! The example e-commerce service of the `outbox` workspace, built only on
//! the `outbox` facade (features `derive`, `postgres`, `axum`, `rabbitmq`).
//!
//! Orders are placed, paid and cancelled over HTTP; each change records its
//! event (`order.placed`, `order.paid`, `order.cancelled`) in the outbox in
//! the same transaction; a relay publishes committed events to RabbitMQ;
//! the inventory reserves and releases stock (and answers with
//! `inventory.reserved` / `inventory.rejected`, through the outbox too),
//! loyalty awards points, and the orders service marks rejected orders, each
//! consumer applying every event exactly once thanks to its inbox.
//!
//! The binary runs one [`Role`] per process, or all of them (`all`, the
//! default), so each part can be scaled and restarted on its own:
//!
//! | role | runs |
//! |---|---|
//! | `api` | the HTTP API (with `/healthz`, `/metrics`) and the `<prefix>.orders` consumer |
//! | `relay` | the outbox relay: PostgreSQL → RabbitMQ |
//! | `inventory` | the `<prefix>.inventory` consumer |
//! | `loyalty` | the `<prefix>.loyalty` consumer |
//! | `all` | all of the above in one process; the relay is woken in-process after each commit |
//!
//! Modules: [`config`] (environment), [`domain`] (rules and events, no I/O),
//! [`db`] (schema, migrations, queries), [`routes`] (HTTP),
//! [`consumers`] (event handlers), [`topology`] (RabbitMQ), [`telemetry`]
//! (logs, metrics), [`shutdown`] (signals).

pub mod config;
pub mod consumers;
pub mod db;
pub mod domain;
pub mod routes;
pub mod shutdown;
pub mod telemetry;
pub mod topology;

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use outbox::admin::Janitor;
use outbox::axum::OutboxLayer;
use outbox::postgres::{PgDeadLetters, PgOutboxStore, PgTransaction};
use outbox::rabbitmq::{EventHandler, LapinPublisher, QueueTopology};
use outbox::{Relay, RelayHandle};
use tokio::task::JoinSet;

use crate::config::Config;
use crate::db::PgPool;
use crate::shutdown::Shutdown;

/// What one process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Role {
    /// Everything in one process.
    #[default]
    All,
    /// The HTTP API and the orders consumer.
    Api,
    /// The outbox relay.
    Relay,
    /// The inventory consumer.
    Inventory,
    /// The loyalty consumer.
    Loyalty,
}

impl Role {
    /// Every role, as named on the command line.
    pub const NAMES: [&'static str; 5] = ["all", "api", "relay", "inventory", "loyalty"];

    /// The name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::All => "all",
            Role::Api => "api",
            Role::Relay => "relay",
            Role::Inventory => "inventory",
            Role::Loyalty => "loyalty",
        }
    }

    fn runs(self, part: Role) -> bool {
        self == Role::All || self == part
    }

    /// Connections the process may open: the HTTP API holds one per
    /// request in flight, each consumer one per worker, the relay one.
    fn pool_size(self) -> usize {
        match self {
            Role::All => 32,
            Role::Api => 16 + consumers::CONCURRENCY,
            Role::Relay | Role::Inventory | Role::Loyalty => 2 + consumers::CONCURRENCY,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role name that is not one of [`Role::NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role {0:?}; expected one of: all, api, relay, inventory, loyalty")]
pub struct UnknownRole(pub String);

impl FromStr for Role {
    type Err = UnknownRole;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "all" => Ok(Role::All),
            "api" => Ok(Role::Api),
            "relay" => Ok(Role::Relay),
            "inventory" => Ok(Role::Inventory),
            "loyalty" => Ok(Role::Loyalty),
            other => Err(UnknownRole(other.to_owned())),
        }
    }
}

/// Why the service stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Bad settings.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// PostgreSQL: unreachable, or migrations failed.
    #[error(transparent)]
    Database(#[from] db::DbError),
    /// The outbox (relay settings).
    #[error(transparent)]
    Outbox(#[from] outbox::Error),
    /// RabbitMQ: unreachable, or a declaration refused.
    #[error(transparent)]
    Broker(#[from] outbox::rabbitmq::Error),
    /// The admin API's settings (e.g. `ADMIN_TOKEN` too short).
    #[error(transparent)]
    Admin(#[from] outbox::axum::Error),
    /// The metrics recorder could not be installed.
    #[error("cannot install the metrics recorder: {0}")]
    Metrics(#[from] metrics_exporter_prometheus::BuildError),
    /// The HTTP listener.
    #[error("HTTP server on {addr}: {source}")]
    Http {
        /// The address.
        addr: std::net::SocketAddr,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// A component panicked.
    #[error("the {component} component panicked: {source}")]
    Panicked {
        /// Which one.
        component: &'static str,
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
    },
}

impl From<outbox::postgres::Error> for Error {
    fn from(error: outbox::postgres::Error) -> Self {
        Error::Database(error.into())
    }
}

/// `error` and its sources, joined by `: ` (for one-line logs).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // `#[error(transparent)]` and "...: {source}; hint" messages
        // already hold their source's text (as sqlx's do).
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Runs `role` until `shutdown` is triggered (or a component fails, which
/// triggers it for the others), then stops every component gracefully.
///
/// At start, whatever the role: creates and migrates the database, and
/// declares the whole RabbitMQ topology.
///
/// # Errors
/// The first component error, or a failed start.
pub async fn run(role: Role, config: Config, shutdown: Shutdown) -> Result<(), Error> {
    tracing::info!(%role, ?config, "starting");
    db::prepare(&config.database_url).await?;
    topology::declare(&config).await?;
    let pool = db::pool(&config.database_url, role.pool_size())?;
    let config = Arc::new(config);

    let mut components = Components::default();
    let relay = role.runs(Role::Relay).then(RelayHandle::new);
    if let Some(handle) = &relay {
        components.spawn(
            "relay",
            run_relay(
                config.clone(),
                pool.clone(),
                handle.clone(),
                shutdown.clone(),
            ),
        );
    }
    if role.runs(Role::Api) {
        components.spawn(
            "api",
            run_api(
                config.clone(),
                pool.clone(),
                relay.clone(),
                shutdown.clone(),
            ),
        );
        components.spawn(
            "orders consumer",
            run_consumer(
                config.clone(),
                pool.clone(),
                consumers::orders::Orders::NAME,
                topology::orders_queue(&config),
                consumers::orders::Orders,
                shutdown.clone(),
            ),
        );
    }
    if role.runs(Role::Inventory) {
        components.spawn(
            "inventory consumer",
            run_consumer(
                config.clone(),
                pool.clone(),
                consumers::inventory::Inventory::NAME,
                topology::inventory_queue(&config),
                consumers::inventory::Inventory::default(),
                shutdown.clone(),
            ),
        );
    }
    if role.runs(Role::Loyalty) {
        components.spawn(
            "loyalty consumer",
            run_consumer(
                config.clone(),
                pool.clone(),
                consumers::loyalty::Loyalty::NAME,
                topology::loyalty_queue(&config),
                consumers::loyalty::Loyalty,
                shutdown.clone(),
            ),
        );
    }
    let result = components.run_until_all_stop(&shutdown).await;
    tracing::info!(%role, "stopped");
    result
}

/// The tasks of one process, by name.
#[derive(Default)]
struct Components {
    tasks: JoinSet<Result<(), Error>>,
    names: HashMap<tokio::task::Id, &'static str>,
}

impl Components {
    fn spawn(
        &mut self,
        name: &'static str,
        task: impl Future<Output = Result<(), Error>> + Send + 'static,
    ) {
        let id = self.tasks.spawn(task).id();
        self.names.insert(id, name);
    }

    fn name(&self, id: tokio::task::Id) -> &'static str {
        self.names.get(&id).copied().unwrap_or("unnamed")
    }

    /// Waits for every component. They run until `shutdown`; one that ends
    /// early (an error, or even `Ok`) triggers it for the others rather than
    /// leaving half a service running. Returns the first error.
    async fn run_until_all_stop(mut self, shutdown: &Shutdown) -> Result<(), Error> {
        let mut result = Ok(());
        while let Some(joined) = self.tasks.join_next_with_id().await {
            let (id, outcome) = match joined {
                Ok((id, outcome)) => (id, outcome),
                Err(error) => (
                    error.id(),
                    Err(Error::Panicked {
                        component: self.name(error.id()),
                        source: error,
                    }),
                ),
            };
            let component = self.name(id);
            match outcome {
                Ok(()) if shutdown.is_triggered() => tracing::info!(component, "stopped"),
                Ok(()) => {
                    tracing::error!(component, "stopped unexpectedly; shutting down");
                    shutdown.trigger();
                }
                Err(error) => {
                    tracing::error!(component, error = %error_chain(&error), "failed; shutting down");
                    shutdown.trigger();
                    if result.is_ok() {
                        result = Err(error);
                    }
                }
            }
        }
        result
    }
}

/// The relay: publishes committed outbox rows to `EXCHANGE`, woken by
/// PostgreSQL `NOTIFY` (and in-process by the API in the `all` role).
async fn run_relay(
    config: Arc<Config>,
    pool: PgPool,
    handle: RelayHandle,
    shutdown: Shutdown,
) -> Result<(), Error> {
    let store = PgOutboxStore::builder(pool)
        .listen(&config.database_url)
        .build()?;
    let publisher = LapinPublisher::builder(&config.amqp_url)
        .exchange(&config.exchange)
        .source(topology::SOURCE)
        .connection_name("ecommerce-relay")
        .build()?;
    // Retention beside the relay (`SENT_RETENTION`, `INBOX_RETENTION`);
    // dead events stay for an operator.
    let janitor = Janitor::new(store.clone())
        .sent_retention(config.sent_retention)
        .inbox_retention(config.inbox_retention)
        .interval(config.janitor_interval);
    let relay = Relay::builder(store, publisher)
        .handle(handle.clone())
        .build()?;
    let stop = async {
        shutdown.wait().await;
        handle.shutdown();
    };
    tokio::join!(relay.run(), janitor.run(handle.clone()), stop);
    Ok(())
}

/// The HTTP API, with the outbox gauges it shows on `/metrics`.
async fn run_api(
    config: Arc<Config>,
    pool: PgPool,
    relay: Option<RelayHandle>,
    shutdown: Shutdown,
) -> Result<(), Error> {
    let http_error = |source| Error::Http {
        addr: config.bind,
        source,
    };
    let listener = tokio::net::TcpListener::bind(config.bind)
        .await
        .map_err(http_error)?;
    let addr = listener.local_addr().map_err(http_error)?;

    let metrics = telemetry::install_metrics()?;
    if relay.is_some() {
        telemetry::register_relay_counters();
    }
    let store = PgOutboxStore::builder(pool.clone()).build()?;
    let dead_letters = PgDeadLetters::new(pool.clone());
    let admin = routes::admin::router(&config, store.clone(), dead_letters)?;
    // Once before serving, so the gauges are on `/metrics` from the start.
    if let Err(error) = telemetry::refresh_outbox_gauges(&store).await {
        tracing::warn!(%error, "reading the outbox stats failed");
    }
    let gauges = tokio::spawn(telemetry::outbox_gauges(
        store,
        metrics.clone(),
        shutdown.clone(),
    ));

    let mut outbox = OutboxLayer::new(pool.clone());
    if let Some(handle) = relay {
        outbox = outbox.relay(handle);
    }
    let state = routes::AppState {
        health: Arc::new(routes::Health::new(pool, config.amqp_url.clone())),
        metrics,
    };
    let app = routes::router(state, outbox, admin);
    tracing::info!(%addr, "HTTP API listening");
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.wait_owned())
        .await
        .map_err(http_error);
    // Served until shutdown; an early end (an error) must stop the rest too.
    shutdown.trigger();
    if let Err(error) = gauges.await {
        tracing::warn!(%error, "the outbox gauges task failed");
    }
    served
}

/// One inbox consumer, until shutdown.
async fn run_consumer<H: EventHandler<PgTransaction>>(
    config: Arc<Config>,
    pool: PgPool,
    name: &'static str,
    topology: QueueTopology,
    handler: H,
    shutdown: Shutdown,
) -> Result<(), Error> {
    let consumer = consumers::build(&config, pool, name, topology, handler)?;
    consumer.run(shutdown.wait_owned()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_from_their_names() {
        for name in Role::NAMES {
            assert_eq!(name.parse::<Role>().unwrap().as_str(), name);
        }
        assert!("web".parse::<Role>().is_err());
        assert_eq!(Role::default(), Role::All);
        assert!(Role::All.runs(Role::Relay));
        assert!(!Role::Api.runs(Role::Relay));
    }

    #[test]
    fn error_chains_do_not_repeat_themselves() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer: {0}")]
        struct Outer(#[source] std::io::Error);
        let error = Outer(std::io::Error::other("inner"));
        assert_eq!(error_chain(&error), "outer: inner");

        // The source in the middle of the message, a hint after it.
        #[derive(Debug, thiserror::Error)]
        #[error("not reachable: {0}; start it")]
        struct Hinted(#[source] std::io::Error);
        let error = Hinted(std::io::Error::other("refused"));
        assert_eq!(error_chain(&error), "not reachable: refused; start it");

        // A source the message does not hold is appended.
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Plain(#[source] std::io::Error);
        let error = Plain(std::io::Error::other("inner"));
        assert_eq!(error_chain(&error), "outer: inner");
    }
}
