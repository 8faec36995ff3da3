//! One fault-injection scenario: its own database (a PostgreSQL schema, a
//! MariaDB database or a SQLite file, see [`Backend`]) holding the outbox,
//! the inbox and two business tables, and its own exchange and queues, on
//! the shared servers or on private ones.
//!
//! The business table `orders` is the ground truth: producers insert one
//! row per event in the transaction that records the event, so after any
//! fault the committed events are exactly its rows, whatever the producers
//! were told. The `effects` table is what the inbox consumer's handler
//! writes, one row per handled event (no unique key, so a double effect
//! shows).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Instant;

use diesel::QueryableByName;
use diesel::mysql::Mysql;
use diesel::pg::Pg;
use diesel::sql_types::{BigInt, Integer, Text};
use diesel::sqlite::Sqlite;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use lapin::options::{ExchangeDeclareOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ExchangeKind};
use outbox::rabbitmq::{QueueTopology, QueueType};
use outbox_testkit::amqp::{self, BrokerCleanup};
use outbox_testkit::mysql::TestMysqlDatabase;
use outbox_testkit::names;
use outbox_testkit::pg::TestSchema;
use outbox_testkit::sqlite::TestSqliteFile;
use uuid::Uuid;

use crate::relay_process::RelayProcess;

mod backend;
mod failover;
mod verify;

pub use backend::Backend;
use backend::DatabaseGuard;
pub(crate) use backend::Db;
pub use failover::FailoverLoss;
pub use verify::Summary;

/// Where a scenario's servers are.
#[derive(Debug, Clone)]
pub struct Servers {
    /// PostgreSQL URL; for a scenario on MariaDB or SQLite, the URL of its
    /// own database (`mysql://…/<database>`, `sqlite://<file>`).
    pub database_url: String,
    /// RabbitMQ URL.
    pub amqp_url: String,
}

impl Servers {
    /// The shared local servers ([`crate::servers::database_url`],
    /// [`crate::servers::amqp_url`]).
    pub fn shared() -> Servers {
        Servers {
            database_url: crate::servers::database_url(),
            amqp_url: crate::servers::amqp_url(),
        }
    }
}

/// A scenario's names and connections; everything it created is removed on
/// drop (also when the test fails).
pub struct Scenario {
    /// Unique name: prefix of the schema, exchange, queues and of every
    /// connection name of this scenario.
    pub name: String,
    /// The servers.
    pub servers: Servers,
    /// The database back end.
    pub backend: Backend,
    /// PostgreSQL schema of the outbox, inbox, `orders` and `effects` (on
    /// MariaDB the database's name, on SQLite the file's stem: their
    /// tables are not qualified).
    pub schema: String,
    /// The topic exchange the relay publishes to.
    pub exchange: String,
    /// Queue bound with `#`, read by the verifying [`Tap`](crate::Tap).
    pub tap_queue: String,
    /// Queue bound with `#`, read by the inbox consumer.
    pub inbox_queue: String,
    /// Routing keys both queues are bound with at the start.
    bindings: Vec<String>,
    /// The type of the tap's and the inbox consumer's queues (classic
    /// unless made with [`Scenario::quorum`]).
    queue_type: QueueType,
    /// Hand-written rows that must end `dead` (not counted as unsent).
    expected_dead: Mutex<HashSet<Uuid>>,
    db: Db,
    faults: Mutex<Vec<(Instant, String)>>,
    started: Instant,
    /// Drops the schema, the database or the file (also when the test
    /// fails).
    _database: DatabaseGuard,
    /// Deletes the exchanges and queues (also when the test fails).
    _broker: BrokerCleanup,
}

impl std::fmt::Debug for Scenario {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scenario")
            .field("name", &self.name)
            .field("backend", &self.backend.name())
            .field(
                "database_url",
                &outbox::redact_url(&self.servers.database_url),
            )
            .field("amqp_url", &outbox::redact_url(&self.servers.amqp_url))
            .field("faults", &self.faults())
            .finish_non_exhaustive()
    }
}

/// One committed event, from the `orders` table.
#[derive(Debug, Clone)]
pub struct Committed {
    /// Event id.
    pub event_id: Uuid,
    /// Aggregate id.
    pub aggregate: String,
    /// The producer's sequence number within the aggregate.
    pub seq: i32,
}

/// A row of `orders`, its id as text (the column is a `uuid` on
/// PostgreSQL, text elsewhere).
#[derive(QueryableByName)]
struct OrderRow {
    #[diesel(sql_type = Text)]
    event_id: String,
    #[diesel(sql_type = Text)]
    aggregate: String,
    #[diesel(sql_type = Integer)]
    seq: i32,
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(QueryableByName)]
struct EffectCount {
    #[diesel(sql_type = Text)]
    event_id: String,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

impl Scenario {
    /// Creates the schema (outbox migrations plus `orders` and `effects`),
    /// the exchange and both queues, bound with `#`. Panics, saying how to
    /// start them, when the servers are not reachable.
    pub async fn new(test: &str, servers: Servers) -> Scenario {
        Scenario::with_bindings(test, servers, &["#"]).await
    }

