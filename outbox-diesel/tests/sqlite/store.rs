//! The relay store on SQLite: the store contracts every back end keeps
//! (`outbox_core::testing::conformance`), and what is SQLite's own: the
//! lease claim (two claims never overlap, an expired lease is taken again
//! and the first claim's finish reports `LeaseLost`, requests' writes are
//! not blocked while a batch is out), held events released by the schema's
//! trigger, stats, purge and the relay registry.

use std::time::Duration;

use diesel_async::pooled_connection::deadpool::Pool;
use outbox_core::testing::TestEvent;
use outbox_core::testing::conformance::{self, Fixture, RecordError, Refusal};
use outbox_core::{Claim, Claimed, DeliveryOrder, FailedAttempt, NextStep, OutboxStore};
use outbox_diesel::Error;
use outbox_diesel::sqlite::{
    self, AsyncSqliteConnection, SqliteClaim, SqliteOutboxStore, SqliteSettings,
};

use super::{TempDb, count, migrated};

/// A migrated file of the test's own, under the conformance checks.
struct SqliteFixture {
    db: TempDb,
    pool: Pool<AsyncSqliteConnection>,
    store: SqliteOutboxStore,
}

impl SqliteFixture {
    async fn new(test: &str) -> SqliteFixture {
        let (db, _conn) = migrated(test).await;
        let pool = sqlite::pool(&db.url(), 4).unwrap();
        let store = SqliteSettings::default().store(pool.clone());
        SqliteFixture { db, pool, store }
    }

    async fn conn(&self) -> AsyncSqliteConnection {
        sqlite::connect(&self.db.url()).await.unwrap()
    }
}

impl Fixture for SqliteFixture {
    type Store = SqliteOutboxStore;

    fn store(&self) -> &SqliteOutboxStore {
        &self.store
    }

    async fn record(&self, events: &[TestEvent]) -> Result<Vec<uuid::Uuid>, RecordError> {
        let mut tx = outbox_diesel::SqliteTransaction::begin(&self.pool).await?;
        let ids = sqlite::record_all(&mut tx, events).await?;
        tx.commit().await?;
        Ok(ids)
    }

