//! W3: commit-to-receipt latency at a steady rate, by wakeup mode, against
//! the naive floor (commit, then publish inline with a confirm).
//!
//! Each transaction writes one row: the outbox event (relay modes) or a
//! `bench_orders` row (the floor, which has no outbox). The clock starts
//! just before `COMMIT` (after the row is written) and stops when the
//! consumer, in this process, receives the message; stamps are kept in
//! memory by message id. The floor and the in-process relay run interleaved,
//! one second each in turn, so both see the same machine.

use std::collections::HashMap;
use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use outbox::postgres::{Outbox, PgOutboxStore};
use outbox::rabbitmq::{LapinPublisher, wire};
use outbox::{EventEnvelope, Relay, RelayHandle};
use uuid::Uuid;

use crate::setup::{BoxError, Env, OrderPlaced, Prepared, now_ns, percentile};

/// How the relay learns about new events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wakeup {
    /// `RelayHandle::notify()` after each commit (what the Axum layer does).
    InProcess,
    /// PostgreSQL `NOTIFY` → the store's `LISTEN` connection.
    Notify,
    /// Neither: the relay's default 1 s poll.
    Polling,
}

impl Wakeup {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Wakeup::InProcess => "in-process wakeup",
            Wakeup::Notify => "NOTIFY only",
            Wakeup::Polling => "polling only (1 s)",
        }
    }
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Latency {
    pub(crate) n: usize,
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
}

/// What one tick's transaction does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Mode {
    /// Record the event in the outbox; the relay publishes it.
    Outbox,
    /// Insert the order row, commit, publish inline and await the confirm.
    Floor,
}

fn event() -> OrderPlaced {
    OrderPlaced {
        order_id: Uuid::now_v7().to_string(),
        customer_id: Uuid::now_v7(),
        total_cents: 990,
    }
}

/// What a producer needs to write and publish.
struct Producer<'a> {
    env: &'a Env,
    outbox: Outbox,
    orders_sql: String,
    relay: Option<&'a RelayHandle>,
    inline: Option<lapin::Channel>,
}

impl Producer<'_> {
    /// One transaction of `mode`; returns its event id and the stamp taken
    /// just before `COMMIT`.
    async fn tick(
        &self,
        conn: &mut AsyncPgConnection,
        mode: Mode,
    ) -> Result<(Uuid, i64), BoxError> {
        let e = event();
        let envelope = EventEnvelope::from_event(&e)?;
        let stamp = conn
            .transaction::<_, BoxError, _>(async |conn| {
                match mode {
                    Mode::Outbox => {
                        self.outbox
                            .record_envelopes(conn, std::slice::from_ref(&envelope))
                            .await?;
                    }
                    Mode::Floor => {
                        Prepared(
                            diesel::sql_query(&self.orders_sql)
                                .bind::<diesel::sql_types::Uuid, _>(Uuid::parse_str(&e.order_id)?)
                                .bind::<diesel::sql_types::Uuid, _>(e.customer_id)
                                .bind::<diesel::sql_types::BigInt, _>(e.total_cents),
                        )
                        .execute(conn)
                        .await?;
                    }
                }
                Ok(now_ns())
            })
            .await?;
        match mode {
            Mode::Outbox => {
                if let Some(handle) = self.relay {
                    handle.notify();
                }
            }
            Mode::Floor => {
                let channel = self.inline.as_ref().ok_or("the floor needs a channel")?;
                channel
                    .basic_publish(
                        self.env.exchange.as_str().into(),
                        envelope.event_type.as_str().into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..Default::default()
                        },
                        envelope.payload.as_bytes(),
                        wire::properties(&envelope, "/bench"),
                    )
                    .await?
                    .await?;
            }
        }
        Ok((envelope.id, stamp))
    }

    /// One transaction per tick at `rate` for `duration`, of the mode
    /// `mode_at(time since start)` gives.
    async fn run(
        &self,
        rate: u32,
        duration: Duration,
        mode_at: impl Fn(Duration) -> Mode,
    ) -> Result<HashMap<Uuid, (i64, Mode)>, BoxError> {
        let mut conn = self.env.conn().await?;
        let mut ticker = tokio::time::interval(Duration::from_secs(1) / rate);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let started = tokio::time::Instant::now();
        let mut stamps = HashMap::new();
        while started.elapsed() < duration {
            ticker.tick().await;
            let mode = mode_at(started.elapsed());
            let (id, stamp) = self.tick(&mut conn, mode).await?;
            stamps.insert(id, (stamp, mode));
        }
        Ok(stamps)
    }

    async fn new<'a>(
        env: &'a Env,
        notify: bool,
        relay: Option<&'a RelayHandle>,
        floor: bool,
    ) -> Result<Producer<'a>, BoxError> {
        let inline = if floor {
            let channel = env.amqp().create_channel().await?;
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await?;
            Some(channel)
        } else {
            None
        };
        Ok(Producer {
            env,
            outbox: Outbox::new(&env.schema)?.notify(notify),
            orders_sql: format!(
                "INSERT INTO {} (id, customer_id, total_cents) VALUES ($1, $2, $3)",
                env.table("bench_orders")
            ),
            relay,
            inline,
        })
    }
}

