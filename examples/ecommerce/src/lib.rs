//! The example e-commerce service of the `outbox` workspace, built only on
//! the `outbox` facade (features `derive`, `postgres`, `mysql`, `sqlite`,
//! `axum`, `rabbitmq`, `opentelemetry`). It runs on PostgreSQL, MariaDB or SQLite, chosen
//! by `DATABASE_URL` (`postgres://…`, `mysql://…`, `sqlite://path`): the
//! routes and consumers are generic over [`db::Database`], and each back
//! end's SQL lives in its own module (see [`db`] for why).
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
//! | `relay` | the outbox relay: database → RabbitMQ |
//! | `inventory` | the `<prefix>.inventory` consumer |
//! | `loyalty` | the `<prefix>.loyalty` consumer |
//! | `all` | all of the above in one process; the relay is woken in-process after each commit |
//!
//! Modules: [`config`] (environment), [`domain`] (rules and events, no I/O),
//! [`db`] (schema, migrations, queries), [`routes`] (HTTP),
//! [`consumers`] (event handlers), [`topology`] (RabbitMQ), [`telemetry`]
//! (logs, traces, metrics), [`shutdown`] (signals).

pub mod config;
pub mod consumers;
pub mod db;
pub mod domain;
mod error;
mod role;
pub mod routes;
pub mod shutdown;
pub mod telemetry;
pub mod topology;

use std::collections::HashMap;

use std::sync::Arc;

use diesel_async::AsyncMysqlConnection;
use diesel_async::AsyncPgConnection;
use outbox::admin::Janitor;
use outbox::postgres::Transaction;
use outbox::rabbitmq::{EventHandler, LapinPublisher, QueueTopology};
use outbox::sqlite::AsyncSqliteConnection;
use outbox::{Relay, RelayHandle};
use tokio::task::JoinSet;

pub use error::{Error, error_chain};
pub use role::{Role, UnknownRole};

use crate::config::Config;
use crate::db::{Backend, Database, DbPool};
use crate::shutdown::Shutdown;

/// Runs `role` until `shutdown` is triggered (or a component fails, which
/// triggers it for the others), then stops every component gracefully.
///
/// At start, whatever the role: creates and migrates the database (on the
/// back end `DATABASE_URL` names), and declares the whole RabbitMQ
/// topology.
///
/// # Errors
/// The first component error, or a failed start.
pub async fn run(role: Role, config: Config, shutdown: Shutdown) -> Result<(), Error> {
    match config.backend {
        Backend::Postgres => run_on::<AsyncPgConnection>(role, config, shutdown).await,
        Backend::Mysql => run_on::<AsyncMysqlConnection>(role, config, shutdown).await,
        Backend::Sqlite => run_on::<AsyncSqliteConnection>(role, config, shutdown).await,
    }
}

/// [`run`] on the back end of connection type `C`.
async fn run_on<C: Database>(role: Role, config: Config, shutdown: Shutdown) -> Result<(), Error> {
    tracing::info!(%role, backend = C::KIND.name(), ?config, "starting");
    C::prepare(&config.database_url).await?;
    topology::declare(&config).await?;
    let pool = C::pool(&config.database_url, role.pool_size())?;
    let config = Arc::new(config);

    let mut components = Components::default();
    let relay = role.runs(Role::Relay).then(RelayHandle::new);
    if let Some(handle) = &relay {
        components.spawn(
            "relay",
            run_relay::<C>(
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
            run_api::<C>(
                config.clone(),
                pool.clone(),
                relay.clone(),
                shutdown.clone(),
            ),
        );
        components.spawn(
            "orders consumer",
            run_consumer::<C, _>(
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
            run_consumer::<C, _>(
                config.clone(),
                pool.clone(),
                consumers::inventory::Inventory::NAME,
                topology::inventory_queue(&config),
                consumers::inventory::Inventory,
                shutdown.clone(),
            ),
        );
    }
    if role.runs(Role::Loyalty) {
        components.spawn(
            "loyalty consumer",
            run_consumer::<C, _>(
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
/// PostgreSQL `NOTIFY` (on MariaDB and SQLite it polls), and in-process by
/// the API in the `all` role.
async fn run_relay<C: Database>(
    config: Arc<Config>,
    pool: DbPool<C>,
    handle: RelayHandle,
    shutdown: Shutdown,
) -> Result<(), Error> {
    let store = C::store(pool, Some(&config.database_url))?;
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
async fn run_api<C: Database>(
    config: Arc<Config>,
    pool: DbPool<C>,
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
    let store = C::store(pool.clone(), None)?;
    let dead_letters = C::dead_letters(pool.clone());
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

    let mut outbox = C::layer(pool.clone());
    if let Some(handle) = relay {
        outbox = outbox.relay(handle);
    }
    let state = routes::AppState {
        health: Arc::new(routes::Health::new::<C>(pool, config.amqp_url.clone())),
        metrics,
    };
    let app = routes::router::<C>(state, outbox, admin);
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
async fn run_consumer<C: Database, H: EventHandler<Transaction<C>>>(
    config: Arc<Config>,
    pool: DbPool<C>,
    name: &'static str,
    topology: QueueTopology,
    handler: H,
    shutdown: Shutdown,
) -> Result<(), Error> {
    let consumer = consumers::build::<C, H>(&config, pool, name, topology, handler)?;
    consumer.run(shutdown.wait_owned()).await?;
    Ok(())
}