    fn refusal(error: &Error) -> Option<Refusal> {
        match error {
            Error::NotInClaim { seq } => Some(Refusal::NotInClaim { seq: *seq }),
            Error::DuplicateSeq { seq } => Some(Refusal::DuplicateSeq { seq: *seq }),
            _ => None,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn marks_refuse_seqs_not_in_the_claim() {
    let fixture = SqliteFixture::new("notinclaim").await;
    conformance::marks_refuse_seqs_not_in_the_claim(&fixture)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn marks_refuse_a_seq_named_twice() {
    let fixture = SqliteFixture::new("twice").await;
    conformance::marks_refuse_a_seq_named_twice(&fixture)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dead_event_holds_back_only_its_aggregate() {
    let fixture = SqliteFixture::new("deadhead").await;
    conformance::a_dead_event_holds_back_only_its_aggregate(&fixture)
        .await
        .unwrap();
}

async fn batch(store: &SqliteOutboxStore, limit: usize) -> SqliteClaim {
    store.claim(limit).await.unwrap().expect("a batch")
}

fn aggregates(claim: &impl Claim) -> Vec<String> {
    claim
        .records()
        .iter()
        .map(|r| r.envelope.aggregate_id.clone())
        .collect()
}

fn seqs(claim: &impl Claim) -> Vec<i64> {
    claim.records().iter().map(|r| r.seq).collect()
}

/// Two relays claim at once: the second skips the rows the first leased
/// and takes the next whole aggregates; neither takes a row of an
/// aggregate whose earlier row the other leased.
#[tokio::test(flavor = "multi_thread")]
async fn two_claims_never_overlap_and_keep_each_aggregate_whole() {
    let fixture = SqliteFixture::new("overlap").await;
    let events: Vec<TestEvent> = ["a", "b", "c", "d"]
        .into_iter()
        .flat_map(|a| (0..2).map(move |i| TestEvent::new(a).field("n", i)))
        .collect();
    fixture.record(&events).await.unwrap();
    let first = batch(&fixture.store, 4).await;
    let second = batch(&fixture.store, 4).await;
    assert_eq!(aggregates(&first), ["a", "a", "b", "b"]);
    assert_eq!(aggregates(&second), ["c", "c", "d", "d"]);
    assert!(
        fixture.store.claim(4).await.unwrap().is_none(),
        "everything is leased by the two claims"
    );
    for mut claim in [first, second] {
        let seqs = seqs(&claim);
        claim.mark_sent(&seqs).await.unwrap();
        claim.finish().await.unwrap();
    }
    let mut conn = fixture.conn().await;
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM outbox_events").await,
        0
    );

    // Interleaved aggregates: a second claim finds every aggregate's
    // earlier rows leased, and takes nothing rather than a gap.
    let interleaved: Vec<TestEvent> = (0..2)
        .flat_map(|i| ["e", "f"].map(|a| TestEvent::new(a).field("n", i)))
        .collect();
    fixture.record(&interleaved).await.unwrap();
    let first = batch(&fixture.store, 2).await;
    assert_eq!(aggregates(&first), ["e", "f"]);
    assert!(fixture.store.claim(2).await.unwrap().is_none());
    first.finish().await.unwrap();
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM outbox_events WHERE lease_token IS NOT NULL"
        )
        .await,
        0,
        "finish clears the leases of unmarked rows"
    );
    let next = batch(&fixture.store, 10).await;
    assert_eq!(aggregates(&next), ["e", "f", "e", "f"]);
    next.finish().await.unwrap();
}

/// A lease that expired is taken by the next claim; the first claim's
/// marks of those rows match nothing: its finish commits the rest and
/// reports `LeaseLost`, and the second claim's marks stand.
#[tokio::test(flavor = "multi_thread")]
async fn an_expired_lease_is_claimed_again_and_the_first_finish_reports_it() {
    let fixture = SqliteFixture::new("lease").await;
    let store = fixture
        .store
        .clone()
        .keep_sent(true)
        .claim_timeout(Duration::from_millis(300));
    fixture
        .record(&[TestEvent::new("a"), TestEvent::new("b")])
        .await
        .unwrap();
    let mut first = batch(&store, 10).await;
    let [a, b] = seqs(&first)[..] else {
        panic!("two rows")
    };
    assert!(store.claim(10).await.unwrap().is_none(), "leased");
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Only `a` is taken again (limit 1); `b`'s lease lapsed untouched.
    let mut second = batch(&store, 1).await;
    assert_eq!(seqs(&second), [a]);
    first.mark_sent(&[a, b]).await.unwrap();
    let error = first.finish().await.unwrap_err();
    assert!(
        matches!(&error, Error::LeaseLost { seqs } if seqs == &[a]),
        "{error}"
    );
    assert!(error.to_string().contains("at-least-once"), "{error}");
    let mut conn = fixture.conn().await;
    assert_eq!(
        count(
            &mut conn,
            &format!("SELECT count(*) AS n FROM outbox_events WHERE seq = {b} AND status = 'sent'")
        )
        .await,
        1,
        "the mark of the row whose lease was not taken was committed"
    );
    assert_eq!(
        count(
            &mut conn,
            &format!(
                "SELECT count(*) AS n FROM outbox_events WHERE seq = {a} \
                 AND status = 'pending' AND lease_token IS NOT NULL"
            )
        )
        .await,
        1,
        "the second claim's lease stands"
    );
    second
        .mark_failed(&[FailedAttempt::new(
            a,
            1,
            "nacked",
            NextStep::RetryAt(chrono::Utc::now() + chrono::Duration::hours(1)),
        )])
        .await
        .unwrap();
    second.finish().await.unwrap();
    assert_eq!(
        count(
            &mut conn,
            &format!(
                "SELECT count(*) AS n FROM outbox_events WHERE seq = {a} \
                 AND status = 'retry' AND attempts = 1 AND lease_token IS NULL"
            )
        )
        .await,
        1,
        "the second claim's mark stands"
    );
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM outbox_attempts").await,
        1
    );
}

/// While a claim is out publishing, no transaction is open: a request's
/// `BEGIN IMMEDIATE` + insert commits at once (it would wait up to
/// `busy_timeout`, 5 s, behind an open write transaction).
#[tokio::test(flavor = "multi_thread")]
async fn a_writer_is_not_blocked_while_a_claim_is_out() {
    let fixture = SqliteFixture::new("writer").await;
    fixture.record(&[TestEvent::new("a")]).await.unwrap();
    let mut claim = batch(&fixture.store, 10).await;
    let started = std::time::Instant::now();
    let recorded = tokio::time::timeout(
        Duration::from_secs(2),
        fixture.record(&[TestEvent::new("a"), TestEvent::new("b")]),
    )
    .await
    .expect("a writer waited for the claim")
    .unwrap();
    assert_eq!(recorded.len(), 2);
    assert!(started.elapsed() < Duration::from_secs(1));
    let seqs = seqs(&claim);
    claim.mark_sent(&seqs).await.unwrap();
    claim.finish().await.unwrap();
    let next = batch(&fixture.store, 10).await;
    assert_eq!(aggregates(&next), ["a", "b"]);
    next.finish().await.unwrap();

    // The control: a write transaction left open (what a claim holding its
    // transaction through the publish would be) does make a writer wait.
    let pool = fixture.pool.clone();
    let holder = tokio::spawn(async move {
        let tx = outbox_diesel::SqliteTransaction::begin(&pool)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        tx.commit().await.unwrap();
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    fixture.record(&[TestEvent::new("c")]).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "the writer did not wait: {:?}",
        started.elapsed()
    );
    holder.await.unwrap();
}

/// A claim dropped without `finish` clears its leases in the background.
#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_claim_gives_its_rows_back() {
    let fixture = SqliteFixture::new("dropped").await;
    fixture.record(&[TestEvent::new("a")]).await.unwrap();
    drop(batch(&fixture.store, 10).await);
    let mut again = None;
    for _ in 0..50 {
        again = fixture.store.claim(10).await.unwrap();
        if again.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = again.expect("the dropped claim's lease was cleared");
    assert_eq!(aggregates(&again), ["a"]);
    again.finish().await.unwrap();
}

/// A retry that is finally sent releases the events held behind it, by
/// the schema's trigger, in the same statement.
#[tokio::test(flavor = "multi_thread")]
async fn a_sent_retry_releases_the_events_held_behind_it() {
    let fixture = SqliteFixture::new("release").await;
    fixture
        .record(&[
            TestEvent::new("a"),
            TestEvent::new("a"),
            TestEvent::new("b"),
        ])
        .await
        .unwrap();
    let mut claim = batch(&fixture.store, 10).await;
    let head = claim.records()[0].seq;
    let sent: Vec<i64> = claim.records().iter().skip(2).map(|r| r.seq).collect();
    claim
        .mark_failed(&[FailedAttempt::new(
            head,
            1,
            "nacked",
            NextStep::RetryAt(chrono::Utc::now() - chrono::Duration::seconds(1)),
        )])
        .await
        .unwrap();
    claim.mark_sent(&sent).await.unwrap();
    claim.finish().await.unwrap();
    let mut conn = fixture.conn().await;
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM outbox_attempts").await,
        1,
        "the failed attempt is kept"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM outbox_events WHERE status = 'held'"
        )
        .await,
        1,
        "the second event of `a` waits behind its failed head"
    );
    let mut retry = batch(&fixture.store, 10).await;
    assert_eq!(seqs(&retry), [head], "only the due head, not the held one");
    retry.mark_sent(&[head]).await.unwrap();
    retry.finish().await.unwrap();
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) AS n FROM outbox_events WHERE status = 'held'"
        )
        .await,
        0
    );
    let rest = batch(&fixture.store, 10).await;
    assert_eq!(aggregates(&rest), ["a"]);
    rest.finish().await.unwrap();
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM outbox_attempts").await,
        0,
        "a sent event's history goes with it"
    );
}

