//! Shared set-up: a private schema and exchange/queue per run, SQL helpers.
//!
//! URLs, the run's unique name and the exchange and queue (deleted when
//! the run ends, also when it fails) come from the workspace's test kit.
//! The schema is created and dropped through the library: the bench may
//! run against a TLS-only PostgreSQL (feature `postgres-tls`), which the
//! kit's plaintext teardown cannot reach.

use std::time::Duration;

use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, QueueDeclareOptions, QueuePurgeOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, Connection};
use outbox::DomainEvent;
use outbox_testkit::amqp::TestBroker;
use outbox_testkit::names;
use serde::Serialize;
use uuid::Uuid;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub(crate) use outbox_testkit::urls::{amqp_url, database_url};

/// The event every workload records.
#[derive(Debug, Clone, Serialize, DomainEvent)]
#[domain_event(aggregate = "order")]
pub(crate) struct OrderPlaced {
    #[aggregate_id]
    pub(crate) order_id: String,
    pub(crate) customer_id: Uuid,
    pub(crate) total_cents: i64,
}

pub(crate) fn now_ns() -> i64 {
    chrono::Utc::now().timestamp_nanos_opt().unwrap_or(0)
}

/// An exchange and a durable queue bound with `#`, private to this run
/// (deleted when dropped), and the run's AMQP connection: what every back
/// end's workloads publish to and consume from.
pub(crate) struct Bus {
    pub(crate) channel: Channel,
    pub(crate) exchange: String,
    pub(crate) queue: String,
    broker: TestBroker,
}

impl Bus {
    /// The exchange and queue of the run `name`.
    pub(crate) async fn new(name: &str) -> Bus {
        Bus::declare(name, FieldTable::default()).await
    }

    /// As [`Bus::new`], with a quorum queue (`x-queue-type=quorum`, what
    /// production setups use for durability: replicated, every message
    /// written through Raft before the confirm) instead of a classic one.
    pub(crate) async fn quorum(name: &str) -> Bus {
        let mut arguments = FieldTable::default();
        arguments.insert(
            ShortString::from("x-queue-type"),
            AMQPValue::LongString(LongString::from("quorum")),
        );
        Bus::declare(name, arguments).await
    }

    /// A durable topic exchange and a durable queue declared with
    /// `arguments`, bound with `#`.
    async fn declare(name: &str, arguments: FieldTable) -> Bus {
        let broker = TestBroker::new(name).await;
        let exchange = broker.topic_exchange(&broker.named("events")).await;
        let queue = broker
            .queue_with(
                &broker.named("all"),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                arguments,
            )
            .await;
        broker.bind(&queue, &exchange, "#").await;
        Bus {
            channel: broker.channel().clone(),
            exchange,
            queue,
            broker,
        }
    }

    /// The run's own AMQP connection.
    pub(crate) fn amqp(&self) -> &Connection {
        self.broker.connection()
    }

    /// Empties the queue.
    pub(crate) async fn purge(&self) -> Result<(), BoxError> {
        self.channel
            .queue_purge(self.queue.as_str().into(), QueuePurgeOptions::default())
            .await?;
        Ok(())
    }