    /// [`Scenario::new`] with both queues bound with `bindings` only: a
    /// routing key none of them matches is unroutable until
    /// [`bind`](Self::bind) adds it.
    pub async fn with_bindings(test: &str, servers: Servers, bindings: &[&str]) -> Scenario {
        Scenario::build(Backend::Postgres, test, servers, bindings).await
    }

    /// [`Scenario::new`] on `backend`, with the shared servers: on MariaDB
    /// a database of its own, on SQLite a file of its own (both named like
    /// the scenario), removed at the end. Panics, saying how to start them,
    /// when the servers are not reachable.
    pub async fn on(backend: Backend, test: &str) -> Scenario {
        Scenario::build(backend, test, Servers::shared(), &["#"]).await
    }

    /// [`Scenario::new`] with the tap's and the inbox consumer's queues (and
    /// its dead-letter queue) declared as quorum queues: for a cluster
    /// (`servers.amqp_url` a comma-separated list of its nodes), where they
    /// survive the loss of a node.
    pub async fn quorum(test: &str, servers: Servers) -> Scenario {
        Scenario::build_with(Backend::Postgres, test, servers, &["#"], QueueType::Quorum).await
    }

    async fn build(backend: Backend, test: &str, servers: Servers, bindings: &[&str]) -> Scenario {
        Scenario::build_with(backend, test, servers, bindings, QueueType::Classic).await
    }

    async fn build_with(
        backend: Backend,
        test: &str,
        mut servers: Servers,
        bindings: &[&str],
        queue_type: QueueType,
    ) -> Scenario {
        let name = names::unique("fault", test);
        let schema = name.clone();
        let broker = BrokerCleanup::new(&servers.amqp_url, &name);
        let (db, database) = match &backend {
            Backend::Postgres => {
                let guard = TestSchema::reserve(&servers.database_url, &schema);
                outbox::postgres::migrate_url(&servers.database_url, &schema)
                    .await
                    .unwrap_or_else(|e| {
                        panic!(
                            "PostgreSQL at {}: {e}; start it with scripts/dev-services",
                            outbox::redact_url(&servers.database_url)
                        )
                    });
                let mut conn = connect_db(&servers.database_url).await;
                conn.batch_execute(&format!(
                    "CREATE TABLE \"{schema}\".orders (event_id uuid PRIMARY KEY, \
                       aggregate text NOT NULL, seq integer NOT NULL); \
                     CREATE TABLE \"{schema}\".effects (event_id uuid NOT NULL, consumer text NOT NULL);"
                ))
                .await
                .unwrap_or_else(|e| panic!("creating the business tables: {e}"));
                let pool = outbox::postgres::pool(&servers.database_url, 8)
                    .unwrap_or_else(|e| panic!("pool: {e}"));
                (Db::Pg(pool), DatabaseGuard::Schema { _schema: guard })
            }
            Backend::Mariadb => {
                let guard =
                    TestMysqlDatabase::create(&outbox_testkit::urls::mysql_url(), &name).await;
                servers.database_url = guard.url().to_owned();
                outbox::mysql::migrate_url(guard.url())
                    .await
                    .unwrap_or_else(|e| panic!("migrating {name}: {e}"));
                let mut conn = outbox_testkit::mysql::connect(guard.url()).await;
                for table in [
                    "CREATE TABLE orders (event_id CHAR(36) NOT NULL PRIMARY KEY, \
                       aggregate VARCHAR(64) NOT NULL, seq INT NOT NULL) ENGINE = InnoDB",
                    "CREATE TABLE effects (event_id CHAR(36) NOT NULL, \
                       consumer VARCHAR(255) NOT NULL) ENGINE = InnoDB",
                ] {
                    conn.batch_execute(table)
                        .await
                        .unwrap_or_else(|e| panic!("creating the business tables: {e}"));
                }
                let pool =
                    outbox::mysql::pool(guard.url(), 8).unwrap_or_else(|e| panic!("pool: {e}"));
                (Db::Mysql(pool), DatabaseGuard::Mysql { _database: guard })
            }
            Backend::Sqlite { dir } => {
                let file = TestSqliteFile::at(dir.join(format!("{name}.db")));
                servers.database_url = file.url();
                let guard = DatabaseGuard::File { _file: file };
                let url = &servers.database_url;
                let mut conn = outbox::sqlite::connect(url)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
                outbox::sqlite::migrate(&mut conn)
                    .await
                    .unwrap_or_else(|e| panic!("migrating {name}: {e}"));
                conn.batch_execute(
                    "CREATE TABLE orders (event_id TEXT PRIMARY KEY, \
                       aggregate TEXT NOT NULL, seq INTEGER NOT NULL); \
                     CREATE TABLE effects (event_id TEXT NOT NULL, consumer TEXT NOT NULL);",
                )
                .await
                .unwrap_or_else(|e| panic!("creating the business tables: {e}"));
                let pool = outbox::sqlite::pool(url, 8).unwrap_or_else(|e| panic!("pool: {e}"));
                (Db::Sqlite(pool), guard)
            }
        };
        let exchange = format!("{name}.x");
        let tap_queue = format!("{name}.tap");
        let inbox_queue = format!("{name}.inbox");
        for queue in [&tap_queue, &inbox_queue, &format!("{inbox_queue}.dead")] {
            broker.queue(queue);
        }
        broker.exchange(&exchange);
        broker.exchange(format!("{inbox_queue}.dlx"));
        let scenario = Scenario {
            exchange,
            tap_queue,
            inbox_queue,
            bindings: bindings.iter().map(|b| (*b).to_owned()).collect(),
            queue_type,
            expected_dead: Mutex::default(),
            db,
            name,
            servers,
            backend,
            schema,
            faults: Mutex::default(),
            started: Instant::now(),
            _database: database,
            _broker: broker,
        };
        scenario.declare_topology().await;
        scenario
    }