/// Unordered claims take pending rows past a leased one, never a leased
/// row.
#[tokio::test(flavor = "multi_thread")]
async fn unordered_claims_never_overlap() {
    let fixture = SqliteFixture::new("unordered").await;
    fixture
        .store
        .set_delivery_order(DeliveryOrder::Unordered)
        .await
        .unwrap();
    fixture
        .record(&[
            TestEvent::new("a"),
            TestEvent::new("a"),
            TestEvent::new("b"),
        ])
        .await
        .unwrap();
    let first = batch(&fixture.store, 2).await;
    let second = batch(&fixture.store, 2).await;
    assert_eq!(aggregates(&first), ["a", "a"]);
    assert_eq!(aggregates(&second), ["b"]);
    assert!(fixture.store.claim(2).await.unwrap().is_none());
    first.finish().await.unwrap();
    second.finish().await.unwrap();

    // A paused relay claims nothing; an unpaused one with nothing due gets
    // `Empty`.
    let registration = outbox_core::RelayRegistration::new("relay-u", Duration::from_secs(5));
    fixture.store.register_relay(&registration).await.unwrap();
    let mut conn = fixture.conn().await;
    diesel_async::SimpleAsyncConnection::batch_execute(
        &mut conn,
        "UPDATE outbox_relays SET paused = 1",
    )
    .await
    .unwrap();
    assert!(matches!(
        fixture.store.claim_for("relay-u", 10).await.unwrap(),
        Claimed::Paused
    ));
    diesel_async::SimpleAsyncConnection::batch_execute(
        &mut conn,
        "UPDATE outbox_relays SET paused = 0; DELETE FROM outbox_events",
    )
    .await
    .unwrap();
    assert!(matches!(
        fixture.store.claim_for("relay-u", 10).await.unwrap(),
        Claimed::Empty
    ));
}

