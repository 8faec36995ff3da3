//! W2: draining a committed backlog through the relay, against raw
//! publish-with-confirms of the same messages ([`raw`]), with
//! the CPU each drain cost ([`cpu`]).
//!
//! [`w2`] runs the whole workload for every back end; each back end gives
//! its relay drains through [`Relays`].
//!
//! How the figures are taken, so that ratios compare like with like on a
//! noisy shared machine:
//! 1. a first pass drains the backlog with each raw strategy in turns,
//!    three times each; the fastest median is the run's ceiling strategy;
//! 2. the ceiling strategy and the headline relay variants (ordered 1
//!    relay, unordered 1 relay, ordered 2 relays) then alternate, raw,
//!    relay, raw, relay, …, [`rounds`] drains of each relay variant, and the
//!    medians are compared: drift on the machine hits both sides alike. The
//!    ceiling is the median of those paired raw drains only (the first
//!    pass's winner is biased upwards: it won by being fast once);
//! 3. the stop-and-wait strategy (the bench's ceiling before) drains once
//!    per round too, and every relay row shows its ratio to it as a second
//!    column, so older figures stay comparable;
//! 4. the hot backlog (few aggregates, many events each, ordered) has its
//!    own ceiling, one sequential stream per aggregate, alternated with the
//!    hot relay drain;
//! 5. ordered 1 relay against a quorum queue, alternated with the ceiling
//!    strategy on the same quorum queue.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use outbox::DeliveryOrder;
use outbox::Relay;
use outbox::postgres::PgOutboxStore;
use outbox::rabbitmq::LapinPublisher;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::cpu::{self, Cpu};
use crate::raw::{self, Strategy};
use crate::setup::{self, BoxError, Bus, Env, OrderPlaced};

/// One drain: how long until a consumer had every event, and the CPU it
/// used.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Drain {
    pub(crate) events: usize,
    pub(crate) elapsed: Duration,
    pub(crate) missing: usize,
    pub(crate) duplicates: usize,
    pub(crate) cpu: Cpu,
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
        cpu: Cpu::default(),
    });
    median.missing = drains.iter().map(|d| d.missing).sum();
    median.duplicates = drains.iter().map(|d| d.duplicates).sum();
    median
}

/// How [`receive`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Received {
    /// Every expected id came.
    All,
    /// The deadline passed first.
    Deadline,
    /// Nothing came for the stall limit (a stalled relay), or the consumer
    /// stopped.
    Stalled,
}

/// The consumer's side of every drain: receives from `rx` until every id
/// of `pending` came (each removed as it comes, so what is left is
/// missing), `deadline` passed, or nothing came for `stall`. Calls
/// `on_event` with the count of expected ids received so far after each
/// one; returns how it ended and the duplicates (ids received again, or
/// not in the backlog).
pub(crate) async fn receive(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(Uuid, i64, Vec<u8>)>,
    pending: &mut HashSet<Uuid>,
    deadline: tokio::time::Instant,
    stall: Duration,
    mut on_event: impl FnMut(usize),
) -> (Received, usize) {
    let mut received = 0;
    let mut duplicates = 0;
    while !pending.is_empty() {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return (Received::Deadline, duplicates);
        }
        let wait = stall.min(deadline - now);
        match tokio::time::timeout(wait, rx.recv()).await {
            Ok(Some((id, _, _))) => {
                if pending.remove(&id) {
                    received += 1;
                    on_event(received);
                } else {
                    duplicates += 1;
                }
            }
            Err(_) if tokio::time::Instant::now() >= deadline => {
                return (Received::Deadline, duplicates);
            }
            _ => return (Received::Stalled, duplicates),
        }
    }
    (Received::All, duplicates)
}

/// Messages arriving within 200 ms after a drain: each is a duplicate.
pub(crate) async fn late_duplicates(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(Uuid, i64, Vec<u8>)>,
) -> usize {
    let mut duplicates = 0;
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
        duplicates += 1;
    }
    duplicates
}

/// A drain of `expected` clocked from `started` until the consumer had
/// them all (or 300 s passed), then watched 200 ms more for duplicates.
pub(crate) async fn receive_all(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<(Uuid, i64, Vec<u8>)>,
    mut expected: HashSet<Uuid>,
    started: Instant,
) -> Drain {
    let events = expected.len();
    let limit = Duration::from_secs(300);
    let deadline = tokio::time::Instant::now() + limit;
    let (_, mut duplicates) = receive(rx, &mut expected, deadline, limit, |_| {}).await;
    let elapsed = started.elapsed();
    duplicates += late_duplicates(rx).await;
    Drain {
        events,
        elapsed,
        missing: expected.len(),
        duplicates,
        cpu: Cpu::default(),
    }
}

