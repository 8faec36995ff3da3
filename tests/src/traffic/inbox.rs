//! The scenario's inbox consumer, whose effects must happen exactly once.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use diesel_async::SimpleAsyncConnection as _;
use outbox::mysql::{MysqlInbox, MysqlInboxDatabase};
use outbox::postgres::{Connection, PgInbox, PgInboxDatabase, Transaction};
use outbox::rabbitmq::{EventHandler, HandlerError, InboxConsumer, IncomingEvent};
use outbox::sqlite::{SqliteInbox, SqliteInboxDatabase};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::Tick;
use crate::Scenario;
use crate::scenario::Db;

/// How the inbox consumer's handler misbehaves.
#[derive(Debug, Clone, Default)]
pub struct HandlerFaults {
    /// Sleep this long in every handler call (a slow consumer: with a small
    /// prefetch the queue backs up).
    pub slow: Duration,
    /// The first attempt of every `fail_every`-th event fails (0: never);
    /// the consumer retries it.
    pub fail_every: u32,
}

/// The scenario's inbox consumer: writes one `effects` row per event on the
/// consumer's transaction, on any back end.
#[derive(Debug)]
struct WriteEffect {
    /// The `effects` table, qualified on PostgreSQL.
    effects: String,
    consumer: String,
    faults: HandlerFaults,
    failed_once: Mutex<HashSet<Uuid>>,
}

impl<C: Connection> EventHandler<Transaction<C>> for WriteEffect {
    async fn handle(
        &self,
        tx: &mut Transaction<C>,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        let tick: Tick = event.payload_as().map_err(HandlerError::permanent)?;
        if !self.faults.slow.is_zero() {
            tokio::time::sleep(self.faults.slow).await;
        }
        // Literals: the id is a uuid, the consumer name the scenario's
        // (letters, digits, `_` and `.`), so one statement fits every back
        // end's placeholders.
        let insert = format!(
            "INSERT INTO {} (event_id, consumer) VALUES ('{}', '{}')",
            self.effects, event.id, self.consumer
        );
        tx.batch_execute(&insert).await.map_err(HandlerError::new)?;
        let every = self.faults.fail_every;
        let first_attempt = || {
            self.failed_once
                .lock()
                .is_ok_and(|mut f| f.insert(event.id))
        };
        if every > 0 && tick.seq.unsigned_abs().is_multiple_of(every) && first_attempt() {
            return Err(HandlerError::new(format!(
                "failing the first attempt of {} seq {} on purpose",
                tick.aggregate, tick.seq
            )));
        }
        Ok(())
    }
}

/// A running inbox consumer.
#[derive(Debug)]
pub struct Inbox {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<outbox::rabbitmq::Result<()>>,
}

impl Inbox {
    /// Starts an [`InboxConsumer`] on the scenario's inbox queue, named
    /// `<scenario>.inbox`, with `prefetch` and the handler `faults`.
    /// Retries wait 200 ms; a message is dead-lettered after 5 failed
    /// attempts (the library's default). A database outage spends none.
    pub fn start(scenario: &Scenario, prefetch: u16, faults: HandlerFaults) -> Inbox {
        Inbox::start_concurrent(scenario, prefetch, 1, faults)
    }

    /// [`Inbox::start`] handling `concurrency` deliveries at once (of
    /// different aggregates; the scenario's pool has 8 connections).
    pub fn start_concurrent(
        scenario: &Scenario,
        prefetch: u16,
        concurrency: usize,
        faults: HandlerFaults,
    ) -> Inbox {
        let name = format!("{}.inbox", scenario.name);
        let handler = WriteEffect {
            effects: scenario.table("effects"),
            consumer: name.clone(),
            faults,
            failed_once: Mutex::default(),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let stopped = async {
            let _ = stopped.await;
        };
        // The same consumer on each back end's inbox.
        macro_rules! run {
            ($database:expr) => {{
                let consumer = InboxConsumer::builder(
                    scenario.servers.amqp_url.clone(),
                    scenario.inbox_queue.clone(),
                    name,
                    $database,
                    handler,
                )
                .declare(scenario.inbox_topology())
                .prefetch(prefetch)
                .concurrency(concurrency)
                .max_attempts(5)
                .retry_delay(Duration::from_millis(200))
                .reconnect_backoff(Duration::from_millis(100), Duration::from_secs(1))
                .build()
                .unwrap_or_else(|e| panic!("inbox consumer: {e}"));
                tokio::spawn(consumer.run(stopped))
            }};
        }
        let task = match scenario.db() {
            Db::Pg(pool) => {
                let inbox = PgInbox::new(&scenario.schema).unwrap_or_else(|e| panic!("inbox: {e}"));
                run!(PgInboxDatabase::new(pool.clone(), inbox))
            }
            Db::Mysql(pool) => run!(MysqlInboxDatabase::new(pool.clone(), MysqlInbox::default())),
            Db::Sqlite(pool) => run!(SqliteInboxDatabase::new(
                pool.clone(),
                SqliteInbox::default()
            )),
        };
        Inbox {
            stop: Some(stop),
            task,
        }
    }

    /// Stops the consumer; panics if it had stopped with an error.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match tokio::time::timeout(Duration::from_secs(30), &mut self.task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => panic!("the inbox consumer stopped with an error: {e}"),
            Ok(Err(e)) => panic!("the inbox consumer panicked: {e}"),
            Err(_) => panic!("the inbox consumer did not stop within 30 s"),
        }
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        self.task.abort();
    }
}
