//! Producers that commit business rows with their events, and roll some
//! back on purpose.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use diesel::sql_types::{Integer, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox::postgres::{Connection, Outbox, Transaction};
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::{Late, Tick};
use crate::Scenario;
use crate::scenario::Db;

/// How the producers run.
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// Concurrent producers (each with its own connection).
    pub producers: usize,
    /// Aggregates per producer; a producer cycles through its own.
    pub aggregates: usize,
    /// Pause between two transactions of one producer.
    pub interval: Duration,
    /// Every `rollback_every`-th transaction records its events and rolls
    /// back on purpose (0: never).
    pub rollback_every: usize,
    /// The first `late_producers` producers record the events of every
    /// third transaction on their first two aggregates as [`Late`] (event
    /// type `fault.late`) instead of [`Tick`]s.
    pub late_producers: usize,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            producers: 3,
            aggregates: 10,
            interval: Duration::from_millis(10),
            rollback_every: 7,
            late_producers: 0,
        }
    }
}

/// What the producers did.
#[derive(Debug, Default, Clone)]
pub struct Produced {
    /// Transactions that committed.
    pub committed_transactions: usize,
    /// Event ids of transactions rolled back on purpose.
    pub rolled_back: Vec<Uuid>,
    /// Transactions that failed (connection lost, database down); the
    /// outcome of a failed COMMIT is unknown to the producer, the `orders`
    /// table tells.
    pub failed: usize,
    /// Event ids of transactions whose `COMMIT` succeeded (PostgreSQL
    /// producers only): what a failover must not lose.
    pub acknowledged: Vec<Uuid>,
    /// Event ids recorded in transactions whose `COMMIT` failed
    /// (PostgreSQL producers only): committed or not, the `orders` table
    /// tells.
    pub unknown: Vec<Uuid>,
    /// Event ids recorded in transactions that failed before their
    /// `COMMIT` was sent (a statement failed: PostgreSQL producers only):
    /// certainly not committed, so never to be delivered.
    pub failed_uncommitted: Vec<Uuid>,
}

/// Running producers; [`stop`](Self::stop) ends them and returns what they
/// did.
#[derive(Debug)]
pub struct Producers {
    stop: Arc<AtomicBool>,
    tasks: Vec<JoinHandle<Produced>>,
}

#[derive(Debug)]
enum TxError {
    RollBack(Vec<Uuid>),
    Failed(String),
}

impl From<diesel::result::Error> for TxError {
    fn from(e: diesel::result::Error) -> Self {
        TxError::Failed(e.to_string())
    }
}

impl From<outbox::postgres::Error> for TxError {
    fn from(e: outbox::postgres::Error) -> Self {
        TxError::Failed(e.to_string())
    }
}

impl Producers {
    /// Starts the producers on the scenario's database. Each transaction
    /// inserts 1–3 `orders` rows and records their [`Tick`]s through
    /// [`Outbox::record_all`] (on MariaDB and SQLite through
    /// [`Connection::record_events`], on a pool of one connection per
    /// producer); connection failures are counted and the producer
    /// reconnects.
    pub fn start(scenario: &Scenario, config: ProducerConfig) -> Producers {
        let stop = Arc::new(AtomicBool::new(false));
        let url = scenario.servers.database_url.clone();
        let tasks = (0..config.producers)
            .map(|p| {
                let config = config.clone();
                let stop = Arc::clone(&stop);
                match scenario.db() {
                    Db::Pg(_) => tokio::spawn(produce(
                        p,
                        url.clone(),
                        scenario.schema.clone(),
                        config,
                        stop,
                    )),
                    Db::Mysql(_) => {
                        let pool = outbox::mysql::pool(&url, 1)
                            .unwrap_or_else(|e| panic!("producer pool: {e}"));
                        tokio::spawn(produce_on::<diesel_async::AsyncMysqlConnection>(
                            p, pool, config, stop,
                        ))
                    }
                    Db::Sqlite(_) => {
                        let pool = outbox::sqlite::pool(&url, 1)
                            .unwrap_or_else(|e| panic!("producer pool: {e}"));
                        tokio::spawn(produce_on::<outbox::sqlite::AsyncSqliteConnection>(
                            p, pool, config, stop,
                        ))
                    }
                }
            })
            .collect();
        Producers { stop, tasks }
    }