/// The relay (outbox-diesel store + LapinPublisher) draining `events` to
/// `bus` (the run's own or the quorum one).
pub(crate) async fn relay(
    env: &Env,
    bus: &Bus,
    events: &[OrderPlaced],
    order: DeliveryOrder,
    relays: usize,
    batch_size: usize,
    keep_sent: bool,
) -> Result<Drain, BoxError> {
    env.reset().await?;
    bus.purge().await?;
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
    let mut rx = bus.consume().await?;
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
            .exchange(&bus.exchange)
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
    let meter = cpu::Meter::start(&env.cpu_db()).await?;
    let started = Instant::now();
    for relay in relays_built {
        tasks.push(tokio::spawn(relay.run()));
    }
    let mut drain = receive_all(&mut rx, expected, started).await;
    drain.cpu = meter.stop().await?;
    for handle in &handles {
        handle.shutdown();
    }
    for task in tasks {
        task.await?;
    }
    Ok(drain)
}

/// A back end's relay drains, for [`w2`].
pub(crate) trait Relays {
    /// The run's exchange and queue.
    fn bus(&self) -> &Bus;

    /// Where the back end's database spends its CPU.
    fn cpu_db(&self) -> cpu::Db;

    /// The relay draining `events` into `bus` (the run's own, or the quorum
    /// one): `relays` relays, batches of `batch_size`, sent rows kept or
    /// deleted; the CPU measured as [`cpu`] says.
    async fn drain(
        &self,
        bus: &Bus,
        events: &[OrderPlaced],
        order: DeliveryOrder,
        relays: usize,
        batch_size: usize,
        keep_sent: bool,
    ) -> Result<Drain, BoxError>;
}

impl Relays for Env {
    fn bus(&self) -> &Bus {
        self
    }

    fn cpu_db(&self) -> cpu::Db {
        Env::cpu_db(self)
    }

    async fn drain(
        &self,
        bus: &Bus,
        events: &[OrderPlaced],
        order: DeliveryOrder,
        relays: usize,
        batch_size: usize,
        keep_sent: bool,
    ) -> Result<Drain, BoxError> {
        relay(self, bus, events, order, relays, batch_size, keep_sent).await
    }
}

/// Paired drains per headline relay variant: 5, or 2 with `--quick`.
pub(crate) fn rounds() -> usize {
    if std::env::args().any(|a| a == "--quick") {
        2
    } else {
        5
    }
}

/// Drains of each raw strategy in the first pass that chooses the best: 3,
/// or 2 with `--quick`.
fn first_rounds() -> usize {
    if std::env::args().any(|a| a == "--quick") {
        2
    } else {
        3
    }
}

/// Paired drains of the hot backlog and of the quorum queue: 3, or 1 with
/// `--quick` (each drain is long, and they are not the headline).
fn side_rounds() -> usize {
    if std::env::args().any(|a| a == "--quick") {
        1
    } else {
        3
    }
}

/// A relay variant: its label, its key in the JSON, delivery order,
/// relays and whether sent rows are kept.
type Variant = (&'static str, &'static str, DeliveryOrder, usize, bool);

/// The headline variants, alternated with the ceiling.
const HEADLINE: [Variant; 3] = [
    (
        "relay, ordered, 1 relay",
        "ordered_1",
        DeliveryOrder::PerAggregate,
        1,
        true,
    ),
    (
        "relay, unordered, 1 relay",
        "unordered_1",
        DeliveryOrder::Unordered,
        1,
        true,
    ),
    (
        "relay, ordered, 2 relays",
        "ordered_2",
        DeliveryOrder::PerAggregate,
        2,
        true,
    ),
];

/// The variants drained once each after the headline ones.
const OTHERS: [Variant; 2] = [
    (
        "relay, unordered, 2 relays",
        "unordered_2",
        DeliveryOrder::Unordered,
        2,
        true,
    ),
    (
        "relay, ordered, 1 relay, delete on publish",
        "ordered_1_delete",
        DeliveryOrder::PerAggregate,
        1,
        false,
    ),
];

