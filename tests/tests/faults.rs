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
//! parallel with every other test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use outbox_tests::{
    HandlerFaults, Inbox, PrivatePostgres, PrivateRabbit, ProducerConfig, Producers, RelayProcess,
    Scenario, Servers, Tap, connect_amqp, connect_db,
};

/// The relay binary of this package.
const RELAY: &str = env!("CARGO_BIN_EXE_outbox-fault-relay");
/// How long a scenario may take to drain after its last fault.
const DRAIN: Duration = Duration::from_secs(120);

/// A small deterministic generator for kill times and victims (the seed is
/// printed, so a failing run can be replayed with `FAULT_SEED`).
struct Rng(u64);

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
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn millis(&mut self, min: u64, max: u64) -> Duration {
        Duration::from_millis(min + self.next() % (max - min))
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Logs of the library parts running in the test process (inbox consumer,
/// producers) go to the test's captured output: shown when it fails.
fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_test_writer()
        .try_init();
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_killed_at_each_failpoint_loses_nothing_and_keeps_order() {
    let scenario = Scenario::new("failpoints", Servers::shared()).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_sigkilled_at_random_moments_loses_nothing_and_keeps_order() {
    let mut rng = Rng::new("random_kills");
    let scenario = Scenario::new("random_kills", Servers::shared()).await;
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
    assert!(summary.duplicates <= 8 * 2 * 50, "{summary}");
    finish(vec![current], inbox, tap).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_relays_with_random_kills_keep_per_aggregate_order() {
    let mut rng = Rng::new("three_relays");
    let scenario = Scenario::new("three_relays", Servers::shared()).await;
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
    for i in 0..3 {
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
    logs();
    let rabbit = tokio::task::spawn_blocking(PrivateRabbit::start)
        .await
        .unwrap();
    let servers = Servers {
        database_url: outbox_tests::servers::database_url(),
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
    let pg = tokio::task::spawn_blocking(PrivatePostgres::start)
        .await
        .unwrap();
    let servers = Servers {
        database_url: pg.url(),
        amqp_url: outbox_tests::servers::amqp_url(),
    };
    let scenario = Scenario::new("database", servers).await;
    let tap = Tap::start(&scenario);
    let inbox = Inbox::start(&scenario, 50, HandlerFaults::default());
    let producers = Producers::start(&scenario, ProducerConfig::default());
    let relay = relay(&scenario, "relay").await;
    let relay_sessions = format!("{}.relay", scenario.name);
    for round in 0..2 {
        tokio::time::sleep(Duration::from_millis(700)).await;
        let killed = terminate_backends(&pg.url(), &relay_sessions).await;
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

/// Messages ready in `queue` (not yet delivered to a consumer).
async fn ready(amqp_url: &str, queue: &str) -> u32 {
    let conn = connect_amqp(amqp_url, "fault-suite-probe").await;
    let channel = conn.create_channel().await.unwrap();
    let declared = channel
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let _ = conn.close(200, "probe done".into()).await;
    declared.message_count()
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
            let closed = tokio::task::spawn_blocking(move || {
                outbox_tests::servers::close_shared_connections(&name)
            })
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