/// Receives until every stamped message is in (or 10 s pass); the latencies
/// of each mode.
pub(crate) async fn measure(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(Uuid, i64, Vec<u8>)>,
    stamps: &HashMap<Uuid, (i64, Mode)>,
) -> HashMap<Mode, Latency> {
    let mut latencies: HashMap<Mode, Vec<f64>> = HashMap::new();
    let mut received = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while received < stamps.len() {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some((id, at, _))) => {
                if let Some((stamp, mode)) = stamps.get(&id) {
                    received += 1;
                    latencies
                        .entry(*mode)
                        .or_default()
                        .push((at - stamp) as f64 / 1e6);
                }
            }
            _ => break,
        }
    }
    latencies
        .into_iter()
        .map(|(mode, mut l)| {
            l.sort_by(f64::total_cmp);
            let latency = Latency {
                n: l.len(),
                p50: percentile(&l, 50.0),
                p99: percentile(&l, 99.0),
                max: l.last().copied().unwrap_or(f64::NAN),
            };
            (mode, latency)
        })
        .collect()
}

/// Starts a relay on the bench outbox with `wakeup`.
async fn start_relay(
    env: &Env,
    wakeup: Wakeup,
) -> Result<(RelayHandle, tokio::task::JoinHandle<()>), BoxError> {
    let mut store = PgOutboxStore::builder(env.pool.clone()).schema(&env.schema);
    if wakeup == Wakeup::Notify {
        store = store.listen(crate::setup::database_url());
    }
    let publisher = LapinPublisher::builder(crate::setup::amqp_url())
        .exchange(&env.exchange)
        .declare_exchange(false)
        .connection_name(format!("{}.latency", env.schema))
        .build()?;
    publisher.connect().await?;
    let relay = Relay::builder(store.build()?, publisher).build()?;
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    Ok((handle, task))
}

/// When messages did not arrive, says where the relay's ones are: still in
/// the outbox (not published) or marked sent (published, then lost on the
/// way to the consumer).
async fn report_unsent(
    env: &Env,
    run: &str,
    stamps: &HashMap<Uuid, (i64, Mode)>,
    latency: &HashMap<Mode, Latency>,
) -> Result<(), BoxError> {
    let received: usize = latency.values().map(|l| l.n).sum();
    if received == stamps.len() {
        return Ok(());
    }
    #[derive(diesel::QueryableByName)]
    struct Status {
        #[diesel(sql_type = diesel::sql_types::Text)]
        status: String,
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let statuses: Vec<Status> = diesel::sql_query(format!(
        "SELECT status, count(*) AS n FROM {} GROUP BY status ORDER BY status",
        env.table("outbox_events")
    ))
    .load(&mut env.conn().await?)
    .await?;
    let statuses: Vec<String> = statuses
        .iter()
        .map(|s| format!("{} {}", s.n, s.status))
        .collect();
    println!(
        "  ({run}: {} of {} messages not received within 10 s; outbox rows: {})",
        stamps.len() - received,
        stamps.len(),
        statuses.join(", ")
    );
    Ok(())
}

fn of(latency: &HashMap<Mode, Latency>, mode: Mode) -> Result<Latency, BoxError> {
    latency
        .get(&mode)
        .copied()
        .ok_or_else(|| format!("W3: no message of mode {mode:?} was received").into())
}

/// The relay's latency with `wakeup` alone (each tick records an event).
pub(crate) async fn relay(
    env: &Env,
    wakeup: Wakeup,
    rate: u32,
    duration: Duration,
) -> Result<Latency, BoxError> {
    env.reset().await?;
    let (handle, task) = start_relay(env, wakeup).await?;
    let mut rx = env.consume().await?;
    tokio::time::sleep(Duration::from_millis(300)).await; // LISTEN connected
    let in_process = (wakeup == Wakeup::InProcess).then_some(&handle);
    let producer = Producer::new(env, wakeup == Wakeup::Notify, in_process, false).await?;
    let stamps = producer.run(rate, duration, |_| Mode::Outbox).await?;
    let latency = measure(&mut rx, &stamps).await;
    report_unsent(env, wakeup.name(), &stamps, &latency).await?;
    handle.shutdown();
    task.await?;
    of(&latency, Mode::Outbox)
}

/// The floor (commit, then publish inline and await the confirm: the naive
/// path the outbox replaces) and the relay with in-process wakeups,
/// alternating every second for `2 × duration` in all: (floor, relay).
pub(crate) async fn floor_and_in_process(
    env: &Env,
    rate: u32,
    duration: Duration,
) -> Result<(Latency, Latency), BoxError> {
    env.reset().await?;
    let (handle, task) = start_relay(env, Wakeup::InProcess).await?;
    let mut rx = env.consume().await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let producer = Producer::new(env, false, Some(&handle), true).await?;
    let stamps = producer
        .run(rate, duration * 2, |elapsed| {
            if elapsed.as_secs() % 2 == 0 {
                Mode::Floor
            } else {
                Mode::Outbox
            }
        })
        .await?;
    let latency = measure(&mut rx, &stamps).await;
    report_unsent(env, "floor and in-process", &stamps, &latency).await?;
    handle.shutdown();
    task.await?;
    Ok((of(&latency, Mode::Floor)?, of(&latency, Mode::Outbox)?))
}
