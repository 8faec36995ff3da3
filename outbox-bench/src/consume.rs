//! W5: the inbox consumer (`outbox::rabbitmq::InboxConsumer` on
//! `outbox::postgres::PgInboxDatabase`) applying a backlog already waiting
//! in a durable queue, against the two ceilings it stands on, measured in
//! the same run: the broker's (raw lapin consume + ack, no database) and
//! the database's (the same two inserts per transaction, no broker).
//!
//! Each delivery is one transaction: the inbox entry
//! (`INSERT … ON CONFLICT DO NOTHING` on `inbox_events`), the handler's
//! insert of one `w5_applied` row, and the library's checked commit; then
//! the ack. The database ceiling runs exactly those two inserts, prepared,
//! on the same tables, committed by as many concurrent writers as the
//! consumer has workers, so the ratio shows what the consumer adds (the
//! pool checkout, the per-delivery decoding, dispatch and ack) and not
//! the cost of the work itself.
//!
//! The consumer's [`InboxDatabase`] is wrapped ([`Timed`]) to count
//! commits (the clock stops at the last one: its ack follows at once) and
//! to time each phase of a delivery (begin, inbox insert, handler,
//! commit); what a worker spends outside them (waiting for a delivery,
//! decoding, acking) is the rest of its time. The wrapper delegates every
//! call and adds two clock reads per phase.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ConfirmSelectOptions, QueuePurgeOptions,
};
use lapin::types::FieldTable;
use outbox::postgres::{PgInbox, PgInboxDatabase, PgTransaction};
use outbox::rabbitmq::{
    EventHandler, HandlerError, InboxConsumer, IncomingEvent, QueueTopology, wire,
};
use outbox::{EventEnvelope, InboxDatabase, InboxOutcome, admin::DeadLetter};
use outbox_testkit::amqp::TestBroker;
use uuid::Uuid;

use crate::cpu::{self, Cpu};
use crate::setup::{self, BoxError, Env, OrderPlaced, Prepared, amqp_url};

/// Unacknowledged deliveries the broker sends ahead, the same for the
/// consumer and the broker ceiling at every concurrency: 8 per worker at
/// concurrency 8 (the consumer hashes deliveries to workers by aggregate,
/// so a worker needs a few queued to not idle while another's queue is
/// full), and at the rates measured here (≤ a few thousand a second) 64
/// messages are ~20 ms of work, far more than the broker's delivery round
/// trip: the prefetch never starves a worker.
pub(crate) const PREFETCH: u16 = 64;

/// The consumer's concurrency settings W5 measures.
pub(crate) const CONCURRENCY: [usize; 3] = [1, 4, 8];

/// The inbox consumer name (the key of its `inbox_events` rows).
const CONSUMER: &str = "bench.w5";

/// The database ceiling's inbox consumer name.
const CEILING_CONSUMER: &str = "bench.w5.ceiling";

/// The backlog is published in batches of this many, each batch's
/// confirms awaited before the next.
const FILL_BATCH: usize = 500;

/// How long one run may take before it is given up as failed.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// The queue, its exchange and dead-letter exchange, and the backlog
/// published into it before every run.
pub(crate) struct Rig {
    broker: TestBroker,
    exchange: String,
    queue: String,
    envelopes: Vec<EventEnvelope>,
    expected: HashSet<Uuid>,
    /// `INSERT` of one `w5_applied` row (`$1` event id, `$2` order id,
    /// `$3` total).
    applied_sql: String,
    /// The library's inbox `INSERT`, for the database ceiling.
    inbox_sql: String,
    /// The database URL of every connection W5's runs open, with an
    /// `application_name` of their own ([`Rig::cpu_db`]).
    db_url: String,
    /// Where W5's PostgreSQL CPU is counted: the backends of those
    /// connections, found by that name (as W2 counts the relay pool's).
    cpu_db: cpu::Db,
}

