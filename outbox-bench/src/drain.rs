//! W2: draining a committed backlog through the relay, against raw
//! publish-with-confirms of the same messages.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use outbox::postgres::PgOutboxStore;
use outbox::rabbitmq::{LapinPublisher, wire};
use outbox::{DeliveryOrder, EventEnvelope, Relay};
use uuid::Uuid;

use crate::setup::{self, BoxError, Bus, Env, OrderPlaced};

/// One drain: how long until a consumer had every event.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Drain {
    pub(crate) events: usize,
    pub(crate) elapsed: Duration,
    pub(crate) missing: usize,
    pub(crate) duplicates: usize,
}

impl Drain {
    pub(crate) fn rate(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64()
    }
}

/// The drain of median rate among `drains`; missing and duplicated events
/// are those of all of them, so none is hidden.
pub(crate) fn median(drains: &[Drain]) -> Drain {
    let mut sorted = drains.to_vec();
    sorted.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
    let mut median = sorted.get(sorted.len() / 2).copied().unwrap_or(Drain {
        events: 0,
        elapsed: Duration::ZERO,
        missing: 0,
        duplicates: 0,
    });
    median.missing = drains.iter().map(|d| d.missing).sum();
    median.duplicates = drains.iter().map(|d| d.duplicates).sum();
    median
}

pub(crate) async fn receive_all(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(Uuid, i64, Vec<u8>)>,
    expected: &HashSet<Uuid>,
    started: Instant,
) -> Drain {
    let mut seen = HashSet::with_capacity(expected.len());
    let mut duplicates = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    while seen.len() < expected.len() {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some((id, _, _))) => {
                if !seen.insert(id) {
                    duplicates += 1;
                }
            }
            _ => break,
        }
    }
    let elapsed = started.elapsed();
    // Anything arriving shortly after is a duplicate.
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
        duplicates += 1;
    }
    Drain {
        events: expected.len(),
        elapsed,
        missing: expected.difference(&seen).count(),
        duplicates,
    }
}

/// The relay (outbox-diesel store + LapinPublisher) draining `events`.
pub(crate) async fn relay(
    env: &Env,
    events: &[OrderPlaced],
    order: DeliveryOrder,
    relays: usize,
    batch_size: usize,
    keep_sent: bool,
) -> Result<Drain, BoxError> {
    env.reset().await?;
    env.backlog(events).await?;
    #[derive(diesel::QueryableByName)]
    struct Id {
        #[diesel(sql_type = diesel::sql_types::Uuid)]
        id: Uuid,
    }
    use diesel_async::RunQueryDsl;
    let expected: HashSet<Uuid> =
        diesel::sql_query(format!("SELECT id FROM {}", env.table("outbox_events")))
            .load::<Id>(&mut env.conn().await?)
            .await?
            .into_iter()
            .map(|r| r.id)
            .collect();
    let mut rx = env.consume().await?;
    let mut handles = Vec::new();
    let mut tasks = Vec::new();
    let mut relays_built = Vec::new();
    for n in 0..relays {
        let store = PgOutboxStore::builder(env.pool.clone())
            .schema(&env.schema)
            .keep_sent(keep_sent)
            .build()?;
        store.set_delivery_order(order).await?;
        let publisher = LapinPublisher::builder(crate::setup::amqp_url())
            .exchange(&env.exchange)
            .declare_exchange(false)
            .connection_name(format!("{}.relay{n}", env.schema))
            .build()?;
        publisher.connect().await?;
        let relay = Relay::builder(store, publisher)
            .batch_size(batch_size)
            .poll_interval(Duration::from_millis(100))
            .build()?;
        handles.push(relay.handle());
        relays_built.push(relay);
    }
    let started = Instant::now();
    for relay in relays_built {
        tasks.push(tokio::spawn(relay.run()));
    }
    let drain = receive_all(&mut rx, &expected, started).await;
    for handle in &handles {
        handle.shutdown();
    }
    for task in tasks {
        task.await?;
    }
    Ok(drain)
}

/// The ceiling: the same messages published with raw lapin on one
/// confirm-mode channel, `batch_size` pipelined then all confirms awaited.
/// Only the queue is emptied first: the ceiling touches no database, so it
/// is the same for every back end.
pub(crate) async fn raw(
    env: &Bus,
    events: &[OrderPlaced],
    batch_size: usize,
) -> Result<Drain, BoxError> {
    env.purge().await?;
    let envelopes: Vec<EventEnvelope> = events
        .iter()
        .map(EventEnvelope::from_event)
        .collect::<Result<_, _>>()?;
    let expected: HashSet<Uuid> = envelopes.iter().map(|e| e.id).collect();
    let mut rx = env.consume().await?;
    let channel = env.amqp().create_channel().await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let started = Instant::now();
    for chunk in envelopes.chunks(batch_size) {
        let mut confirms = Vec::with_capacity(chunk.len());
        for envelope in chunk {
            confirms.push(
                channel
                    .basic_publish(
                        env.exchange.as_str().into(),
                        envelope.event_type.as_str().into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..Default::default()
                        },
                        envelope.payload.as_bytes(),
                        wire::properties(envelope, "/bench"),
                    )
                    .await?,
            );
        }
        for confirm in confirms {
            confirm.await?;
        }
    }
    Ok(receive_all(&mut rx, &expected, started).await)
}

/// A W2 relay variant after the headline one: its label, its key in the
/// JSON, its backlog, delivery order, relays and whether sent rows are kept.
pub(crate) type Variant<'a> = (
    &'static str,
    &'static str,
    &'a [OrderPlaced],
    DeliveryOrder,
    usize,
    bool,
);

/// The W2 relay variants every back end runs after the ordered single
/// relay, on the `spread` and `hot` backlogs.
pub(crate) fn variants<'a>(spread: &'a [OrderPlaced], hot: &'a [OrderPlaced]) -> [Variant<'a>; 5] {
    [
        (
            "relay, unordered, 1 relay",
            "unordered_1",
            spread,
            DeliveryOrder::Unordered,
            1,
            true,
        ),
        (
            "relay, ordered, 2 relays",
            "ordered_2",
            spread,
            DeliveryOrder::PerAggregate,
            2,
            true,
        ),
        (
            "relay, unordered, 2 relays",
            "unordered_2",
            spread,
            DeliveryOrder::Unordered,
            2,
            true,
        ),
        (
            "relay, ordered, 1 relay, delete on publish",
            "ordered_1_delete",
            spread,
            DeliveryOrder::PerAggregate,
            1,
            false,
        ),
        (
            "hot: relay, ordered, 1 relay (20 aggregates)",
            "hot_ordered_1",
            hot,
            DeliveryOrder::PerAggregate,
            1,
            true,
        ),
    ]
}

/// Prints one W2 row against `ceiling` and records it under `key` in `w2`
/// (the raw ceiling itself is recorded by its caller as `raw_per_s`).
pub(crate) fn report(
    w2: &mut serde_json::Map<String, serde_json::Value>,
    name: &str,
    key: Option<&str>,
    d: &Drain,
    ceiling: f64,
) {
    println!(
        "  {:<42} {:>10.0} {:>8} {:>8.2} {:>8} {:>6}",
        name,
        d.rate(),
        setup::secs(d.elapsed),
        d.rate() / ceiling,
        d.missing,
        d.duplicates
    );
    if let Some(key) = key {
        w2.insert(
            key.into(),
            serde_json::json!({"per_s": d.rate(), "ratio": d.rate() / ceiling, "missing": d.missing, "duplicates": d.duplicates}),
        );
    }
}