    async fn declare_topology(&self) {
        let amqp = connect_amqp(&self.servers.amqp_url, &format!("{}.setup", self.name)).await;
        let channel = amqp
            .create_channel()
            .await
            .unwrap_or_else(|e| panic!("channel: {e}"));
        amqp::declare_exchange(
            &channel,
            &self.exchange,
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
        )
        .await;
        amqp::declare_queue(
            &channel,
            &self.tap_queue,
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            self.tap_queue_arguments(),
        )
        .await;
        for binding in &self.bindings {
            amqp::bind(&channel, &self.tap_queue, &self.exchange, binding).await;
        }
        self.inbox_topology()
            .declare(&channel)
            .await
            .unwrap_or_else(|e| panic!("inbox topology: {e}"));
        let _ = amqp.close(200, "setup done".into()).await;
    }

    /// Binds the tap's and the inbox consumer's queues with `routing_key`
    /// too (a missing binding appears).
    pub async fn bind(&self, routing_key: &str) {
        let amqp = connect_amqp(&self.servers.amqp_url, &format!("{}.setup", self.name)).await;
        let channel = amqp
            .create_channel()
            .await
            .unwrap_or_else(|e| panic!("channel: {e}"));
        for queue in [&self.tap_queue, &self.inbox_queue] {
            amqp::bind(&channel, queue, &self.exchange, routing_key).await;
        }
        let _ = amqp.close(200, "binding done".into()).await;
    }

    /// The inbox consumer's queue: bound to the exchange with the
    /// scenario's bindings, with its dead-letter exchange and queue
    /// (`<queue>.dlx`, `<queue>.dead`).
    pub fn inbox_topology(&self) -> QueueTopology {
        self.bindings.iter().fold(
            QueueTopology::new(&self.inbox_queue)
                .exchange(&self.exchange)
                .queue_type(self.queue_type),
            |topology, binding| topology.bind(binding),
        )
    }

    /// The tap queue's arguments: its `x-queue-type` when not classic.
    fn tap_queue_arguments(&self) -> FieldTable {
        let mut arguments = FieldTable::default();
        if self.queue_type != QueueType::Classic {
            arguments.insert(
                "x-queue-type".into(),
                lapin::types::AMQPValue::LongString(self.queue_type.as_str().into()),
            );
        }
        arguments
    }

    /// Notes a row written by hand that must end `dead`: [`verify`](Self::verify)
    /// does not wait for it to be sent.
    pub fn expect_dead(&self, id: Uuid) {
        if let Ok(mut dead) = self.expected_dead.lock() {
            dead.insert(id);
        }
    }

    /// A pool on the scenario's database (PostgreSQL: other back ends
    /// panic).
    pub fn pool(&self) -> Pool<AsyncPgConnection> {
        match &self.db {
            Db::Pg(pool) => pool.clone(),
            _ => panic!("{}: pool() is PostgreSQL's", self.name),
        }
    }

    /// The scenario's pool, of its back end.
    pub(crate) fn db(&self) -> &Db {
        &self.db
    }

    /// `table` qualified by the scenario's schema on PostgreSQL, as is on
    /// the other back ends (the tables of their database).
    pub fn table(&self, table: &str) -> String {
        match self.backend {
            Backend::Postgres => format!("\"{}\".{table}", self.schema),
            _ => table.to_owned(),
        }
    }