impl Rig {
    /// Declares the W5 queue (with its dead-letter exchange and queue, as
    /// [`QueueTopology`] makes them) and exchange, and creates the
    /// handler's table in the run's schema.
    pub(crate) async fn new(env: &Env, events: &[OrderPlaced]) -> Result<Rig, BoxError> {
        let broker = TestBroker::new(format!("{}.w5", env.schema)).await;
        let exchange = broker.topic_exchange(&broker.named("events")).await;
        let topology = QueueTopology::new(broker.named("apply"))
            .exchange(&exchange)
            .bind("#");
        broker.delete_queue_on_drop(topology.queue_name());
        if let Some(dlq) = topology.dead_letter_queue_name() {
            broker.delete_queue_on_drop(dlq);
        }
        if let Some(dlx) = topology.dead_letter_exchange_name() {
            broker.delete_exchange_on_drop(dlx);
        }
        topology.declare(broker.channel()).await?;
        let queue = topology.queue_name().to_owned();
        let applied = env.table("w5_applied");
        env.exec(&format!(
            "CREATE TABLE {applied} (
                 id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                 event_id uuid NOT NULL, order_id text NOT NULL, total_cents bigint NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now())"
        ))
        .await?;
        let envelopes: Vec<EventEnvelope> = events
            .iter()
            .map(EventEnvelope::from_event)
            .collect::<Result<_, _>>()?;
        let expected = envelopes.iter().map(|e| e.id).collect();
        let application_name = format!("{}_w5", env.schema);
        Ok(Rig {
            db_url: cpu::url_with_application_name(&env.url, &application_name),
            cpu_db: cpu::Db::Postgres { application_name },
            broker,
            exchange,
            queue,
            envelopes,
            expected,
            applied_sql: format!(
                "INSERT INTO {applied} (event_id, order_id, total_cents) VALUES ($1, $2, $3)"
            ),
            // The same statement `PgInbox::receive` runs.
            inbox_sql: format!(
                "INSERT INTO {} (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                env.table("inbox_events")
            ),
        })
    }

    /// How many events each run applies.
    pub(crate) fn events(&self) -> usize {
        self.envelopes.len()
    }

    /// How unevenly the consumer's hash of aggregates spreads the backlog
    /// over `workers`: the busiest worker's events over the mean. Each
    /// worker handles its own share in turn, so a run lasts as long as the
    /// busiest one's share takes and the others idle for the rest.
    pub(crate) fn spread(&self, workers: usize) -> f64 {
        let mut counts = vec![0usize; workers.max(1)];
        for e in &self.envelopes {
            if let Some(count) =
                counts.get_mut(worker_for(&e.aggregate_type, &e.aggregate_id, workers))
            {
                *count += 1;
            }
        }
        let max = counts.iter().copied().max().unwrap_or(0);
        max as f64 * counts.len() as f64 / self.events().max(1) as f64
    }

    /// Empties the inbox, the handler's table and the queue, waits until
    /// no consumer of an earlier run is left on the queue, then publishes
    /// the backlog (relay wire format, confirmed) and checks it is all in
    /// the queue.
    async fn fill(&self, env: &Env) -> Result<(), BoxError> {
        env.exec(&format!(
            "TRUNCATE {}, {}",
            env.table("inbox_events"),
            env.table("w5_applied")
        ))
        .await?;
        let channel = self.broker.channel();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.declare_passive().await?.consumer_count() > 0 {
            if tokio::time::Instant::now() > deadline {
                return Err(
                    format!("queue {} keeps a consumer of an earlier run", self.queue).into(),
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        channel
            .queue_purge(self.queue.as_str().into(), QueuePurgeOptions::default())
            .await?;
        let publisher = self.broker.connection().create_channel().await?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        crate::raw::publish_all(&publisher, &self.exchange, &self.envelopes, FILL_BATCH)
            .await
            .map_err(|e| format!("W5 backlog: {e}"))?;
        let _ = publisher.close(200, "done".into()).await;
        let ready = self.declare_passive().await?.message_count() as usize;
        if ready != self.events() {
            return Err(format!(
                "W5 backlog: {ready} messages in the queue, {} published",
                self.events()
            )
            .into());
        }
        Ok(())
    }

    async fn declare_passive(&self) -> Result<lapin::Queue, BoxError> {
        setup::declare_passive(self.broker.channel(), &self.queue).await
    }
}

/// One run: how long until every event was applied (or acked), what it
/// cost, and what was wrong.
#[derive(Debug, Clone, Default)]
pub(crate) struct Apply {
    pub(crate) events: usize,
    pub(crate) elapsed: Duration,
    /// Events never applied (or acked).
    pub(crate) missing: usize,
    /// Events applied (or delivered) more than once.
    pub(crate) duplicates: usize,
    /// Messages left in the queue after the run (not acked).
    pub(crate) left: usize,
    /// CPU used during the run: the bench process, the PostgreSQL backends
    /// of the run's connections ([`Rig::cpu_db`]), RabbitMQ and how busy
    /// the machine was.
    pub(crate) cpu: Cpu,
    /// From the run's start to the first delivery in a worker's hands
    /// (connecting, subscribing; consumer and raw runs).
    pub(crate) startup: Duration,
    /// Per-phase time of the consumer's deliveries (consumer runs only).
    pub(crate) phases: Option<PhaseTotals>,
    /// The raw consumers' time per delivery, ms per event summed over
    /// their tasks: waiting for it; `BEGIN`, inbox insert, handler insert
    /// and `COMMIT` (by hand only); its ack.
    pub(crate) raw_phases: Option<[f64; 6]>,
}

impl Apply {
    pub(crate) fn rate(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64()
    }

    /// CPU per event, in microseconds, of the bench process, PostgreSQL
    /// and RabbitMQ.
    pub(crate) fn cpu_us(&self) -> [f64; 3] {
        let per_event = |d: Duration| d.as_secs_f64() * 1e6 / self.events.max(1) as f64;
        [
            per_event(self.cpu.process),
            per_event(self.cpu.db.unwrap_or_default()),
            per_event(self.cpu.broker),
        ]
    }
}

/// The run of median rate among `runs`; missing, duplicated and left
/// messages are those of all of them, so none is hidden.
pub(crate) fn median(runs: &[Apply]) -> Apply {
    let mut sorted = runs.to_vec();
    sorted.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
    let mut median = sorted.get(sorted.len() / 2).cloned().unwrap_or_default();
    median.missing = runs.iter().map(|r| r.missing).sum();
    median.duplicates = runs.iter().map(|r| r.duplicates).sum();
    median.left = runs.iter().map(|r| r.left).sum();
    median
}

/// Time the consumer's deliveries spent in each phase, summed over all
/// of them (nanoseconds), and how many committed.
#[derive(Debug, Default)]
pub(crate) struct Phases {
    begin: AtomicU64,
    receive: AtomicU64,
    handler: AtomicU64,
    commit: AtomicU64,
    committed: AtomicUsize,
    duplicates: AtomicUsize,
    /// Woken when `committed` reaches the backlog's size.
    all_committed: tokio::sync::Notify,
    target: AtomicUsize,
    /// When the first delivery reached a worker (its `begin`).
    first: std::sync::OnceLock<Instant>,
}

/// [`Phases`] of one run, in milliseconds per event.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PhaseTotals {
    pub(crate) begin: f64,
    pub(crate) receive: f64,
    pub(crate) handler: f64,
    pub(crate) commit: f64,
    /// A worker's time outside the four (waiting for its next delivery,
    /// decoding, acking, idle at the end while the busiest worker
    /// finishes): `concurrency × (elapsed − startup)` minus the four.
    pub(crate) other: f64,
}

/// A worker's time per event outside `phases` (ms): `workers` × the run
/// after its first delivery, per event, minus the phases.
pub(crate) fn other_ms(a: &Apply, workers: usize, phases: &[f64]) -> f64 {
    let run = a.elapsed.saturating_sub(a.startup).as_secs_f64() * 1e3;
    run * workers as f64 / a.events.max(1) as f64 - phases.iter().sum::<f64>()
}

fn add(counter: &AtomicU64, since: Instant) {
    let ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
    counter.fetch_add(ns, Ordering::Relaxed);
}

impl Phases {
    /// Per event; `startup` (connecting, subscribing, until the first
    /// delivery) is no worker's time.
    fn totals(
        &self,
        events: usize,
        workers: usize,
        elapsed: Duration,
        startup: Duration,
    ) -> PhaseTotals {
        let elapsed = elapsed.saturating_sub(startup);
        let per_event = |ns: u64| ns as f64 / 1e6 / events.max(1) as f64;
        let begin = per_event(AtomicU64::load(&self.begin, Ordering::Relaxed));
        let receive = per_event(AtomicU64::load(&self.receive, Ordering::Relaxed));
        let handler = per_event(AtomicU64::load(&self.handler, Ordering::Relaxed));
        let commit = per_event(AtomicU64::load(&self.commit, Ordering::Relaxed));
        let worker_ms = elapsed.as_secs_f64() * 1e3 * workers as f64 / events.max(1) as f64;
        PhaseTotals {
            begin,
            receive,
            handler,
            commit,
            other: worker_ms - begin - receive - handler - commit,
        }
    }
}

/// [`PgInboxDatabase`], timed per phase and counting commits; delegates
/// every call.
struct Timed {
    db: PgInboxDatabase,
    phases: Arc<Phases>,
}

impl InboxDatabase for Timed {
    type Tx = PgTransaction;
    type Error = outbox::postgres::Error;

    async fn begin(&self) -> Result<PgTransaction, Self::Error> {
        let started = Instant::now();
        self.phases.first.get_or_init(|| started);
        let tx = self.db.begin().await;
        add(&self.phases.begin, started);
        tx
    }

    async fn receive(
        &self,
        tx: &mut PgTransaction,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<InboxOutcome, Self::Error> {
        let started = Instant::now();
        let outcome = self.db.receive(tx, consumer, event_id).await;
        add(&self.phases.receive, started);
        if let Ok(InboxOutcome::Duplicate) = outcome {
            self.phases.duplicates.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }

    /// Forwarded so that a batch-mode consumer keeps `PgInboxDatabase`'s
    /// one-statement version (timed as the inbox insert).
    async fn receive_all(
        &self,
        tx: &mut PgTransaction,
        consumer: &str,
        event_ids: &[Uuid],
    ) -> Result<Vec<InboxOutcome>, Self::Error> {
        let started = Instant::now();
        let outcomes = self.db.receive_all(tx, consumer, event_ids).await;
        add(&self.phases.receive, started);
        if let Ok(outcomes) = &outcomes {
            let duplicates = outcomes
                .iter()
                .filter(|o| **o == InboxOutcome::Duplicate)
                .count();
            self.phases
                .duplicates
                .fetch_add(duplicates, Ordering::Relaxed);
        }
        outcomes
    }

    async fn commit(&self, tx: PgTransaction) -> Result<(), Self::Error> {
        let started = Instant::now();
        let committed = self.db.commit(tx).await;
        add(&self.phases.commit, started);
        if committed.is_ok() {
            let n = self.phases.committed.fetch_add(1, Ordering::Relaxed) + 1;
            if n == AtomicUsize::load(&self.phases.target, Ordering::Relaxed) {
                self.phases.all_committed.notify_one();
            }
        }
        committed
    }

    async fn rollback(&self, tx: PgTransaction) -> Result<(), Self::Error> {
        self.db.rollback(tx).await
    }

    async fn record_dead_letter(&self, letter: &DeadLetter) -> Result<(), Self::Error> {
        self.db.record_dead_letter(letter).await
    }
}

/// The handler: one `w5_applied` row per event, from its payload.
struct ApplyOrder {
    sql: String,
    phases: Arc<Phases>,
}

#[derive(serde::Deserialize)]
struct Order {
    order_id: String,
    total_cents: i64,
}

impl EventHandler<PgTransaction> for ApplyOrder {
    async fn handle(
        &self,
        tx: &mut PgTransaction,
        event: &IncomingEvent,
    ) -> Result<(), HandlerError> {
        let started = Instant::now();
        let order: Order = event.payload_as().map_err(HandlerError::permanent)?;
        Prepared(
            diesel::sql_query(self.sql.as_str())
                .bind::<diesel::sql_types::Uuid, _>(event.id)
                .bind::<Text, _>(order.order_id.as_str())
                .bind::<BigInt, _>(order.total_cents),
        )
        .execute(&mut **tx)
        .await?;
        add(&self.phases.handler, started);
        Ok(())
    }
}

/// The inbox consumer applying the backlog with `concurrency` workers.
pub(crate) async fn consumer(env: &Env, rig: &Rig, concurrency: usize) -> Result<Apply, BoxError> {
    rig.fill(env).await?;
    let pool = outbox::postgres::pool(&rig.db_url, concurrency)?;
    // Connections open before the clock starts, as a running service's
    // pool would have them.
    let mut warm = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        warm.push(pool.get().await?);
    }
    drop(warm);
    let phases = Arc::new(Phases::default());
    phases.target.store(rig.events(), Ordering::Relaxed);
    let db = Timed {
        db: PgInboxDatabase::new(pool, PgInbox::new(&env.schema)?),
        phases: Arc::clone(&phases),
    };
    let handler = ApplyOrder {
        sql: rig.applied_sql.clone(),
        phases: Arc::clone(&phases),
    };
    let consumer = InboxConsumer::builder(amqp_url(), rig.queue.as_str(), CONSUMER, db, handler)
        .prefetch(PREFETCH)
        .concurrency(concurrency)
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let meter = cpu::Meter::start(&rig.cpu_db).await?;
    let started = Instant::now();
    let running = tokio::spawn(consumer.run(async {
        let _ = stopped.await;
    }));
    let all = tokio::time::timeout(RUN_TIMEOUT, phases.all_committed.notified()).await;
    let elapsed = started.elapsed();
    let cpu = meter.stop().await?;
    let _ = stop.send(());
    running.await??;
    if all.is_err() {
        println!(
            "  (W5 consumer, concurrency {concurrency}: {} of {} committed after {})",
            AtomicUsize::load(&phases.committed, Ordering::Relaxed),
            rig.events(),
            setup::secs(RUN_TIMEOUT)
        );
    }
    let (missing, duplicates) = check_applied(env, rig).await?;
    let left = rig.declare_passive().await?.message_count() as usize;
    let startup = phases
        .first
        .get()
        .map_or(Duration::ZERO, |t| t.saturating_duration_since(started));
    Ok(Apply {
        events: rig.events(),
        elapsed,
        missing,
        duplicates: duplicates + AtomicUsize::load(&phases.duplicates, Ordering::Relaxed),
        left,
        cpu,
        startup,
        phases: Some(phases.totals(rig.events(), concurrency, elapsed, startup)),
        raw_phases: None,
    })
}

/// The inbox consumer in batch mode (`InboxConsumerBuilder::batch`): up
/// to `batch` deliveries applied in one transaction, with `concurrency`
/// workers and a prefetch of twice `batch` × `concurrency` (the builder
/// refuses less than once). The clock stops when a count of the handler's
/// table, taken every 10 ms, finds every event (at most 10 ms late).
pub(crate) async fn batched(
    env: &Env,
    rig: &Rig,
    concurrency: usize,
    batch: usize,
) -> Result<Apply, BoxError> {
    rig.fill(env).await?;
    let pool = outbox::postgres::pool(&rig.db_url, concurrency)?;
    let mut warm = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        warm.push(pool.get().await?);
    }
    drop(warm);
    let db = PgInboxDatabase::new(pool, PgInbox::new(&env.schema)?);
    let handler = ApplyOrder {
        sql: rig.applied_sql.clone(),
        phases: Arc::new(Phases::default()),
    };
    let prefetch = u16::try_from(2 * batch * concurrency).unwrap_or(u16::MAX);
    let consumer = InboxConsumer::builder(amqp_url(), rig.queue.as_str(), CONSUMER, db, handler)
        .prefetch(prefetch)
        .concurrency(concurrency)
        .batch(batch, Duration::from_millis(5))
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let count = format!("SELECT count(*) AS n FROM {}", env.table("w5_applied"));
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let mut counting = env.conn().await?;
    let meter = cpu::Meter::start(&rig.cpu_db).await?;
    let started = Instant::now();
    let running = tokio::spawn(consumer.run(async {
        let _ = stopped.await;
    }));
    let deadline = started + RUN_TIMEOUT;
    loop {
        let n = diesel::sql_query(&count)
            .get_result::<Count>(&mut counting)
            .await?
            .n;
        if n as usize >= rig.events() || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let elapsed = started.elapsed();
    let cpu = meter.stop().await?;
    let _ = stop.send(());
    running.await??;
    let (missing, duplicates) = check_applied(env, rig).await?;
    let left = rig.declare_passive().await?.message_count() as usize;
    Ok(Apply {
        events: rig.events(),
        elapsed,
        missing,
        duplicates,
        left,
        cpu,
        startup: Duration::ZERO,
        phases: None,
        raw_phases: None,
    })
}

/// (events of the backlog without a `w5_applied` row, rows beyond one per
/// event).
async fn check_applied(env: &Env, rig: &Rig) -> Result<(usize, usize), BoxError> {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Uuid)]
        event_id: Uuid,
    }
    let rows: Vec<Row> =
        diesel::sql_query(format!("SELECT event_id FROM {}", env.table("w5_applied")))
            .load(&mut env.conn().await?)
            .await?;
    let applied: HashSet<Uuid> = rows.iter().map(|r| r.event_id).collect();
    Ok((
        rig.expected.difference(&applied).count(),
        rows.len() - applied.len() + applied.difference(&rig.expected).count(),
    ))
}

