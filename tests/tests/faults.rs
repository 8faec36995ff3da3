//! The fault-injection suite: producers commit events (and roll some back)
//! while relays crash, the broker and the database go away, and the
//! consumer is slow and fails; at the end of each scenario
//! [`Scenario::verify`] checks that every committed event was delivered, no
//! rolled-back one ever was, per-aggregate order held for first deliveries,
//! the inbox applied each event exactly once and no unsent row is left, and
//! prints one `FAULT SUMMARY` line (run with `--nocapture` to see them).
//!
//! Scenarios that stop or restart a server get a private instance of it
//! ([`PrivateRabbit`], [`PrivatePostgres`]); the others use the shared
//! servers with their own schema, exchange and queues, so the suite runs in
//! parallel with every other test. The `pg_failover` scenarios run on a
//! private primary and streaming standby ([`ReplicatedPostgres`]), fail
//! over from one to the other and print a `FAULT LOSS` line after the
//! summary: with a synchronous standby nothing committed may be lost, with
//! an asynchronous one the commits it had not received are gone and
//! counted (docs/clusters.md, "PostgreSQL failover").
//!
//! The relay-crash scenarios (failpoints, random kills, several relays with
//! random kills) run on each back end: on PostgreSQL, and as `…_on_mariadb`
//! (a database of the test's own on the shared MariaDB, dropped at the end)
//! and `…_on_sqlite` (a database file of the test's own under
//! `CARGO_TARGET_TMPDIR`, removed at the end), with the same producers (3,
//! or 4 for the several-relays scenario, one transaction of 1–3 events
//! every 10 ms each), the same kills and the same verification; the event
//! counts are not scaled. Measured here (debug build): on MariaDB 550–1,100
//! committed events per scenario, 10–20 s each; on SQLite 800–3,000, 15–50
//! s each. On SQLite a SIGKILLed relay's claim is a lease that runs out
//! after the relay's claim timeout (10 s), and until then the aggregates it
//! had leased wait (per-aggregate order): the failpoint scenario's drain
//! after its last kill is about 25 s there (5 s on PostgreSQL and MariaDB,
//! whose claims are rolled back when the connection drops). One relay per
//! database file is enough on SQLite (one writer at a time), so the
//! several-relays scenario runs there with ONE relay:
//! `one_relay_with_random_kills_keeps_per_aggregate_order_on_sqlite`, whose
//! summary line's scenario is `one_relay_random_kills_on_sqlite`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use outbox_tests::{
    Backend, HandlerFaults, Inbox, PrivatePostgres, PrivateRabbit, ProducerConfig, Producers,
    RelayProcess, Scenario, Servers, Summary, Tap, commit_burst, connect_amqp, connect_db,
};
use outbox_tests::{ReplicatedPostgres, Replication};
use uuid::Uuid;

/// The relay binary of this package.
const RELAY: &str = env!("CARGO_BIN_EXE_outbox-fault-relay");
/// How long a scenario may take to drain after its last fault.
const DRAIN: Duration = Duration::from_secs(120);

/// A seeded generator for kill times and victims (the seed is printed, so
/// a failing run can be replayed with `FAULT_SEED`).
struct Rng(fastrand::Rng);