    /// Starts a relay child process named `<scenario>.<name>` (its AMQP
    /// connection and PostgreSQL `application_name` carry the name), built
    /// from `binary` (the test's `env!("CARGO_BIN_EXE_outbox-fault-relay")`).
    /// With `crash_at`, the process SIGKILLs itself the `nth` time it
    /// reaches that failpoint.
    pub fn spawn_relay(
        &self,
        binary: &str,
        name: &str,
        crash_at: Option<(&'static str, u32)>,
    ) -> RelayProcess {
        RelayProcess::spawn(binary, self, &format!("{}.{name}", self.name), crash_at)
    }

    /// Notes a fault injected now (counted and timed in the summary).
    pub fn fault(&self, what: impl Into<String>) {
        let what = what.into();
        tracing::info!(scenario = %self.name, fault = %what, "fault injected");
        if let Ok(mut faults) = self.faults.lock() {
            faults.push((Instant::now(), what));
        }
    }

    /// How many faults were injected so far.
    pub fn faults(&self) -> usize {
        self.faults.lock().map_or(0, |f| f.len())
    }

    fn last_fault(&self) -> Instant {
        self.faults
            .lock()
            .ok()
            .and_then(|f| f.last().map(|(at, _)| *at))
            .unwrap_or(self.started)
    }

    /// Runs `sql` on the scenario's database; panics with the error.
    pub async fn execute(&self, sql: &str) -> usize {
        self.db
            .execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{}: {sql}: {e}", self.name))
    }

    /// Loads the rows of `sql` from the scenario's database.
    pub async fn query<T>(&self, sql: String) -> Result<Vec<T>, String>
    where
        T: QueryableByName<Pg> + QueryableByName<Mysql> + QueryableByName<Sqlite> + Send + 'static,
    {
        self.db.load(sql).await
    }

    /// The `n` column of the first row of `sql` (a `count(*) AS n`).
    pub async fn count(&self, sql: String) -> Result<i64, String> {
        Ok(self
            .query::<Count>(sql)
            .await?
            .iter()
            .map(|c| c.n)
            .next()
            .unwrap_or(0))
    }

    /// Outbox rows not yet sent (pending, retrying, held or dead), but for
    /// those [expected dead](Self::expect_dead) and those an operator
    /// skipped.
    pub async fn unsent(&self) -> Result<i64, String> {
        let expected: Vec<String> = self
            .expected_dead
            .lock()
            .map(|dead| dead.iter().map(|id| format!("'{id}'")).collect())
            .unwrap_or_default();
        let except = if expected.is_empty() {
            String::new()
        } else {
            format!(" AND id NOT IN ({})", expected.join(","))
        };
        self.count(format!(
            "SELECT count(*) AS n FROM {} \
             WHERE status NOT IN ('sent', 'skipped'){except}",
            self.table("outbox_events")
        ))
        .await
    }

    /// Every committed event (the `orders` table), in commit order per
    /// aggregate.
    pub async fn committed(&self) -> Result<Vec<Committed>, String> {
        self.query::<OrderRow>(format!(
            "SELECT {} AS event_id, aggregate, seq FROM {} ORDER BY aggregate, seq",
            self.id_as_text(),
            self.table("orders")
        ))
        .await?
        .into_iter()
        .map(|row| {
            Ok(Committed {
                event_id: parse_id(&row.event_id)?,
                aggregate: row.aggregate,
                seq: row.seq,
            })
        })
        .collect()
    }

    async fn effects(&self) -> Result<HashMap<Uuid, i64>, String> {
        self.query::<EffectCount>(format!(
            "SELECT {} AS event_id, count(*) AS n FROM {} GROUP BY event_id",
            self.id_as_text(),
            self.table("effects")
        ))
        .await?
        .into_iter()
        .map(|e| Ok((parse_id(&e.event_id)?, e.n)))
        .collect()
    }

    /// `event_id` as text: PostgreSQL's column is a `uuid`.
    fn id_as_text(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => "event_id::text",
            _ => "event_id",
        }
    }
}

fn parse_id(id: &str) -> Result<Uuid, String> {
    Uuid::parse_str(id).map_err(|e| format!("event id {id:?}: {e}"))
}

/// A direct connection, or a panic saying how to start PostgreSQL.
pub async fn connect_db(url: &str) -> AsyncPgConnection {
    // The library's error names the (redacted) URL and how to start it.
    outbox::postgres::connect(url)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// An AMQP connection named `name`, or a panic saying how to start RabbitMQ.
pub async fn connect_amqp(url: &str, name: &str) -> Connection {
    outbox_testkit::amqp::connect(url, name).await
}