/// The broker ceiling: raw lapin consuming the backlog (its own
/// connection, opened inside the clock as the consumer's is), the same
/// prefetch, one channel (as the consumer), deliveries handed to
/// `concurrency` tasks by a hash of their aggregate (as the consumer's
/// workers get them) that each ack theirs one by one. No decoding, no
/// database.
pub(crate) async fn broker(env: &Env, rig: &Rig, concurrency: usize) -> Result<Apply, BoxError> {
    raw(env, rig, concurrency, false).await
}

/// Not a ceiling but the same work written by hand, to tell the library's
/// cost from the machine's: [`broker`]'s raw consumer where each task, on
/// a direct connection of its own (opened before the clock), commits the
/// database ceiling's transaction for the delivery (its message id and
/// JSON body) before acking it.
pub(crate) async fn hand_written(
    env: &Env,
    rig: &Rig,
    concurrency: usize,
) -> Result<Apply, BoxError> {
    raw(env, rig, concurrency, true).await
}

/// The worker of an aggregate, as the consumer picks it (a hash of its
/// type and id: outbox-lapin's `consumer/dispatch.rs`).
fn worker_for(aggregate_type: &str, aggregate_id: &str, workers: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    aggregate_type.hash(&mut hasher);
    aggregate_id.hash(&mut hasher);
    usize::try_from(hasher.finish() % workers.max(1) as u64).unwrap_or(0)
}

