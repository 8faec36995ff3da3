//! One test's outbox → relay → RabbitMQ path on the shared servers: a
//! migrated schema, an exchange and a queue bound to it, and relays
//! started on them; everything removed when it is dropped, also when the
//! test panics (the test kit's guards).

use std::time::Duration;

use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection as _};
use lapin::Channel;
use outbox::postgres::{Outbox, PgOutboxStore};
use outbox::rabbitmq::{LapinPublisher, LapinPublisherBuilder};
use outbox::{Relay, RelayHandle, RetryPolicy, UnroutablePolicy};
use outbox_testkit::amqp::TestBroker;
use outbox_testkit::names;
use outbox_testkit::pg::{self, TestSchema};
use outbox_testkit::urls::{amqp_url, database_url};

/// A schema (migrated), a durable topic exchange `<name>.x` and a durable
/// queue `<name>.q` bound to it; the relays it starts read the schema and
/// publish to the exchange.
pub struct Pipeline {
    /// Unique name: the schema, the prefix of the exchange, the queue and
    /// the relays' connection names.
    pub name: String,
    /// The outbox's schema (same as `name`).
    pub schema: String,
    /// Records into the schema.
    pub outbox: Outbox,
    /// The library's pool on the database (the relays' store uses it).
    pub pool: Pool<AsyncPgConnection>,
    /// The test's channel (in confirm mode).
    pub channel: Channel,
    /// The exchange the relays publish to.
    pub exchange: String,
    /// The queue bound to the exchange.
    pub queue: String,
    /// The broker guard: declares more, deletes all on drop.
    pub broker: TestBroker,
    batch_size: usize,
    pause: Option<(Duration, Duration)>,
    _schema: TestSchema,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("name", &self.name)
            .field("exchange", &self.exchange)
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl Pipeline {
    /// Migrates schema `<prefix>_<test>_<pid>_<n>` and declares its
    /// exchange and queue, bound with `binding`. Relays take batches of
    /// 100 unless told otherwise ([`batch_size`](Self::batch_size)).
    ///
    /// # Panics
    /// When a server is not reachable (saying how to start it).
    pub async fn new(prefix: &str, test: &str, binding: &str) -> Pipeline {
        let name = names::unique(prefix, test);
        let schema = TestSchema::reserve(&database_url(), &name);
        outbox::postgres::migrate_url(&database_url(), schema.name())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let broker = TestBroker::new(&name).await;
        let exchange = broker.topic_exchange(&broker.named("x")).await;
        let queue = broker.queue(&broker.named("q")).await;
        broker.bind(&queue, &exchange, binding).await;
        Pipeline {
            outbox: Outbox::new(schema.name()).unwrap_or_else(|e| panic!("{e}")),
            pool: outbox::postgres::pool(&database_url(), 4).unwrap_or_else(|e| panic!("{e}")),
            schema: schema.name().to_owned(),
            name,
            channel: broker.channel().clone(),
            exchange,
            queue,
            broker,
            batch_size: 100,
            pause: None,
            _schema: schema,
        }
    }

    /// Relays claim batches of `n`.
    #[must_use]
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// Relays pause as told when the broker refuses ([`Relay`]'s `pause`).
    #[must_use]
    pub fn pause(mut self, first: Duration, max: Duration) -> Self {
        self.pause = Some((first, max));
        self
    }

    /// The number `sql` (a `SELECT count(*) AS n ...`) counts, with
    /// `{schema}` standing for the quoted schema.
    pub async fn count(&self, sql: &str) -> i64 {
        let mut conn = self.pool.get().await.unwrap_or_else(|e| panic!("{e}"));
        pg::count(&mut conn, &self.in_schema(sql)).await
    }

    /// Runs `sql` (`{schema}` stands for the quoted schema).
    pub async fn run_sql(&self, sql: &str) {
        let mut conn = self.pool.get().await.unwrap_or_else(|e| panic!("{e}"));
        let sql = self.in_schema(sql);
        conn.batch_execute(&sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    fn in_schema(&self, sql: &str) -> String {
        sql.replace("{schema}", &format!("\"{}\"", self.schema))
    }

    /// Retries 10 ms apart, `max_attempts` in all: a failing event ends
    /// dead within the test's time.
    pub fn quick_retries(max_attempts: u32) -> RetryPolicy {
        RetryPolicy::default()
            .base_delay(Duration::from_millis(10))
            .max_delay(Duration::from_millis(10))
            .max_attempts(max_attempts)
    }

    /// A store on the schema.
    pub fn store(&self) -> PgOutboxStore {
        PgOutboxStore::builder(self.pool.clone())
            .schema(&self.schema)
            .build()
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// A publisher to the exchange, connection `<name>.relay`.
    pub fn publisher(&self) -> LapinPublisherBuilder {
        LapinPublisher::builder(amqp_url())
            .exchange(&self.exchange)
            .source("/tests")
            .connection_name(format!("{}.relay", self.name))
    }

    /// Starts a relay (polling every 20 ms) with the default unroutable
    /// policy.
    pub fn start(
        &self,
        publisher: LapinPublisher,
        retry: RetryPolicy,
    ) -> (RelayHandle, tokio::task::JoinHandle<()>) {
        self.start_with(publisher, retry, UnroutablePolicy::default())
    }

    /// Starts a relay (polling every 20 ms) with `unroutable`.
    pub fn start_with(
        &self,
        publisher: LapinPublisher,
        retry: RetryPolicy,
        unroutable: UnroutablePolicy,
    ) -> (RelayHandle, tokio::task::JoinHandle<()>) {
        let mut builder = Relay::builder(self.store(), publisher)
            .unroutable(unroutable)
            .batch_size(self.batch_size)
            .poll_interval(Duration::from_millis(20));
        if let Some((first, max)) = self.pause {
            builder = builder.pause(first, max);
        }
        let relay = builder
            .retry(retry)
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let handle = relay.handle();
        (handle, tokio::spawn(relay.run()))
    }
}