/// A store refuses to claim from a file migrated by a newer version.
#[tokio::test(flavor = "multi_thread")]
async fn a_newer_schema_is_refused() {
    let fixture = SqliteFixture::new("version").await;
    let mut conn = fixture.conn().await;
    diesel_async::SimpleAsyncConnection::batch_execute(
        &mut conn,
        "INSERT INTO outbox_schema_version (version, name, applied_at) VALUES (99, 'future', 0)",
    )
    .await
    .unwrap();
    let error = fixture.store.claim(10).await.unwrap_err();
    assert!(
        matches!(error, Error::SchemaVersion { found: 99, .. }),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_purge_and_the_relay_registry() {
    let fixture = SqliteFixture::new("stats").await;
    let store = fixture.store.clone().keep_sent(true);
    fixture
        .record(&[TestEvent::new("a"), TestEvent::new("b")])
        .await
        .unwrap();
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.backlog, 2);
    assert!(stats.oldest_unsent_age.is_some());
    let mut claim = batch(&store, 10).await;
    let seqs = seqs(&claim);
    claim.mark_sent(&seqs).await.unwrap();
    claim.finish().await.unwrap();
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.backlog, stats.dead), (0, 0));
    assert!(stats.oldest_unsent_age.is_none());
    let future = chrono::Utc::now() + chrono::Duration::hours(1);
    assert_eq!(store.purge_sent(future, 1).await.unwrap(), 1);
    assert_eq!(store.purge_sent(future, 10).await.unwrap(), 1);

    let registration = outbox_core::RelayRegistration::new("relay-1", Duration::from_secs(5));
    store.register_relay(&registration).await.unwrap();
    assert_eq!(store.stats().await.unwrap().relays_live, 1);
    assert!(!store.heartbeat("relay-1", 3).await.unwrap().paused);
    let mut conn = fixture.conn().await;
    diesel_async::SimpleAsyncConnection::batch_execute(
        &mut conn,
        "UPDATE outbox_relays SET paused = 1",
    )
    .await
    .unwrap();
    assert!(store.heartbeat("relay-1", 0).await.unwrap().paused);
    fixture.record(&[TestEvent::new("c")]).await.unwrap();
    assert!(matches!(
        store.claim_for("relay-1", 10).await.unwrap(),
        Claimed::Paused
    ));
    store.deregister_relay("relay-1").await.unwrap();
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM outbox_relays").await,
        1,
        "a paused relay keeps its row"
    );
    // Removed by hand: the heartbeat registers it again.
    diesel_async::SimpleAsyncConnection::batch_execute(&mut conn, "DELETE FROM outbox_relays")
        .await
        .unwrap();
    assert!(!store.heartbeat("relay-1", 0).await.unwrap().paused);
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM outbox_relays").await,
        1
    );
    store.deregister_relay("relay-1").await.unwrap();
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM outbox_relays").await,
        0
    );
}