/// The worker of a delivery: [`worker_for`] its aggregate headers.
fn worker_of(delivery: &lapin::message::Delivery, workers: usize) -> usize {
    let header = |key: &str| {
        delivery
            .properties
            .headers()
            .as_ref()
            .and_then(|headers| wire::header_str(headers, key))
            .unwrap_or("")
    };
    worker_for(header("aggregate_type"), header("aggregate_id"), workers)
}

async fn raw(env: &Env, rig: &Rig, concurrency: usize, apply: bool) -> Result<Apply, BoxError> {
    rig.fill(env).await?;
    let mut conns = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        conns.push(if apply {
            Some(outbox::postgres::connect(&rig.db_url).await?)
        } else {
            None
        });
    }
    let meter = cpu::Meter::start(&rig.cpu_db).await?;
    let started = Instant::now();
    let connection =
        outbox_testkit::amqp::connect(&amqp_url(), &format!("{}.w5.raw", env.schema)).await;
    let channel = connection.create_channel().await?;
    channel
        .basic_qos(PREFETCH, BasicQosOptions::default())
        .await?;
    let mut consumer = channel
        .basic_consume(
            rig.queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let (acked_tx, mut acked_rx) = tokio::sync::mpsc::unbounded_channel::<Uuid>();
    let mut workers = Vec::with_capacity(concurrency);
    let mut queues = Vec::with_capacity(concurrency);
    let first = Arc::new(std::sync::OnceLock::<Instant>::new());
    // Waiting for a delivery, its transaction, its ack (ns, all tasks).
    let timers: Arc<[AtomicU64; 6]> = Arc::new(Default::default());
    for mut conn in conns {
        let timers = Arc::clone(&timers);
        let (tx, mut rx) =
            tokio::sync::mpsc::channel::<lapin::message::Delivery>(usize::from(PREFETCH));
        queues.push(tx);
        let acked = acked_tx.clone();
        let (inbox_sql, applied_sql) = (rig.inbox_sql.clone(), rig.applied_sql.clone());
        workers.push(tokio::spawn(async move {
            let [waiting, statements @ .., acking] = &*timers;
            loop {
                let phase = Instant::now();
                let Some(delivery) = rx.recv().await else {
                    break;
                };
                add(waiting, phase);
                let id = delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .and_then(|id| Uuid::parse_str(id.as_str()).ok())
                    .unwrap_or_default();
                if let Some(conn) = conn.as_mut() {
                    let order: Order = serde_json::from_slice(&delivery.data)?;
                    apply_by_hand(conn, &inbox_sql, &applied_sql, id, &order, Some(statements))
                        .await?;
                }
                let phase = Instant::now();
                delivery.acker.ack(BasicAckOptions::default()).await?;
                add(acking, phase);
                if acked.send(id).is_err() {
                    break;
                }
            }
            Ok::<(), BoxError>(())
        }));
    }
    drop(acked_tx);
    let first_delivery = Arc::clone(&first);
    let dispatch = tokio::spawn(async move {
        while let Some(Ok(delivery)) = consumer.next().await {
            first_delivery.get_or_init(Instant::now);
            let Some(queue) = queues.get(worker_of(&delivery, queues.len())) else {
                break;
            };
            if queue.send(delivery).await.is_err() {
                break;
            }
        }
    });
    let mut seen = HashSet::with_capacity(rig.events());
    let mut duplicates = 0;
    let deadline = tokio::time::Instant::now() + RUN_TIMEOUT;
    while seen.len() < rig.events() {
        match tokio::time::timeout_at(deadline, acked_rx.recv()).await {
            Ok(Some(id)) => {
                if !seen.insert(id) {
                    duplicates += 1;
                }
            }
            _ => break,
        }
    }
    let elapsed = started.elapsed();
    let cpu = meter.stop().await?;
    let _ = channel.close(200, "done".into()).await;
    dispatch.abort();
    for worker in workers {
        if let Ok(Err(err)) = worker.await {
            return Err(err);
        }
    }
    let _ = connection.close(200, "done".into()).await;
    let left = rig.declare_passive().await?.message_count() as usize;
    let (mut missing, mut applied_twice) = (rig.expected.difference(&seen).count(), 0);
    if apply {
        (missing, applied_twice) = check_applied(env, rig).await?;
    }
    Ok(Apply {
        events: rig.events(),
        elapsed,
        missing,
        duplicates: duplicates + applied_twice,
        left,
        cpu,
        startup: first
            .get()
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(started)),
        phases: None,
        raw_phases: Some(timers.each_ref().map(|t| {
            AtomicU64::load(t, Ordering::Relaxed) as f64 / 1e6 / rig.events().max(1) as f64
        })),
    })
}