/// W2 on a back end: prints its table and fills `w2` (the JSON). `spread`
/// and `hot` are (aggregates, events per aggregate); `name` is the back end
/// in the heading (`None` for PostgreSQL, whose heading is unchanged).
pub(crate) async fn w2<R: Relays>(
    r: &R,
    name: Option<&str>,
    spread: (usize, usize),
    hot: (usize, usize),
    w2: &mut serde_json::Map<String, Value>,
) -> Result<(), BoxError> {
    let rounds = rounds();
    let side = side_rounds();
    let (aggs, per) = spread;
    let spread = setup::interleaved(aggs, per);
    let hot_events = setup::interleaved(hot.0, hot.1);
    let db = r.cpu_db();
    let on = name.map(|n| format!(" on {n}")).unwrap_or_default();
    println!(
        "\nW2 drain{on}: {} events ({aggs} aggregates x {per}), relay batch 100",
        spread.len()
    );
    println!(
        "  CPU µs/event: \"proc\" = this process (relay or raw publisher, and the consumer; \
         /proc/self/stat); \"db\" = {}",
        db.describe()
    );
    header();

    // 1. A first pass of every raw strategy, in turns; the fastest median
    // is the ceiling's strategy.
    let mut first_drains: Vec<Vec<Drain>> = raw::SPREAD.iter().map(|_| Vec::new()).collect();
    for _ in 0..first_rounds() {
        for (n, strategy) in raw::SPREAD.into_iter().enumerate() {
            first_drains[n].push(raw::drain(r.bus(), &spread, strategy).await?);
        }
    }
    let first: Vec<(Strategy, Drain, usize)> = raw::SPREAD
        .into_iter()
        .zip(&first_drains)
        .map(|(s, drains)| (s, median(drains), drains.len()))
        .collect();
    let best = first
        .iter()
        .max_by(|a, b| a.1.rate().total_cmp(&b.1.rate()))
        .map_or(raw::STOP_AND_WAIT, |(s, ..)| *s);

    // 2. and 3. The ceiling alternated with each headline variant; one
    // stop-and-wait drain per round.
    let mut ceiling_drains = Vec::new();
    let mut stop_and_wait: Vec<Drain> = raw::SPREAD
        .iter()
        .position(|s| *s == raw::STOP_AND_WAIT)
        .map(|n| first_drains[n].clone())
        .unwrap_or_default();
    let mut relay_drains: Vec<Vec<Drain>> = HEADLINE.iter().map(|_| Vec::new()).collect();
    for _ in 0..rounds {
        for (n, &(_, _, order, relays, keep_sent)) in HEADLINE.iter().enumerate() {
            ceiling_drains.push(raw::drain(r.bus(), &spread, best).await?);
            relay_drains[n].push(
                r.drain(r.bus(), &spread, order, relays, 100, keep_sent)
                    .await?,
            );
        }
        if best != raw::STOP_AND_WAIT {
            stop_and_wait.push(raw::drain(r.bus(), &spread, raw::STOP_AND_WAIT).await?);
        }
    }
    if best == raw::STOP_AND_WAIT {
        stop_and_wait.extend(ceiling_drains.iter().copied());
    }
    let ceiling = median(&ceiling_drains);
    let saw = median(&stop_and_wait);
    let columns = Columns {
        best: ceiling.rate(),
        stop_and_wait: saw.rate(),
    };

    let mut strategies = serde_json::Map::new();
    let mut overtaken = Vec::new();
    for (strategy, d, n) in &first {
        let (d, drains, label) = if *strategy == best {
            (
                ceiling,
                ceiling_drains.len(),
                format!("{} (best)", strategy.label()),
            )
        } else if *strategy == raw::STOP_AND_WAIT {
            (saw, stop_and_wait.len(), strategy.label())
        } else {
            (*d, *n, strategy.label())
        };
        if *strategy != best && d.rate() > ceiling.rate() {
            overtaken.push(strategy.label());
        }
        strategies.insert(strategy.key(), row(&label, &d, drains, columns));
    }
    w2.insert("raw_per_s".into(), json!(saw.rate()));
    w2.insert("raw_best_per_s".into(), json!(ceiling.rate()));
    w2.insert("raw_best".into(), json!(best.key()));
    w2.insert("raw_strategies".into(), Value::Object(strategies));
    w2.insert("cpu_db_measured".into(), json!(db.describe()));

    for (n, (label, key, ..)) in HEADLINE.iter().enumerate() {
        let d = median(&relay_drains[n]);
        w2.insert(
            (*key).into(),
            row(label, &d, relay_drains[n].len(), columns),
        );
    }
    for (label, key, order, relays, keep_sent) in OTHERS {
        let d = r
            .drain(r.bus(), &spread, order, relays, 100, keep_sent)
            .await?;
        w2.insert(key.into(), row(label, &d, 1, columns));
    }
    println!(
        "  the best strategy: fastest median of a first pass of {} drains each, in turns; the \
         ceiling: median of its {} drains alternated with the relay (the other strategies: \
         their first pass; stop-and-wait: also one drain per round); headline relay rows: median \
         of {rounds} each",
        first_rounds(),
        ceiling_drains.len()
    );
    if !overtaken.is_empty() {
        println!(
            "  note: faster than the ceiling's paired median here: {} (the machine drifted, \
             or the first pass chose on noise: the ceiling may be understated)",
            overtaken.join("; ")
        );
    }
    println!(
        "  targets: ordered 1 relay >= 0.75 of the best raw, unordered >= 0.85, ordered 2 relays \
         >= 0.8; no missing, no duplicates"
    );

    // 4. The hot backlog against sequential streams, alternated.
    println!(
        "\n  hot backlog: {} events ({} aggregates x {}, ordered); its ceiling is raw publishing of \
         {} sequential streams (each waits for its confirm before its next message); \"vs best\" is \
         against that, \"vs s&w\" against the stop-and-wait figure above",
        hot_events.len(),
        hot.0,
        hot.1,
        hot.0
    );
    let mut streams = Vec::new();
    let mut hot_relay = Vec::new();
    for _ in 0..side {
        streams.push(raw::drain(r.bus(), &hot_events, Strategy::Streams).await?);
        hot_relay.push(
            r.drain(
                r.bus(),
                &hot_events,
                DeliveryOrder::PerAggregate,
                1,
                100,
                true,
            )
            .await?,
        );
    }
    let streams = median(&streams);
    let hot_columns = Columns {
        best: streams.rate(),
        stop_and_wait: saw.rate(),
    };
    let streams_row = row(
        &format!("raw: {} sequential streams (hot ceiling)", hot.0),
        &streams,
        side,
        hot_columns,
    );
    w2.insert("hot_raw_streams".into(), streams_row);
    w2.insert("hot_raw_streams_per_s".into(), json!(streams.rate()));
    w2.insert(
        "hot_ordered_1".into(),
        row(
            &format!("hot: relay, ordered, 1 relay ({} aggregates)", hot.0),
            &median(&hot_relay),
            side,
            hot_columns,
        ),
    );
    println!("  target: hot relay >= 0.8 of its ceiling");

    // 5. A quorum queue: its own exchange and queue, deleted when dropped.
    let quorum = Bus::quorum(&outbox_testkit::names::unique("bench", "quorum")).await;
    println!(
        "\n  quorum queue (x-queue-type=quorum): ordered 1 relay against the best strategy above \
         on the same quorum queue, alternated; \"vs s&w\" is against the classic queue's"
    );
    let mut quorum_raw = Vec::new();
    let mut quorum_relay = Vec::new();
    for _ in 0..side {
        quorum_raw.push(raw::drain(&quorum, &spread, best).await?);
        quorum_relay.push(
            r.drain(&quorum, &spread, DeliveryOrder::PerAggregate, 1, 100, true)
                .await?,
        );
    }
    let quorum_raw = median(&quorum_raw);
    let quorum_columns = Columns {
        best: quorum_raw.rate(),
        stop_and_wait: saw.rate(),
    };
    let quorum_raw_row = row(
        &format!("quorum {}", best.label()),
        &quorum_raw,
        side,
        quorum_columns,
    );
    let quorum_relay_row = row(
        "quorum: relay, ordered, 1 relay",
        &median(&quorum_relay),
        side,
        quorum_columns,
    );
    w2.insert(
        "quorum".into(),
        json!({
            "raw_best_per_s": quorum_raw.rate(),
            "raw_best": best.key(),
            "raw": quorum_raw_row,
            "ordered_1": quorum_relay_row,
        }),
    );
    Ok(())
}