/// Replaying a dead event releases the events held behind it (trigger);
/// skipping works on a dead event only.
#[tokio::test(flavor = "multi_thread")]
async fn replay_and_skip_release_held_events() {
    let fixture = SqliteFixture::new("replay").await;
    let ids = fixture
        .record(&[TestEvent::new("a"), TestEvent::new("a")])
        .await
        .unwrap();
    let mut claim = batch(&fixture.store, 10).await;
    let head = claim.records()[0].seq;
    claim
        .mark_failed(&[FailedAttempt::new(head, 9, "poison", NextStep::Dead)])
        .await
        .unwrap();
    claim.finish().await.unwrap();
    let mut conn = fixture.conn().await;
    let held = "SELECT count(*) AS n FROM outbox_events WHERE status = 'held'";
    assert_eq!(count(&mut conn, held).await, 1);
    assert_eq!(fixture.store.stats().await.unwrap().dead, 1);
    assert_eq!(fixture.store.stats().await.unwrap().blocked_aggregates, 1);
    assert!(!fixture.store.skip_dead(ids[1]).await.unwrap(), "not dead");
    assert_eq!(
        fixture
            .store
            .replay_dead(outbox_core::DeadSelector::Id(ids[0]))
            .await
            .unwrap(),
        1
    );
    assert_eq!(count(&mut conn, held).await, 0);
    let rest = batch(&fixture.store, 10).await;
    assert_eq!(aggregates(&rest), ["a", "a"]);
    rest.finish().await.unwrap();
    fixture.store.maintain().await.unwrap();
}

/// A row this library cannot read (headers that are not a map of strings,
/// written by another writer) is marked dead by the claim that meets it,
/// with its attempt; the rows of its aggregate behind it are held and not
/// left leased; other aggregates are handed out.
#[tokio::test(flavor = "multi_thread")]
async fn a_malformed_row_is_marked_dead_and_holds_back_its_aggregate() {
    let fixture = SqliteFixture::new("malformed").await;
    let mut conn = fixture.conn().await;
    diesel_async::SimpleAsyncConnection::batch_execute(
        &mut conn,
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, event_type, \
           schema_version, payload, headers, occurred_at) \
         VALUES ('00000000-0000-7000-8000-000000000001', 'thing', 'm', 'thing.happened', 1, \
           '{}', '[1]', 0)",
    )
    .await
    .unwrap();
    fixture
        .record(&[TestEvent::new("m"), TestEvent::new("n")])
        .await
        .unwrap();
    let mut claim = batch(&fixture.store, 10).await;
    assert_eq!(aggregates(&claim), ["n"]);
    let sent = seqs(&claim);
    claim.mark_sent(&sent).await.unwrap();
    claim.finish().await.unwrap();
    for (sql, n) in [
        (
            "SELECT count(*) AS n FROM outbox_events WHERE aggregate_id = 'm' \
             AND status = 'dead' AND last_error LIKE 'malformed row:%'",
            1,
        ),
        (
            "SELECT count(*) AS n FROM outbox_events WHERE aggregate_id = 'm' \
             AND status = 'held'",
            1,
        ),
        (
            "SELECT count(*) AS n FROM outbox_attempts WHERE outcome = 'dead'",
            1,
        ),
        (
            "SELECT count(*) AS n FROM outbox_events WHERE lease_token IS NOT NULL",
            0,
        ),
    ] {
        assert_eq!(count(&mut conn, sql).await, n, "{sql}");
    }
    assert!(fixture.store.claim(10).await.unwrap().is_none());
}