    /// Consumes the queue (auto-ack) and reports each message id with its
    /// receive time (Unix ns) and body.
    pub(crate) async fn consume(
        &self,
    ) -> Result<tokio::sync::mpsc::UnboundedReceiver<(Uuid, i64, Vec<u8>)>, BoxError> {
        // A consumer of an earlier workload still closing would take every
        // other message (round robin) and drop it: wait until it is gone.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let queue = declare_passive(&self.channel, &self.queue).await?;
            if queue.consumer_count() == 0 {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!(
                    "queue {} still has {} consumer(s) of an earlier workload",
                    self.queue,
                    queue.consumer_count()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let channel = self.amqp().create_channel().await?;
        let mut consumer = channel
            .basic_consume(
                self.queue.as_str().into(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            // Stop consuming (and close the channel) as soon as the receiver
            // is dropped, so no later consumer of this queue loses messages.
            loop {
                let delivery = tokio::select! {
                    () = tx.closed() => break,
                    next = consumer.next() => match next {
                        Some(Ok(delivery)) => delivery,
                        _ => break,
                    },
                };
                let received = now_ns();
                let id = delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .and_then(|id| Uuid::parse_str(id.as_str()).ok())
                    .unwrap_or_default();
                if tx.send((id, received, delivery.data)).is_err() {
                    break;
                }
            }
            let _ = channel.close(200, "done".into()).await;
        });
        Ok(rx)
    }
}

/// Queue `queue` as the broker has it now (its messages and consumers),
/// by a passive declare.
pub(crate) async fn declare_passive(
    channel: &Channel,
    queue: &str,
) -> Result<lapin::Queue, BoxError> {
    Ok(channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?)
}

/// A schema (outbox tables + `bench_orders`) private to this run, removed by
/// [`Env::cleanup`], and the run's [`Bus`] (its fields and methods are the
/// `Env`'s through `Deref`).
pub(crate) struct Env {
    pub(crate) schema: String,
    /// The PostgreSQL server's URL: the shared one ([`database_url`]), or
    /// W6's private cluster.
    pub(crate) url: String,
    pub(crate) pool: Pool<AsyncPgConnection>,
    bus: Bus,
}

impl std::ops::Deref for Env {
    type Target = Bus;

    fn deref(&self) -> &Bus {
        &self.bus
    }
}

impl Env {
    /// The run's schema on the shared PostgreSQL ([`database_url`]).
    pub(crate) async fn new() -> Result<Env, BoxError> {
        Env::at(database_url()).await
    }

    /// The run's schema on the PostgreSQL server at `url`.
    pub(crate) async fn at(url: String) -> Result<Env, BoxError> {
        let schema = names::unique("bench", "run");
        let mut conn = outbox::postgres::connect(&url).await?;
        outbox::postgres::migrate(&mut conn, &schema).await?;
        conn.batch_execute(&format!(
            "CREATE TABLE \"{schema}\".bench_orders (
                 id uuid PRIMARY KEY, customer_id uuid NOT NULL,
                 total_cents bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
        ))
        .await?;
        let bus = Bus::new(&schema).await;
        Ok(Env {
            // Named after the run, so W2 finds the relays' backends in
            // `pg_stat_activity` to count their CPU.
            pool: outbox::postgres::pool(
                &crate::cpu::url_with_application_name(&url, &schema),
                12,
            )?,
            schema,
            url,
            bus,
        })
    }

    /// Where the run's PostgreSQL spends CPU: the backends of [`Env::pool`].
    pub(crate) fn cpu_db(&self) -> crate::cpu::Db {
        crate::cpu::Db::Postgres {
            application_name: self.schema.clone(),
        }
    }

    pub(crate) fn table(&self, table: &str) -> String {
        format!("\"{}\".{table}", self.schema)
    }

    pub(crate) async fn conn(&self) -> Result<AsyncPgConnection, BoxError> {
        Ok(outbox::postgres::connect(&self.url).await?)
    }

    pub(crate) async fn exec(&self, sql: &str) -> Result<(), BoxError> {
        let mut conn = self.conn().await?;
        conn.batch_execute(sql).await?;
        Ok(())
    }

    /// Empties the outbox and the queue between runs.
    pub(crate) async fn reset(&self) -> Result<(), BoxError> {
        self.exec(&format!(
            "TRUNCATE {}, {}",
            self.table("outbox_events"),
            self.table("bench_orders")
        ))
        .await?;
        self.purge().await
    }

    /// Records `events` in committed transactions of 1,000.
    pub(crate) async fn backlog(&self, events: &[OrderPlaced]) -> Result<(), BoxError> {
        let outbox = outbox::postgres::Outbox::new(&self.schema)?.notify(false);
        let mut conn = self.conn().await?;
        for chunk in events.chunks(1000) {
            conn.transaction::<_, outbox::postgres::Error, _>(async |conn| {
                outbox.record_all(conn, chunk).await
            })
            .await?;
        }
        self.exec(&format!("VACUUM ANALYZE {}", self.table("outbox_events")))
            .await?;
        Ok(())
    }

    /// Drops the schema; the exchange and queue go when `self` is dropped.
    pub(crate) async fn cleanup(self) {
        let _ = self
            .exec(&format!(
                "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
                self.schema
            ))
            .await;
    }
}

/// `aggregates × per_aggregate` events, interleaved (a0 b0 c0 … a1 b1 …).
pub(crate) fn interleaved(aggregates: usize, per_aggregate: usize) -> Vec<OrderPlaced> {
    let customer = Uuid::now_v7();
    (0..per_aggregate)
        .flat_map(|n| {
            (0..aggregates).map(move |a| OrderPlaced {
                order_id: format!("order-{a}"),
                customer_id: customer,
                total_cents: n as i64,
            })
        })
        .collect()
}

/// Percentile (0..=100) of sorted `values`.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Median of `f` over `n` runs, in milliseconds.
pub(crate) async fn median_ms<F, Fut>(n: usize, mut f: F) -> Result<f64, BoxError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), BoxError>>,
{
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let started = std::time::Instant::now();
        f().await?;
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    times.sort_by(f64::total_cmp);
    Ok(percentile(&times, 50.0))
}

pub(crate) fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// Raw SQL kept prepared on its connection, as Diesel's DSL queries and the
/// library's own statements are (`diesel::sql_query` is re-prepared on every
/// run: an extra round trip). The W1 ceilings use it, so they are what a
/// careful hand-written version costs.
#[derive(Debug, Clone)]
pub(crate) struct Prepared<Q>(pub(crate) Q);

impl<DB: diesel::backend::Backend, Q: diesel::query_builder::QueryFragment<DB>>
    diesel::query_builder::QueryFragment<DB> for Prepared<Q>
{
    fn walk_ast<'b>(
        &'b self,
        pass: diesel::query_builder::AstPass<'_, 'b, DB>,
    ) -> diesel::QueryResult<()> {
        self.0.walk_ast(pass)
    }

    fn is_safe_to_cache_prepared(&self, _backend: &DB) -> diesel::QueryResult<bool> {
        Ok(true)
    }
}

impl<Q> diesel::query_builder::QueryId for Prepared<Q> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}