/// The two ceilings every row is compared with.
#[derive(Debug, Clone, Copy)]
struct Columns {
    best: f64,
    stop_and_wait: f64,
}

fn header() {
    println!(
        "  {:<46} {:>9} {:>7} {:>7} {:>7} {:>7} {:>4} {:>6} {:>6} {:>6}",
        "", "events/s", "time", "vs best", "vs s&w", "missing", "dup", "drains", "proc", "db"
    );
}

/// Prints one W2 row (`drains` drains, `d` their median) against the
/// ceilings and returns its JSON.
fn row(label: &str, d: &Drain, drains: usize, c: Columns) -> Value {
    let (process, db) = d.cpu.per_event_us(d.events);
    let db_text = db.map_or_else(|| "-".to_owned(), |db| format!("{db:.0}"));
    println!(
        "  {:<46} {:>9.0} {:>7} {:>7.2} {:>7.2} {:>7} {:>4} {:>6} {:>6.0} {:>6}",
        label,
        d.rate(),
        setup::secs(d.elapsed),
        d.rate() / c.best,
        d.rate() / c.stop_and_wait,
        d.missing,
        d.duplicates,
        drains,
        process,
        db_text
    );
    json!({
        "per_s": d.rate(),
        "ratio": d.rate() / c.best,
        "ratio_stop_and_wait": d.rate() / c.stop_and_wait,
        "missing": d.missing,
        "duplicates": d.duplicates,
        "drains": drains,
        "cpu_us_per_event": {"process": process, "db": db},
    })
}
