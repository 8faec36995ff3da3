//! The relay store on MariaDB: the store contracts every back end keeps
//! (`outbox_core::testing::conformance`), and what is MariaDB's own: two
//! claims never overlap, a claim does not block producers, held events are
//! released without a trigger, a hung claim is ended by the server.

use std::time::Duration;

use diesel_async::AsyncMysqlConnection;
use diesel_async::pooled_connection::deadpool::Pool;
use outbox_core::testing::TestEvent;
use outbox_core::testing::conformance::{self, Fixture, RecordError, Refusal};
use outbox_core::{Claim, Claimed, FailedAttempt, NextStep, OutboxStore};
use outbox_diesel::Error;
use outbox_diesel::mysql::{self, MysqlOutboxStore, MysqlSettings};
use outbox_testkit::mysql::TestMysqlDatabase;

use super::{count, migrated};

/// A migrated database of the test's own, under the conformance checks.
struct MysqlFixture {
    db: TestMysqlDatabase,
    pool: Pool<AsyncMysqlConnection>,
    store: MysqlOutboxStore,
}

impl MysqlFixture {
    async fn new(test: &str) -> MysqlFixture {
        let (db, _conn) = migrated(test).await;
        let pool = mysql::pool(db.url(), 4).unwrap();
        let store = MysqlSettings::default().store(pool.clone());
        MysqlFixture { db, pool, store }
    }

    async fn conn(&self) -> AsyncMysqlConnection {
        mysql::connect(self.db.url()).await.unwrap()
    }
}

impl Fixture for MysqlFixture {
    type Store = MysqlOutboxStore;

    fn store(&self) -> &MysqlOutboxStore {
        &self.store
    }

    async fn record(&self, events: &[TestEvent]) -> Result<Vec<uuid::Uuid>, RecordError> {
        let mut tx = outbox_diesel::MysqlTransaction::begin(&self.pool).await?;
        let ids = mysql::record_all(&mut tx, events).await?;
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

#[tokio::test]
async fn marks_refuse_seqs_not_in_the_claim() {
    let fixture = MysqlFixture::new("notinclaim").await;
    conformance::marks_refuse_seqs_not_in_the_claim(&fixture)
        .await
        .unwrap();
}

#[tokio::test]
async fn marks_refuse_a_seq_named_twice() {
    let fixture = MysqlFixture::new("twice").await;
    conformance::marks_refuse_a_seq_named_twice(&fixture)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_dead_event_holds_back_only_its_aggregate() {
    let fixture = MysqlFixture::new("deadhead").await;
    conformance::a_dead_event_holds_back_only_its_aggregate(&fixture)
        .await
        .unwrap();
}

async fn batch(store: &MysqlOutboxStore, limit: usize) -> outbox_diesel::mysql::MysqlClaim {
    store.claim(limit).await.unwrap().expect("a batch")
}

fn aggregates(claim: &impl Claim) -> Vec<String> {
    claim
        .records()
        .iter()
        .map(|r| r.envelope.aggregate_id.clone())
        .collect()
}

/// Two relays claim at once: the second skips the rows the first holds
/// locked and takes the next whole aggregates; neither takes a row of an
/// aggregate whose earlier row the other holds.
#[tokio::test]
async fn two_claims_never_overlap_and_keep_each_aggregate_whole() {
    let fixture = MysqlFixture::new("overlap").await;
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
        "everything is held by the two claims"
    );
    for mut claim in [first, second] {
        let seqs: Vec<i64> = claim.records().iter().map(|r| r.seq).collect();
        claim.mark_sent(&seqs).await.unwrap();
        claim.finish().await.unwrap();
    }

    // Interleaved aggregates: a second claim finds every aggregate's
    // earlier rows held, and takes nothing rather than a gap.
    let interleaved: Vec<TestEvent> = (0..2)
        .flat_map(|i| ["e", "f"].map(|a| TestEvent::new(a).field("n", i)))
        .collect();
    fixture.record(&interleaved).await.unwrap();
    let first = batch(&fixture.store, 2).await;
    assert_eq!(aggregates(&first), ["e", "f"]);
    assert!(fixture.store.claim(2).await.unwrap().is_none());
    first.finish().await.unwrap();
}

/// A claim holds its rows locked while the batch is published; a producer
/// records new events meanwhile without waiting (READ COMMITTED: no gap
/// locks), and they are claimed next.
#[tokio::test]
async fn an_open_claim_does_not_block_producers() {
    let fixture = MysqlFixture::new("producers").await;
    fixture.record(&[TestEvent::new("a")]).await.unwrap();
    let claim = batch(&fixture.store, 10).await;
    let recorded = tokio::time::timeout(
        Duration::from_secs(5),
        fixture.record(&[TestEvent::new("a"), TestEvent::new("b")]),
    )
    .await
    .expect("a producer waited for the claim's locks")
    .unwrap();
    assert_eq!(recorded.len(), 2);
    let seqs: Vec<i64> = claim.records().iter().map(|r| r.seq).collect();
    let mut claim = claim;
    claim.mark_sent(&seqs).await.unwrap();
    claim.finish().await.unwrap();
    let next = batch(&fixture.store, 10).await;
    assert_eq!(aggregates(&next), ["a", "b"]);
    next.finish().await.unwrap();
}

/// A retry that is finally sent releases the events held behind it, in
/// the same transaction (PostgreSQL's trigger; explicit here).
#[tokio::test]
async fn a_sent_retry_releases_the_events_held_behind_it() {
    let fixture = MysqlFixture::new("release").await;
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
        count(&mut conn, "SELECT COUNT(*) AS n FROM outbox_attempts").await,
        1,
        "the failed attempt is kept"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) AS n FROM outbox_events WHERE status = 'held'"
        )
        .await,
        1,
        "the second event of `a` waits behind its failed head"
    );
    let mut retry = batch(&fixture.store, 10).await;
    assert_eq!(
        retry.records().len(),
        1,
        "only the due head, not the held one"
    );
    assert_eq!(retry.records()[0].seq, head);
    retry.mark_sent(&[head]).await.unwrap();
    retry.finish().await.unwrap();
    assert_eq!(
        count(
            &mut conn,
            "SELECT COUNT(*) AS n FROM outbox_events WHERE status = 'held'"
        )
        .await,
        0
    );
    let rest = batch(&fixture.store, 10).await;
    assert_eq!(aggregates(&rest), ["a"]);
    rest.finish().await.unwrap();
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) AS n FROM outbox_attempts").await,
        0,
        "a sent event's history goes with it"
    );
}