/// The database ceiling: the backlog's events split over `concurrency`
/// writers (direct connections, opened before the clock), each committing
/// one transaction per event with the same two inserts as the consumer
/// (the library's inbox `INSERT` and the handler's, both prepared). No
/// broker. The queue is filled anyway (and purged by the next fill), so
/// each run starts from the same broker and table state.
pub(crate) async fn database(env: &Env, rig: &Rig, concurrency: usize) -> Result<Apply, BoxError> {
    rig.fill(env).await?;
    let mut conns = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        conns.push(outbox::postgres::connect(&rig.db_url).await?);
    }
    let work: Arc<Vec<(Uuid, Order)>> = Arc::new(
        rig.envelopes
            .iter()
            .map(|e| Ok((e.id, serde_json::from_str(&e.payload)?)))
            .collect::<Result<_, serde_json::Error>>()?,
    );
    let meter = cpu::Meter::start(&rig.cpu_db).await?;
    let started = Instant::now();
    let mut writers = Vec::with_capacity(concurrency);
    for (index, mut conn) in conns.into_iter().enumerate() {
        let work = Arc::clone(&work);
        let (inbox_sql, applied_sql) = (rig.inbox_sql.clone(), rig.applied_sql.clone());
        writers.push(tokio::spawn(async move {
            for (id, order) in work.iter().skip(index).step_by(concurrency) {
                apply_by_hand(&mut conn, &inbox_sql, &applied_sql, *id, order, None).await?;
            }
            // Open until the CPU is read: a backend that has exited is no
            // longer found by its name.
            Ok::<_, BoxError>(conn)
        }));
    }
    let mut done = Vec::with_capacity(concurrency);
    for writer in writers {
        done.push(writer.await??);
    }
    let elapsed = started.elapsed();
    let cpu = meter.stop().await?;
    drop(done);
    let (missing, duplicates) = check_applied(env, rig).await?;
    Ok(Apply {
        events: rig.events(),
        elapsed,
        missing,
        duplicates,
        left: 0,
        cpu,
        startup: Duration::ZERO,
        phases: None,
        raw_phases: None,
    })
}