    /// Stops the producers after their current transaction.
    pub async fn stop(self) -> Produced {
        AtomicBool::store(&self.stop, true, Ordering::Relaxed);
        let mut total = Produced::default();
        for task in self.tasks {
            let Ok(produced) = task.await else {
                panic!("a producer panicked");
            };
            total.committed_transactions += produced.committed_transactions;
            total.rolled_back.extend(produced.rolled_back);
            total.failed += produced.failed;
            total.acknowledged.extend(produced.acknowledged);
            total.unknown.extend(produced.unknown);
            total.failed_uncommitted.extend(produced.failed_uncommitted);
        }
        total
    }
}

async fn produce(
    producer: usize,
    url: String,
    schema: String,
    config: ProducerConfig,
    stop: Arc<AtomicBool>,
) -> Produced {
    let outbox = Outbox::new(&schema).unwrap_or_else(|e| panic!("outbox: {e}"));
    let insert =
        format!("INSERT INTO \"{schema}\".orders (event_id, aggregate, seq) VALUES ($1, $2, $3)");
    let mut produced = Produced::default();
    let mut seqs = vec![0i32; config.aggregates.max(1)];
    let mut conn: Option<AsyncPgConnection> = None;
    let mut round = 0usize;
    while !AtomicBool::load(&stop, Ordering::Relaxed) {
        let Some(c) = conn.as_mut() else {
            // As an application: through the library, which asks for a
            // server that takes writes (with several hosts in the URL, the
            // primary; after a failover, the promoted standby).
            match outbox::postgres::connect(&url).await {
                Ok(c) => conn = Some(c),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
            continue;
        };
        round += 1;
        let a = round % seqs.len();
        let events: Vec<Tick> = (0..1 + round % 3)
            .map(|i| Tick {
                aggregate: format!("p{producer}-a{a}"),
                seq: seqs[a] + i as i32,
            })
            .collect();
        // Sequence numbers are spent whatever the outcome, so they grow in
        // commit order even when a COMMIT's outcome is unknown.
        seqs[a] += events.len() as i32;
        let roll_back = config.rollback_every > 0 && round.is_multiple_of(config.rollback_every);
        let late = producer < config.late_producers && a < 2 && round.is_multiple_of(3);
        // The ids recorded, for the outcome below (a failed COMMIT's
        // events may or may not be committed).
        let recorded = std::sync::Mutex::new(Vec::new());
        // Set when the body ends well: a failure after it is the COMMIT's
        // (outcome unknown); one before it, a statement's (rolled back).
        let body_done = AtomicBool::new(false);
        let result = c
            .transaction::<_, TxError, _>(async |tx| {
                let ids = if late {
                    let events: Vec<Late> = events.iter().map(Late::from).collect();
                    outbox.record_all(tx, &events).await?
                } else {
                    outbox.record_all(tx, &events).await?
                };
                if let Ok(mut recorded) = recorded.lock() {
                    recorded.extend(ids.iter().copied());
                }
                for (id, event) in ids.iter().zip(&events) {
                    diesel::sql_query(&insert)
                        .bind::<diesel::sql_types::Uuid, _>(id)
                        .bind::<Text, _>(&event.aggregate)
                        .bind::<Integer, _>(event.seq)
                        .execute(tx)
                        .await?;
                }
                if roll_back {
                    return Err(TxError::RollBack(ids));
                }
                AtomicBool::store(&body_done, true, Ordering::Relaxed);
                Ok(())
            })
            .await;
        let recorded = recorded.into_inner().unwrap_or_default();
        let commit_sent = body_done.into_inner();
        match result {
            Ok(()) => {
                produced.committed_transactions += 1;
                produced.acknowledged.extend(recorded);
            }
            Err(TxError::RollBack(ids)) => produced.rolled_back.extend(ids),
            Err(TxError::Failed(error)) => {
                tracing::debug!(producer, %error, "transaction failed; reconnecting");
                produced.failed += 1;
                if commit_sent {
                    produced.unknown.extend(recorded);
                } else {
                    produced.failed_uncommitted.extend(recorded);
                }
                conn = None;
            }
        }
        tokio::time::sleep(config.interval).await;
    }
    produced
}

/// The producer loop of [`produce`] on MariaDB or SQLite: the same
/// transactions, begun on `pool` (one connection) as the back end's
/// [`Transaction`], the events recorded with
/// [`Connection::record_events`] into the database's outbox, the `orders`
/// rows inserted as literals (ids, aggregates and numbers the producer
/// made).
async fn produce_on<C: Connection>(
    producer: usize,
    pool: deadpool::managed::Pool<C::Manager>,
    config: ProducerConfig,
    stop: Arc<AtomicBool>,
) -> Produced {
    let mut produced = Produced::default();
    let mut seqs = vec![0i32; config.aggregates.max(1)];
    let mut round = 0usize;
    while !AtomicBool::load(&stop, Ordering::Relaxed) {
        round += 1;
        let a = round % seqs.len();
        let events: Vec<Tick> = (0..1 + round % 3)
            .map(|i| Tick {
                aggregate: format!("p{producer}-a{a}"),
                seq: seqs[a] + i as i32,
            })
            .collect();
        // As in `produce`: sequence numbers are spent whatever the outcome.
        seqs[a] += events.len() as i32;
        let roll_back = config.rollback_every > 0 && round.is_multiple_of(config.rollback_every);
        let late = producer < config.late_producers && a < 2 && round.is_multiple_of(3);
        let result = async {
            let mut tx = Transaction::<C>::begin(&pool).await?;
            let ids = if late {
                let events: Vec<Late> = events.iter().map(Late::from).collect();
                tx.record_events(&events).await?
            } else {
                tx.record_events(&events).await?
            };
            let rows: Vec<String> = ids
                .iter()
                .zip(&events)
                .map(|(id, e)| format!("('{id}', '{}', {})", e.aggregate, e.seq))
                .collect();
            tx.batch_execute(&format!(
                "INSERT INTO orders (event_id, aggregate, seq) VALUES {}",
                rows.join(", ")
            ))
            .await?;
            if roll_back {
                // A failed rollback closes the connection: rolled back too.
                let _ = tx.rollback().await;
                return Err(TxError::RollBack(ids));
            }
            tx.commit().await?;
            Ok::<(), TxError>(())
        }
        .await;
        match result {
            Ok(()) => produced.committed_transactions += 1,
            Err(TxError::RollBack(ids)) => produced.rolled_back.extend(ids),
            Err(TxError::Failed(error)) => {
                tracing::debug!(producer, %error, "transaction failed");
                produced.failed += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        tokio::time::sleep(config.interval).await;
    }
    produced
}

/// Commits `count` [`Tick`]s of `aggregate` (with their `orders` rows) in
/// one transaction, numbered from `first_seq`; returns their ids.
pub async fn commit_burst(
    scenario: &Scenario,
    aggregate: &str,
    first_seq: i32,
    count: usize,
) -> Vec<Uuid> {
    let schema = &scenario.schema;
    let outbox = Outbox::new(schema).unwrap_or_else(|e| panic!("outbox: {e}"));
    let events: Vec<Tick> = (0..count)
        .map(|i| Tick {
            aggregate: aggregate.to_owned(),
            seq: first_seq + i32::try_from(i).unwrap_or(i32::MAX),
        })
        .collect();
    let insert = format!(
        "INSERT INTO \"{schema}\".orders (event_id, aggregate, seq) \
         SELECT * FROM unnest($1::uuid[], $2::text[], $3::int[])"
    );
    let mut conn = scenario
        .pool()
        .get()
        .await
        .unwrap_or_else(|e| panic!("no connection: {e}"));
    conn.transaction::<_, TxError, _>(async |tx| {
        let ids = outbox.record_all(tx, &events).await?;
        diesel::sql_query(&insert)
            .bind::<diesel::sql_types::Array<diesel::sql_types::Uuid>, _>(&ids)
            .bind::<diesel::sql_types::Array<Text>, _>(
                events
                    .iter()
                    .map(|e| e.aggregate.clone())
                    .collect::<Vec<_>>(),
            )
            .bind::<diesel::sql_types::Array<Integer>, _>(
                events.iter().map(|e| e.seq).collect::<Vec<_>>(),
            )
            .execute(tx)
            .await?;
        Ok(ids)
    })
    .await
    .unwrap_or_else(|e| panic!("committing {count} events of {aggregate}: {e:?}"))
}