/// Three relays claim, publish and finish concurrently: every event is
/// delivered exactly once, each aggregate's in seq order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_relays_deliver_each_event_once_in_aggregate_order() {
    let fixture = SqliteFixture::new("concurrent").await;
    let events: Vec<TestEvent> = (0..60)
        .map(|i| TestEvent::new(["a", "b", "c", "d", "e", "f"][i % 6]).field("n", i))
        .collect();
    fixture.record(&events).await.unwrap();
    let delivered = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let relays: Vec<_> = (0..3)
        .map(|_| {
            let store = fixture.store.clone();
            let delivered = std::sync::Arc::clone(&delivered);
            tokio::spawn(async move {
                let mut idle = 0;
                while idle < 3 {
                    let Some(mut claim) = store.claim(5).await.unwrap() else {
                        idle += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    idle = 0;
                    delivered.lock().unwrap().extend(
                        claim
                            .records()
                            .iter()
                            .map(|r| (r.envelope.aggregate_id.clone(), r.seq)),
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    let seqs = seqs(&claim);
                    claim.mark_sent(&seqs).await.unwrap();
                    claim.finish().await.unwrap();
                }
            })
        })
        .collect();
    for relay in relays {
        relay.await.unwrap();
    }
    let delivered = delivered.lock().unwrap().clone();
    let mut all: Vec<i64> = delivered.iter().map(|(_, seq)| *seq).collect();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), 60, "each event once");
    assert_eq!(delivered.len(), 60, "no event twice");
    for aggregate in ["a", "b", "c", "d", "e", "f"] {
        let order: Vec<i64> = delivered
            .iter()
            .filter(|(a, _)| a == aggregate)
            .map(|(_, seq)| *seq)
            .collect();
        assert!(order.is_sorted(), "{aggregate}: {order:?}");
    }
    let mut conn = fixture.conn().await;
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM outbox_events").await,
        0
    );
}

/// The relay itself on the SQLite store: two relays publish every event
/// once, while a request records more events meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_relays_publish_every_event_once() {
    use outbox_core::Relay;
    use outbox_core::testing::RecordingPublisher;
    let fixture = SqliteFixture::new("relays").await;
    let events: Vec<TestEvent> = (0..100)
        .map(|i| TestEvent::new(format!("agg-{}", i % 7)).field("n", i))
        .collect();
    let mut ids = fixture.record(&events[..50]).await.unwrap();
    let publisher = RecordingPublisher::new();
    let mut handles = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let relay = Relay::builder(fixture.store.clone(), publisher.clone())
            .poll_interval(Duration::from_millis(20))
            .build()
            .unwrap();
        handles.push(relay.handle());
        tasks.push(tokio::spawn(relay.run()));
    }
    ids.extend(fixture.record(&events[50..]).await.unwrap());
    let delivered =
        tokio::time::timeout(Duration::from_secs(30), publisher.wait_for(ids.len())).await;
    for handle in &handles {
        handle.shutdown();
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert!(
        delivered.is_ok(),
        "{} published",
        publisher.published().len()
    );
    let mut published = publisher.published_ids();
    assert_eq!(published.len(), ids.len(), "each once");
    published.sort_unstable();
    ids.sort_unstable();
    assert_eq!(published, ids);
    let mut conn = fixture.conn().await;
    assert_eq!(
        count(&mut conn, "SELECT count(*) AS n FROM outbox_events").await,
        0
    );
}