/// One event's transaction in the database ceiling; with `timers`, its
/// phases are added to them as the consumer's are timed: `BEGIN`, the
/// inbox insert, the handler's insert, `COMMIT` (ns).
async fn apply_by_hand(
    conn: &mut AsyncPgConnection,
    inbox_sql: &str,
    applied_sql: &str,
    id: Uuid,
    order: &Order,
    timers: Option<&[AtomicU64]>,
) -> Result<(), BoxError> {
    let time = |phase: usize, since: Instant| {
        if let Some(timer) = timers.and_then(|t| t.get(phase)) {
            add(timer, since);
        }
        Instant::now()
    };
    let begun = Instant::now();
    let mut committing = begun;
    conn.transaction::<_, BoxError, _>(async |conn| {
        let inserting = time(0, begun);
        let inserted = Prepared(
            diesel::sql_query(inbox_sql)
                .bind::<Text, _>(CEILING_CONSUMER)
                .bind::<diesel::sql_types::Uuid, _>(id),
        )
        .execute(conn)
        .await?;
        let handling = time(1, inserting);
        if inserted == 1 {
            Prepared(
                diesel::sql_query(applied_sql)
                    .bind::<diesel::sql_types::Uuid, _>(id)
                    .bind::<Text, _>(order.order_id.as_str())
                    .bind::<BigInt, _>(order.total_cents),
            )
            .execute(conn)
            .await?;
        }
        committing = time(2, handling);
        Ok(())
    })
    .await?;
    time(3, committing);
    Ok(())
}

/// Drops the handler's table (the schema goes at the end of the run too;
/// this keeps later workloads' `VACUUM`s and checkpoints free of it).
pub(crate) async fn cleanup(env: &Env) {
    let mut conn = match env.conn().await {
        Ok(conn) => conn,
        Err(_) => return,
    };
    let _ = conn
        .batch_execute(&format!("DROP TABLE IF EXISTS {}", env.table("w5_applied")))
        .await;
}
