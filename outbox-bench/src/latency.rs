//! W3: commit-to-publish latency at a steady rate, by wakeup mode, against
//! the naive floor (commit, then publish inline with a confirm).

use std::time::Duration;

use diesel_async::AsyncConnection;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use outbox::postgres::{Outbox, PgOutboxStore};
use outbox::rabbitmq::{LapinPublisher, wire};
use outbox::{EventEnvelope, Relay, RelayHandle};
use uuid::Uuid;

use crate::setup::{BoxError, Env, OrderPlaced, now_ns, percentile};

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

fn event() -> OrderPlaced {
    OrderPlaced {
        order_id: Uuid::now_v7().to_string(),
        customer_id: Uuid::now_v7(),
        total_cents: 990,
        stamp_ns: 0,
    }
}

/// Records (and, for the floor, publishes) one event per tick for
/// `duration`; the stamp is taken inside the transaction, just before the
/// INSERT and COMMIT.
async fn produce(
    env: &Env,
    outbox: &Outbox,
    rate: u32,
    duration: Duration,
    relay: Option<&RelayHandle>,
    inline: Option<&lapin::Channel>,
) -> Result<usize, BoxError> {
    let mut conn = env.conn().await?;
    let mut ticker = tokio::time::interval(Duration::from_secs(1) / rate);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = tokio::time::Instant::now();
    let mut produced = 0;
    while started.elapsed() < duration {
        ticker.tick().await;
        let envelope = conn
            .transaction::<_, BoxError, _>(async |conn| {
                let mut e = event();
                e.stamp_ns = now_ns();
                let envelope = EventEnvelope::from_event(&e)?;
                outbox
                    .record_envelopes(conn, std::slice::from_ref(&envelope))
                    .await?;
                Ok(envelope)
            })
            .await?;
        if let Some(handle) = relay {
            handle.notify();
        }
        if let Some(channel) = inline {
            channel
                .basic_publish(
                    env.exchange.as_str().into(),
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
        produced += 1;
    }
    Ok(produced)
}

async fn measure(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(Uuid, i64, Vec<u8>)>,
    produced: usize,
) -> Result<Latency, BoxError> {
    let mut latencies = Vec::with_capacity(produced);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while latencies.len() < produced {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some((_, received, body))) => {
                let event: serde_json::Value = serde_json::from_slice(&body)?;
                let stamp = event["stamp_ns"].as_i64().unwrap_or(0);
                latencies.push((received - stamp) as f64 / 1e6);
            }
            _ => break,
        }
    }
    latencies.sort_by(f64::total_cmp);
    Ok(Latency {
        n: latencies.len(),
        p50: percentile(&latencies, 50.0),
        p99: percentile(&latencies, 99.0),
        max: latencies.last().copied().unwrap_or(f64::NAN),
    })
}

/// The relay's latency with `wakeup`.
pub(crate) async fn relay(
    env: &Env,
    wakeup: Wakeup,
    rate: u32,
    duration: Duration,
) -> Result<Latency, BoxError> {
    env.reset().await?;
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
    let mut rx = env.consume().await?;
    tokio::time::sleep(Duration::from_millis(300)).await; // LISTEN connected
    let outbox = Outbox::new(&env.schema)?.notify(wakeup == Wakeup::Notify);
    let in_process = (wakeup == Wakeup::InProcess).then_some(&handle);
    let produced = produce(env, &outbox, rate, duration, in_process, None).await?;
    let latency = measure(&mut rx, produced).await?;
    handle.shutdown();
    task.await?;
    Ok(latency)
}

/// The floor: commit, then publish inline and await the confirm (the naive
/// path the outbox replaces; it can only add to this).
pub(crate) async fn floor(env: &Env, rate: u32, duration: Duration) -> Result<Latency, BoxError> {
    env.reset().await?;
    let channel = env.amqp.create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let mut rx = env.consume().await?;
    let outbox = Outbox::new(&env.schema)?.notify(false);
    let produced = produce(env, &outbox, rate, duration, None, Some(&channel)).await?;
    measure(&mut rx, produced).await
}