/// A claim whose relay went away (its future dropped, the connection
/// kept by nobody) is ended by the server after the claim timeout, and its
/// rows are claimed again.
#[tokio::test]
async fn a_hung_claim_is_rolled_back_by_the_server() {
    let fixture = MysqlFixture::new("hung").await;
    let store = fixture.store.clone().claim_timeout(Duration::from_secs(1));
    fixture.record(&[TestEvent::new("a")]).await.unwrap();
    let claim = batch(&store, 10).await;
    assert!(
        store.claim(10).await.unwrap().is_none(),
        "locked by the first claim"
    );
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let again = batch(&store, 10).await;
    assert_eq!(aggregates(&again), ["a"]);
    again.finish().await.unwrap();
    let error = claim.finish().await.unwrap_err();
    assert!(
        matches!(error, Error::Database(_) | Error::NotCommitted { .. }),
        "{error}"
    );
}

#[tokio::test]
async fn stats_purge_and_the_relay_registry() {
    let fixture = MysqlFixture::new("stats").await;
    let store = fixture.store.clone().keep_sent(true);
    fixture
        .record(&[TestEvent::new("a"), TestEvent::new("b")])
        .await
        .unwrap();
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.backlog, 2);
    assert!(stats.oldest_unsent_age.is_some());
    let mut claim = batch(&store, 10).await;
    let seqs: Vec<i64> = claim.records().iter().map(|r| r.seq).collect();
    claim.mark_sent(&seqs).await.unwrap();
    claim.finish().await.unwrap();
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.backlog, stats.dead), (0, 0));
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
        "UPDATE outbox_relays SET paused = TRUE",
    )
    .await
    .unwrap();
    assert!(store.heartbeat("relay-1", 0).await.unwrap().paused);
    assert!(matches!(
        store.claim_for("relay-1", 10).await.unwrap(),
        Claimed::Paused
    ));
    store.deregister_relay("relay-1").await.unwrap();
    assert_eq!(
        count(&mut conn, "SELECT COUNT(*) AS n FROM outbox_relays").await,
        1,
        "a paused relay keeps its row"
    );
}