impl Rng {
    fn new(test: &str) -> Rng {
        let seed = std::env::var("FAULT_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        println!("{test}: FAULT_SEED={seed}");
        Rng(fastrand::Rng::with_seed(seed))
    }

    fn millis(&mut self, min: u64, max: u64) -> Duration {
        Duration::from_millis(self.0.u64(min..max))
    }

    fn below(&mut self, n: usize) -> usize {
        self.0.usize(..n)
    }
}

use outbox_tests::PrivateRabbitCluster;
use outbox_tests::test_logs as logs;

/// The scenarios that start private servers (a RabbitMQ node or cluster, a
/// PostgreSQL cluster or primary/standby pair) run one at a time, beside
/// the scenarios on the shared servers: each boots Erlang VMs or `initdb`
/// clusters on the machine's two cores, and two of them at once starved
/// each other's relays past a scenario's limits (the poison scenario's 60 s
/// for the 2,000 held events, seen once with the three-node cluster booting
/// beside it).
static PRIVATE_SERVERS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Starts a relay and waits until it runs.
async fn relay(scenario: &Scenario, name: &str) -> RelayProcess {
    let mut relay = scenario.spawn_relay(RELAY, name, None);
    relay.ready().await;
    relay
}

/// Ends a scenario's background parts: relays gracefully (SIGTERM), then
/// the inbox consumer and the tap.
async fn finish(relays: Vec<RelayProcess>, inbox: Inbox, tap: Tap) {
    for mut relay in relays {
        relay.terminate(Duration::from_secs(30)).await;
    }
    inbox.stop().await;
    tap.stop().await;
}

/// SQLite, with the test's database file under `CARGO_TARGET_TMPDIR`.
fn sqlite() -> Backend {
    Backend::Sqlite {
        dir: env!("CARGO_TARGET_TMPDIR").into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_killed_at_each_failpoint_loses_nothing_and_keeps_order() {
    failpoints(Backend::Postgres, "failpoints").await;
}

/// [`a_relay_killed_at_each_failpoint_loses_nothing_and_keeps_order`] on
/// MariaDB: a SIGKILLed relay's claim is rolled back when its connection
/// drops.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_killed_at_each_failpoint_loses_nothing_and_keeps_order_on_mariadb() {
    failpoints(Backend::Mariadb, "failpoints_on_mariadb").await;
}

/// [`a_relay_killed_at_each_failpoint_loses_nothing_and_keeps_order`] on
/// SQLite: the rows a SIGKILLed relay had leased are taken again once the
/// lease (the relay's 10 s claim timeout) is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_killed_at_each_failpoint_loses_nothing_and_keeps_order_on_sqlite() {
    failpoints(sqlite(), "failpoints_on_sqlite").await;
}

/// A relay SIGKILLed at each failpoint in turn (the third time it gets
/// there), then one that runs to the end; verified.
async fn failpoints(backend: Backend, name: &str) {
    let scenario = Scenario::on(backend, name).await;
    let tap = Tap::start(&scenario);
    let inbox = Inbox::start(&scenario, 50, HandlerFaults::default());
    let producers = Producers::start(&scenario, ProducerConfig::default());
    for (i, failpoint) in outbox::failpoints::ALL.into_iter().enumerate() {
        // The third time: a few batches went through before, so the crash
        // leaves both sent and in-flight events behind.
        let mut relay = scenario.spawn_relay(RELAY, &format!("relay-{i}"), Some((failpoint, 3)));
        let crashed_at = relay.crashed(Duration::from_secs(60)).await;
        assert_eq!(crashed_at, failpoint, "the relay stopped where it was told");
        scenario.fault(format!("SIGKILL at {failpoint}"));
    }
    let last = relay(&scenario, "relay-last").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let produced = producers.stop().await;
    let summary = scenario.verify(&tap, &produced, DRAIN).await;
    // A crash after the confirm and before the mark's commit re-sends the
    // batch; a crash before the publish re-sends nothing. At most the
    // batches in flight (2 loops × 50 events) per crash come twice.
    assert!(
        summary.duplicates > 0,
        "a crash between confirm and mark must re-send that batch: {summary}"
    );
    assert!(summary.duplicates <= 5 * 2 * 50, "{summary}");
    finish(vec![last], inbox, tap).await;
}

/// The `random kills` scenario, run once per test process: its test and
/// the `poison` scenario (whose drain it is the yardstick of) share it.
static RANDOM_KILLS: tokio::sync::OnceCell<Summary> = tokio::sync::OnceCell::const_new();

async fn random_kills() -> Summary {
    RANDOM_KILLS
        .get_or_init(|| random_kills_on(Backend::Postgres, "random_kills"))
        .await
        .clone()
}

/// One relay at a time, SIGKILLed 8 times at random moments (100 ms to
/// 1.2 s apart) and started again; verified.
async fn random_kills_on(backend: Backend, name: &str) -> Summary {
    let mut rng = Rng::new(name);
    let scenario = Scenario::on(backend, name).await;
    let tap = Tap::start(&scenario);
    let inbox = Inbox::start(&scenario, 50, HandlerFaults::default());
    let producers = Producers::start(&scenario, ProducerConfig::default());
    let mut current = relay(&scenario, "relay-0").await;
    for kill in 1..=8 {
        tokio::time::sleep(rng.millis(100, 1200)).await;
        current.kill().await;
        scenario.fault("relay SIGKILL");
        current = relay(&scenario, &format!("relay-{kill}")).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let produced = producers.stop().await;
    let summary = scenario.verify(&tap, &produced, DRAIN).await;
    finish(vec![current], inbox, tap).await;
    summary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_sigkilled_at_random_moments_loses_nothing_and_keeps_order() {
    let summary = random_kills().await;
    assert!(summary.duplicates <= 8 * 2 * 50, "{summary}");
}

/// [`a_relay_sigkilled_at_random_moments_loses_nothing_and_keeps_order`] on
/// MariaDB.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_sigkilled_at_random_moments_loses_nothing_and_keeps_order_on_mariadb() {
    let summary = random_kills_on(Backend::Mariadb, "random_kills_on_mariadb").await;
    assert!(summary.duplicates <= 8 * 2 * 50, "{summary}");
}

/// [`a_relay_sigkilled_at_random_moments_loses_nothing_and_keeps_order`] on
/// SQLite: a killed relay's leases run out after 10 s, and its rows are
/// taken again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_sigkilled_at_random_moments_loses_nothing_and_keeps_order_on_sqlite() {
    let summary = random_kills_on(sqlite(), "random_kills_on_sqlite").await;
    assert!(summary.duplicates <= 8 * 2 * 50, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_relays_with_random_kills_keep_per_aggregate_order() {
    relays_with_random_kills(Backend::Postgres, "three_relays", 3).await;
}

/// [`three_relays_with_random_kills_keep_per_aggregate_order`] on MariaDB:
/// three relays claim side by side (row locks, `SKIP LOCKED`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_relays_with_random_kills_keep_per_aggregate_order_on_mariadb() {
    relays_with_random_kills(Backend::Mariadb, "three_relays_on_mariadb", 3).await;
}

/// [`three_relays_with_random_kills_keep_per_aggregate_order`] on SQLite,
/// with ONE relay: one relay per database file is enough (SQLite has one
/// writer at a time, so more relays only contend for it), so the same
/// producers (4) and the same 9 random kills hit a single relay, started
/// again after each. Its summary line's scenario is
/// `one_relay_random_kills_on_sqlite`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_relay_with_random_kills_keeps_per_aggregate_order_on_sqlite() {
    relays_with_random_kills(sqlite(), "one_relay_random_kills_on_sqlite", 1).await;
}

/// `relays` relays side by side, 4 producers, 9 SIGKILLs of a random relay
/// (100 to 800 ms apart), each started again; verified.
async fn relays_with_random_kills(backend: Backend, name: &str, relays_running: usize) {
    let mut rng = Rng::new(name);
    let scenario = Scenario::on(backend, name).await;
    let tap = Tap::start(&scenario);
    let inbox = Inbox::start(&scenario, 50, HandlerFaults::default());
    let producers = Producers::start(
        &scenario,
        ProducerConfig {
            producers: 4,
            ..ProducerConfig::default()
        },
    );
    let mut relays = Vec::new();
    for i in 0..relays_running {
        relays.push(relay(&scenario, &format!("relay-{i}")).await);
    }
    for kill in 0..9 {
        tokio::time::sleep(rng.millis(100, 800)).await;
        let victim = rng.below(relays.len());
        relays[victim].kill().await;
        scenario.fault(format!("SIGKILL of relay {victim}"));
        relays[victim] = relay(&scenario, &format!("relay-{victim}-{kill}")).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let produced = producers.stop().await;
    let summary = scenario.verify(&tap, &produced, DRAIN).await;
    assert!(summary.duplicates <= 9 * 2 * 50, "{summary}");
    finish(relays, inbox, tap).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_broker_stopped_and_started_while_producers_commit_loses_nothing() {
    let _one_at_a_time = PRIVATE_SERVERS.lock().await;
    logs();
    let rabbit = tokio::task::spawn_blocking(PrivateRabbit::start)
        .await
        .unwrap();
    let servers = Servers {
        database_url: outbox_testkit::urls::database_url(),
        amqp_url: rabbit.url(),
    };
    let scenario = Scenario::new("broker", servers).await;
    let tap = Tap::start(&scenario);
    let inbox = Inbox::start(&scenario, 50, HandlerFaults::default());
    let producers = Producers::start(&scenario, ProducerConfig::default());
    let relay = relay(&scenario, "relay").await;
    let rabbit = std::sync::Arc::new(rabbit);
    let ctl = |what: &'static str| {
        let rabbit = std::sync::Arc::clone(&rabbit);
        async move {
            tokio::task::spawn_blocking(move || match what {
                "stop" => rabbit.stop_app(),
                "start" => rabbit.start_app(),
                _ => unreachable!(),
            })
            .await
            .unwrap();
        }
    };
    for outage in 0..2 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        ctl("stop").await;
        scenario.fault(format!("rabbitmqctl stop_app #{outage}"));
        // Producers keep committing while the broker is away.
        tokio::time::sleep(Duration::from_secs(2)).await;
        ctl("start").await;
    }
    // Once the relay, the tap and the consumer are back, close all three.
    let prefix = scenario.name.clone();
    let wanted = ["relay", "tap", "inbox"].map(|role| format!("{prefix}.{role}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rabbit = std::sync::Arc::clone(&rabbit);
        let prefix = prefix.clone();
        let names = tokio::task::spawn_blocking(move || rabbit.connections(&prefix))
            .await
            .unwrap();
        if wanted.iter().all(|w| names.contains(w)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "60 s after the broker came back, connected are only {names:?} of {wanted:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let closed = {
        let rabbit = std::sync::Arc::clone(&rabbit);
        let prefix = prefix.clone();
        tokio::task::spawn_blocking(move || rabbit.close_connections(&prefix))
            .await
            .unwrap()
    };
    assert!(
        closed >= 3,
        "the relay's, tap's and consumer's connections were closed: {closed}"
    );
    scenario.fault(format!("{closed} connections force-closed"));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let produced = producers.stop().await;
    scenario.verify(&tap, &produced, DRAIN).await;
    finish(vec![relay], inbox, tap).await;
    drop(scenario);
    drop(rabbit);
}

/// Terminates the database sessions whose `application_name` starts with
/// `prefix`; returns how many.
async fn terminate_backends(database_url: &str, prefix: &str) -> i64 {
    use diesel_async::RunQueryDsl;
    #[derive(diesel::QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let mut conn = connect_db(database_url).await;
    diesel::sql_query(format!(
        "SELECT count(pg_terminate_backend(pid)) AS n FROM pg_stat_activity \
         WHERE application_name LIKE '{prefix}%'"
    ))
    .get_result::<Count>(&mut conn)
    .await
    .unwrap()
    .n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn database_sessions_killed_and_the_database_restarted_lose_nothing() {
    let _one_at_a_time = PRIVATE_SERVERS.lock().await;
    let pg = tokio::task::spawn_blocking(PrivatePostgres::start)
        .await
        .unwrap();
    let servers = Servers {
        database_url: pg.url(),
        amqp_url: outbox_testkit::urls::amqp_url(),
    };
    let scenario = Scenario::new("database", servers).await;
    let tap = Tap::start(&scenario);
    let inbox = Inbox::start(&scenario, 50, HandlerFaults::default());
    let producers = Producers::start(&scenario, ProducerConfig::default());
    let relay = relay(&scenario, "relay").await;
    let relay_sessions = format!("{}.relay", scenario.name);
    for round in 0..2 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        // After the first round the relay reconnects once its pause after
        // the failure is over: wait for its sessions to be back.
        let deadline = Instant::now() + Duration::from_secs(15);
        let killed = loop {
            let killed = terminate_backends(&pg.url(), &relay_sessions).await;
            if killed >= 1 || Instant::now() > deadline {
                break killed;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(killed >= 1, "the relay's sessions were found: {killed}");
        scenario.fault(format!(
            "pg_terminate_backend of {killed} relay sessions #{round}"
        ));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let pg = std::sync::Arc::new(pg);
    {
        let pg = std::sync::Arc::clone(&pg);
        tokio::task::spawn_blocking(move || pg.crash_restart(Duration::from_secs(2)))
            .await
            .unwrap();
    }
    scenario.fault("database crashed (pg_ctl stop -m immediate) and restarted");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let produced = producers.stop().await;
    let summary = scenario.verify(&tap, &produced, DRAIN).await;
    assert!(
        produced.failed > 0,
        "producers felt the restart (else the fault missed them): {summary}"
    );
    finish(vec![relay], inbox, tap).await;
    drop(scenario);
    drop(pg);
}

/// PostgreSQL failover with a synchronous standby: producers and two
/// relays on the multi-host URL, the primary killed and the standby
/// promoted; everything the producers saw committed is on the new primary,
/// and the usual verification holds there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_failover_with_synchronous_replication_loses_no_commit() {
    pg_failover(Replication::Synchronous, "pg_failover").await;
}

/// [`pg_failover_with_synchronous_replication_loses_no_commit`] with an
/// asynchronous standby: what the standby had not received is gone with
/// the old primary (business rows with their events: atomic). The
/// verification holds for everything the new primary has; what was lost is
/// printed on a `FAULT LOSS` line.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pg_failover_with_asynchronous_replication_reports_what_it_lost() {
    pg_failover(Replication::Asynchronous, "pg_failover_async").await;
}

/// The `pg-failover` scenario: a primary and a streaming standby
/// ([`ReplicatedPostgres`]), every client on the URL naming both.
async fn pg_failover(replication: Replication, name: &str) {
    let _one_at_a_time = PRIVATE_SERVERS.lock().await;
    logs();
    let pg = tokio::task::spawn_blocking(move || ReplicatedPostgres::start(replication))
        .await
        .unwrap();
    let servers = Servers {
        database_url: pg.url(),
        amqp_url: outbox_testkit::urls::amqp_url(),
    };
    let scenario = Scenario::new(name, servers).await;
    let tap = Tap::start(&scenario);
    let inbox = Inbox::start(&scenario, 50, HandlerFaults::default());
    let producers = Producers::start(&scenario, ProducerConfig::default());
    let relays = vec![
        relay(&scenario, "relay-0").await,
        relay(&scenario, "relay-1").await,
    ];
    tokio::time::sleep(Duration::from_secs(3)).await;
    let orders = format!("SELECT count(*) AS n FROM {}", scenario.table("orders"));
    let before = scenario.count(orders.clone()).await.unwrap();
    let pg = std::sync::Arc::new(pg);
    let on_pair = |f: fn(&ReplicatedPostgres)| {
        let pg = std::sync::Arc::clone(&pg);
        tokio::task::spawn_blocking(move || f(&pg))
    };
    // The standby falls behind for a second before the primary dies (as
    // one that lags under load, or a primary cut off from it first):
    // asynchronous commits of that second exist on the primary alone;
    // synchronous ones wait.
    on_pair(ReplicatedPostgres::cut_replication).await.unwrap();
    scenario.fault("replication cut (the standby receives nothing more)");
    tokio::time::sleep(Duration::from_secs(1)).await;
    on_pair(ReplicatedPostgres::kill_primary).await.unwrap();
    let killed_at = Instant::now();
    scenario.fault("primary killed (pg_ctl stop -m immediate)");
    // Nothing takes writes until the promotion: the clients wait for it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    on_pair(ReplicatedPostgres::promote_standby).await.unwrap();
    scenario.fault("standby promoted (pg_ctl promote)");
    // The producers go on on the new primary for a while.
    let deadline = Instant::now() + Duration::from_secs(20);
    let after_promotion = loop {
        let now = scenario.count(orders.clone()).await.unwrap_or(0);
        if now > before + 100 || Instant::now() > deadline {
            break now;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let produced = producers.stop().await;
    let synchronous = replication == Replication::Synchronous;
    let (summary, loss) = scenario
        .verify_failover(&tap, &produced, DRAIN, synchronous, killed_at)
        .await;
    assert!(
        after_promotion > before + 100,
        "the producers moved to the new primary ({before} orders before the failover, \
         {after_promotion} after): {summary}"
    );
    assert!(
        produced.failed > 0,
        "the producers felt the failover (else it missed them): {summary}"
    );
    assert!(loss.acknowledged > 0, "{loss}");
    let attempts = scenario
        .count(format!(
            "SELECT count(*) AS n FROM {} WHERE attempts > 0",
            scenario.table("outbox_events")
        ))
        .await
        .unwrap();
    assert_eq!(
        attempts, 0,
        "the failover spent no event's attempts (the broker never failed): {summary}"
    );
    if !synchronous {
        // What the primary committed alone in the second before it died is
        // gone (verify_failover checked that nothing else is).
        assert!(
            loss.acknowledged_lost > 0,
            "asynchronous replication lost the commits the standby never received: {loss}"
        );
    }
    finish(relays, inbox, tap).await;
    drop(scenario);
    drop(pg);
}

/// Messages ready in `queue` (not yet delivered to a consumer).
async fn ready(amqp_url: &str, queue: &str) -> u32 {
    let conn = connect_amqp(amqp_url, "fault-suite-probe").await;
    let channel = conn.create_channel().await.unwrap();
    let ready = outbox_testkit::amqp::ready(&channel, queue).await;
    let _ = conn.close(200, "probe done".into()).await;
    ready
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_failing_consumer_with_lost_connections_applies_each_event_once() {
    let scenario = Scenario::new("slow_consumer", Servers::shared()).await;
    let tap = Tap::start(&scenario);
    // Prefetch 2 and 5 ms per event: the queue backs up. The first attempt
    // of every twentieth event fails and is retried.
    let inbox = Inbox::start(
        &scenario,
        2,
        HandlerFaults {
            slow: Duration::from_millis(5),
            fail_every: 20,
        },
    );
    let producers = Producers::start(&scenario, ProducerConfig::default());
    let relay = relay(&scenario, "relay").await;
    let mut deepest = 0;
    let started = Instant::now();
    let consumer = format!("{}.inbox", scenario.name);
    let mut closes = 0;
    while started.elapsed() < Duration::from_secs(6) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        deepest = deepest.max(ready(&scenario.servers.amqp_url, &scenario.inbox_queue).await);
        if closes < 2 && started.elapsed() > Duration::from_secs(2 + 2 * closes) {
            let name = consumer.clone();
            let closed =
                tokio::task::spawn_blocking(move || outbox_testkit::amqp::close_connections(&name))
                    .await
                    .unwrap();
            assert!(
                closed >= 1,
                "the consumer's connection was closed: {closed}"
            );
            closes += 1;
            scenario.fault("inbox consumer connection force-closed");
        }
    }
    let produced = producers.stop().await;
    scenario.verify(&tap, &produced, DRAIN).await;
    assert!(
        deepest > 2,
        "the consumer fell behind (queue depth beyond the prefetch): deepest {deepest}"
    );
    assert_eq!(
        ready(
            &scenario.servers.amqp_url,
            &format!("{}.dead", scenario.inbox_queue)
        )
        .await,
        0,
        "transient failures are retried, never dead-lettered"
    );
    finish(vec![relay], inbox, tap).await;
}

/// Waits (up to `limit`) until `probe` holds; panics naming `what`.
async fn eventually<F, Fut>(what: &str, limit: Duration, probe: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    outbox_testkit::eventually::eventually(what)
        .within(limit)
        .every(Duration::from_millis(200))
        .until(probe)
        .await;
}

#[derive(diesel::QueryableByName, Debug)]
struct DeadRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    status: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    last_error: Option<String>,
}

/// Poison and misconfiguration, with producers committing all along and
/// two relays running: one event type unroutable for 30 s until its
/// binding appears, a malformed row, a row whose headers exceed the
/// broker's limits at the head of an aggregate with 2,000 events behind it
/// (skipped by the operator once it is dead), and the broker frozen for
/// 20 s. Healthy aggregates flow throughout, nothing spends an attempt but
/// the poison, and the drain after the last fault stays within twice the
/// `random kills` scenario's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn poison_misconfiguration_and_a_frozen_broker_stop_no_healthy_aggregate() {
    let _one_at_a_time = PRIVATE_SERVERS.lock().await;
    logs();
    let rabbit = std::sync::Arc::new(
        tokio::task::spawn_blocking(PrivateRabbit::start)
            .await
            .unwrap(),
    );
    let servers = Servers {
        database_url: outbox_testkit::urls::database_url(),
        amqp_url: rabbit.url(),
    };
    // `fault.late` (producer 0's every third transaction) is unbound.
    let scenario = Scenario::with_bindings("poison", servers, &["fault.tick"]).await;
    let table = format!("\"{}\".outbox_events", scenario.schema);
    let tap = Tap::start(&scenario);
    let inbox = Inbox::start_concurrent(&scenario, 50, 4, HandlerFaults::default());
    let producers = Producers::start(
        &scenario,
        // Two producers, 50 ms apart: about 60 events/s, which leaves the
        // inbox consumer (a debug build, on two cores shared with
        // everything else) the headroom to catch up after the freeze.
        ProducerConfig {
            producers: 2,
            late_producers: 1,
            interval: Duration::from_millis(50),
            ..ProducerConfig::default()
        },
    );
    let unbound_since = Instant::now();
    let relays = vec![
        relay(&scenario, "relay-0").await,
        relay(&scenario, "relay-1").await,
    ];
    let healthy = |tap: &Tap| {
        tap.deliveries()
            .iter()
            .filter(|d| !d.aggregate.starts_with("p0-") && d.aggregate != "doomed")
            .count()
    };
    let status_of = async |id: Uuid| {
        scenario
            .query::<DeadRow>(format!(
                "SELECT status, last_error FROM {table} WHERE id = '{id}'"
            ))
            .await
            .unwrap()
            .pop()
            .unwrap()
    };
    let count = async |filter: &str| {
        scenario
            .count(format!("SELECT count(*) AS n FROM {table} WHERE {filter}"))
            .await
            .unwrap()
    };

    // Poison written by hand: a row whose headers are JSON null, and an
    // aggregate whose head carries 300 headers of 500 bytes (over the
    // header limit and RabbitMQ's 128 KiB frame), with 2,000 committed
    // events behind it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let malformed = Uuid::now_v7();
    let oversized = Uuid::now_v7();
    scenario
        .execute(&format!(
            "INSERT INTO {table} (id, aggregate_type, aggregate_id, event_type, schema_version, \
               payload, headers, occurred_at) \
             VALUES ('{malformed}', 'fault', 'malformed', 'fault.tick', 1, '{{}}', 'null', now()), \
               ('{oversized}', 'fault', 'doomed', 'fault.tick', 1, '{{}}', \
                (SELECT jsonb_object_agg('h' || i, repeat('x', 500)) \
                 FROM generate_series(1, 300) i), now())"
        ))
        .await;
    scenario.expect_dead(malformed);
    scenario.expect_dead(oversized);
    let behind = commit_burst(&scenario, "doomed", 0, 2000).await;
    scenario.fault("a malformed row; an oversized head with 2,000 events behind it");
    eventually("both poison rows dead", Duration::from_secs(30), || async {
        status_of(malformed).await.status == "dead" && status_of(oversized).await.status == "dead"
    })
    .await;
    eventually(
        "the 2,000 events behind the dead head held",
        Duration::from_secs(30),
        || async { count("aggregate_id = 'doomed' AND status = 'held'").await == 2000 },
    )
    .await;
    let before = healthy(&tap);
    eventually(
        "healthy aggregates flow behind the poison",
        Duration::from_secs(10),
        || async { healthy(&tap) > before + 50 },
    )
    .await;
    // The operator skips the dead head: the 2,000 behind it flow.
    let skipped = scenario
        .execute(&format!(
            "UPDATE {table} SET status = 'skipped' WHERE id = '{oversized}' AND status = 'dead'"
        ))
        .await;
    assert_eq!(skipped, 1, "the operator skipped the dead head");
    scenario.fault("the operator skips the dead head");
    let released_at = (Instant::now(), healthy(&tap));
    eventually(
        "the 2,000 events behind the skipped head delivered",
        Duration::from_secs(60),
        || async {
            let delivered = tap.unique_ids();
            behind.iter().all(|id| delivered.contains(id))
        },
    )
    .await;
    println!(
        "poison: the 2,000 released events took {:.1} s; {} healthy events delivered meanwhile",
        released_at.0.elapsed().as_secs_f64(),
        healthy(&tap) - released_at.1
    );

    // The broker frozen for 20 s (sockets open, nothing answers).
    let frozen = {
        let rabbit = std::sync::Arc::clone(&rabbit);
        tokio::task::spawn_blocking(move || rabbit.freeze())
            .await
            .unwrap()
    };
    scenario.fault("broker frozen (SIGSTOP)");
    tokio::time::sleep(Duration::from_secs(20)).await;
    drop(frozen);
    scenario.fault("broker thawed (SIGCONT)");
    let thawed = Instant::now();
    let before = healthy(&tap);
    eventually(
        "healthy aggregates flow after the thaw",
        Duration::from_secs(30),
        || async { healthy(&tap) > before + 50 },
    )
    .await;

    // The backlog of the freeze drains, to the relays and through the inbox
    // consumer (but for the aggregates held behind unroutable events),
    // before the binding appears.
    let unapplied = format!(
        "SELECT count(*) AS n FROM \"{schema}\".orders o WHERE aggregate NOT LIKE 'p0-%' \
         AND NOT EXISTS (SELECT 1 FROM \"{schema}\".effects e WHERE e.event_id = o.event_id)",
        schema = scenario.schema
    );
    eventually(
        "the backlog of the freeze drained",
        Duration::from_secs(240),
        || async {
            count("status = 'pending' AND aggregate_id NOT LIKE 'p0-%'").await < 100
                && scenario.count(unapplied.clone()).await.unwrap() < 100
        },
    )
    .await;
    println!(
        "poison: the freeze's backlog drained {:.1} s after the thaw",
        thawed.elapsed().as_secs_f64()
    );

    // The unbound event type is held, spending nothing, until its binding
    // appears (at least 30 s after the first one was recorded).
    let held_unroutable =
        count("event_type = 'fault.late' AND status = 'retry' AND unroutable_since IS NOT NULL")
            .await;
    assert!(
        held_unroutable > 0,
        "fault.late events are held as unroutable"
    );
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(unbound_since.elapsed())).await;
    scenario.bind("fault.late").await;
    scenario.fault("the binding of fault.late appears");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let produced = producers.stop().await;
    let summary = scenario.verify(&tap, &produced, DRAIN).await;

    // What the poison cost, and what it did not.
    let malformed_row = status_of(malformed).await;
    assert_eq!(malformed_row.status, "dead");
    assert!(
        malformed_row
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("malformed")),
        "the malformed row says why: {malformed_row:?}"
    );
    let oversized_row = status_of(oversized).await;
    assert!(
        oversized_row
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("headers")),
        "the oversized head says why: {oversized_row:?}"
    );
    assert!(
        count("event_type = 'fault.late'").await > 0,
        "producer 0 recorded fault.late events"
    );
    assert_eq!(
        count(&format!(
            "attempts > 0 AND id NOT IN ('{malformed}', '{oversized}')"
        ))
        .await,
        0,
        "neither the unroutable events nor the frozen broker spent an attempt"
    );
    let baseline = random_kills().await;
    assert!(
        summary.drain_after_last_fault <= 2 * baseline.drain_after_last_fault,
        "the drain after the last fault ({:.2} s) is within twice the random kills \
         scenario's ({:.2} s)",
        summary.drain_after_last_fault.as_secs_f64(),
        baseline.drain_after_last_fault.as_secs_f64()
    );
    finish(relays, inbox, tap).await;
    drop(scenario);
    drop(rabbit);
}

/// Scenario `rabbit_cluster`: a three-node private RabbitMQ cluster
/// ([`PrivateRabbitCluster`]) whose tap and inbox queues are quorum queues;
/// producers commit, two relays and the inbox consumer run with every
/// node's URL (a comma-separated `AMQP_URL`). Node 1 is stopped
/// (`rabbitmqctl stop_app`) for 5 s and started again, then node 2: every
/// client on the stopped node fails over to another node, the quorum
/// queues keep a majority throughout. Nothing is lost, order holds, no
/// attempt is spent, and events keep flowing while a node is down (the
/// time until the tap sees the next delivery after each stop is printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rabbit_cluster_nodes_stopped_one_at_a_time_lose_nothing_and_spend_no_attempt() {
    let _one_at_a_time = PRIVATE_SERVERS.lock().await;
    logs();
    let cluster = std::sync::Arc::new(
        tokio::task::spawn_blocking(PrivateRabbitCluster::start)
            .await
            .unwrap(),
    );
    let servers = Servers {
        database_url: outbox_testkit::urls::database_url(),
        amqp_url: cluster.urls(),
    };
    let scenario = Scenario::quorum("rabbit_cluster", servers).await;
    let queues = {
        let cluster = std::sync::Arc::clone(&cluster);
        tokio::task::spawn_blocking(move || cluster.queues(0))
            .await
            .unwrap()
    };
    let queues: Vec<serde_json::Value> =
        serde_json::from_str(&queues).unwrap_or_else(|e| panic!("list_queues JSON: {e}: {queues}"));
    for queue in [&scenario.tap_queue, &scenario.inbox_queue] {
        let listed = queues
            .iter()
            .find(|q| q["name"] == queue.as_str())
            .unwrap_or_else(|| panic!("{queue} not listed: {queues:?}"));
        assert!(
            listed["type"] == "quorum" && listed["members"].as_array().map(Vec::len) == Some(3),
            "{queue} is a quorum queue with a member on each node: {listed}"
        );
    }
    let table = format!("\"{}\".outbox_events", scenario.schema);
    let tap = Tap::start(&scenario);
    let inbox = Inbox::start(&scenario, 50, HandlerFaults::default());
    let producers = Producers::start(&scenario, ProducerConfig::default());
    let relays = vec![
        relay(&scenario, "relay-0").await,
        relay(&scenario, "relay-1").await,
    ];
    let ctl = |node: usize, start: bool| {
        let cluster = std::sync::Arc::clone(&cluster);
        async move {
            tokio::task::spawn_blocking(move || {
                if start {
                    cluster.start_node(node);
                } else {
                    cluster.stop_node(node);
                }
            })
            .await
            .unwrap();
        }
    };
    // Node 1 (index 0) first: it is the first URL, so every client is on
    // it; then node 2, where they all went. Messages number the nodes from
    // 1, as the cluster's node names and the docs do.
    let prefix = scenario.name.clone();
    let wanted = ["relay-0", "relay-1", "inbox", "tap"].map(|role| format!("{prefix}.{role}"));
    for node in [0, 1] {
        let number = node + 1;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let cluster = std::sync::Arc::clone(&cluster);
            let prefix = prefix.clone();
            let names =
                tokio::task::spawn_blocking(move || cluster.node(node).connections(&prefix))
                    .await
                    .unwrap();
            if wanted.iter().all(|w| names.contains(w)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the clients are on node {number} before it stops: only {names:?} of {wanted:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let before = tap.deliveries().len();
        ctl(node, false).await;
        let stopped = Instant::now();
        scenario.fault(format!("rabbitmqctl stop_app on node {number}"));
        // The longest time the tap went without a new delivery while the
        // node was down: the failover's pause as the consumers see it.
        let (mut last_count, mut last_change, mut longest) = (before, stopped, Duration::ZERO);
        while stopped.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let count = tap.deliveries().len();
            if count > last_count {
                longest = longest.max(last_change.elapsed());
                (last_count, last_change) = (count, Instant::now());
            }
        }
        longest = longest.max(last_change.elapsed());
        let during = tap.deliveries().len() - before;
        println!(
            "rabbit_cluster: node {number} down for 5 s: {during} deliveries meanwhile, the longest \
             pause between two {:.2} s",
            longest.as_secs_f64()
        );
        assert!(
            during > 0,
            "events flowed while node {number} was down (the clients failed over)"
        );
        ctl(node, true).await;
        scenario.fault(format!("rabbitmqctl start_app on node {number}"));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let produced = producers.stop().await;
    let summary = scenario.verify(&tap, &produced, DRAIN).await;
    let count = async |filter: &str| {
        scenario
            .count(format!("SELECT count(*) AS n FROM {table} WHERE {filter}"))
            .await
            .unwrap()
    };
    assert_eq!(
        count("attempts > 0 OR status = 'dead'").await,
        0,
        "losing a node spent no attempt"
    );
    assert!(summary.events > 0, "{summary}");
    // The relays' side of the failovers: the longest time no event was
    // marked sent (producers commit every 10 ms throughout).
    let longest_unpublished = scenario
        .count(format!(
            "SELECT coalesce(max(gap), 0) AS n FROM (SELECT (extract(epoch FROM published_at - \
             lag(published_at) OVER (ORDER BY published_at)) * 1000)::bigint AS gap \
             FROM {table} WHERE published_at IS NOT NULL) gaps"
        ))
        .await
        .unwrap();
    println!(
        "rabbit_cluster: the longest time without an event marked sent: {:.2} s",
        longest_unpublished as f64 / 1000.0
    );
    finish(relays, inbox, tap).await;
    drop(scenario);
    drop(cluster);
}
