//! The admin API on SQLite (`impl OutboxAdmin for SqliteOutboxStore`),
//! through `outbox_core::admin::Admin` and `Janitor` as the CLI and the
//! admin router drive it: each verb, its chunks and audit rows, the
//! `seq_at_most` bound of a run, the attempt history, the relay registry,
//! the purges, and a row a relay's live lease holds (waited for, then
//! reported).

use std::time::Duration;

use chrono::Utc;
use diesel_async::RunQueryDsl;
use diesel_async::pooled_connection::deadpool::Pool;
use outbox_core::admin::{
    Admin, AdminError, AttemptOutcome, Caller, EventFilter, Janitor, OutboxAdmin, PurgeTarget,
};
use outbox_core::testing::{RecordingPublisher, TestEvent, fail_claimed};
use outbox_core::{
    Claim, Claimed, DeliveryOrder, EventStatus, FailedAttempt, NextStep, OutboxStore, Relay,
    RelayRegistration,
};
use outbox_diesel::sqlite::{self, AsyncSqliteConnection, SqliteOutboxStore, SqliteSettings};
use uuid::Uuid;

use super::{TempDb, count, migrated};

/// A day in µs, as SQLite stores times.
const DAY_US: i64 = 24 * 3600 * 1_000_000;

/// A migrated file of the test's own, its pool and store.
struct Db {
    _db: TempDb,
    pool: Pool<AsyncSqliteConnection>,
    conn: tokio::sync::Mutex<AsyncSqliteConnection>,
}

impl Db {
    async fn new(test: &str) -> Db {
        let (db, conn) = migrated(test).await;
        let pool = sqlite::pool(&db.url(), 4).unwrap();
        Db {
            _db: db,
            pool,
            conn: tokio::sync::Mutex::new(conn),
        }
    }

    fn store(&self) -> SqliteOutboxStore {
        SqliteSettings::default().store(self.pool.clone())
    }

    /// Records `events` (aggregate, n) as `piece.moved` events in one
    /// transaction; returns their ids in order.
    async fn record(&self, events: &[(&str, u32)]) -> Vec<Uuid> {
        let batch: Vec<TestEvent> = events.iter().map(|(a, n)| moved(a, *n)).collect();
        let mut tx = outbox_diesel::SqliteTransaction::begin(&self.pool)
            .await
            .unwrap();
        let ids = sqlite::record_all(&mut tx, &batch).await.unwrap();
        tx.commit().await.unwrap();
        ids
    }

    /// Runs `sql` (one statement) on the test's own connection.
    async fn run(&self, sql: &str) {
        diesel::sql_query(sql)
            .execute(&mut *self.conn.lock().await)
            .await
            .unwrap();
    }

    /// `SELECT count(*) AS n FROM {table} {filter}`.
    async fn count(&self, table: &str, filter: &str) -> i64 {
        let sql = format!("SELECT count(*) AS n FROM {table} {filter}");
        count(&mut *self.conn.lock().await, &sql).await
    }
}

/// A `piece.moved` event of aggregate `piece`/`aggregate`, version `n`.
fn moved(aggregate: &str, n: u32) -> TestEvent {
    TestEvent::new(aggregate)
        .of_type("piece", "piece.moved")
        .version(i64::from(n))
        .field("n", n)
}

fn operator() -> Caller {
    Caller::operator("alice")
}

/// Claims what is claimable and marks `ids` failed with `next`.
async fn fail(store: &SqliteOutboxStore, ids: &[Uuid], error: &str, next: NextStep) {
    fail_claimed(store, ids, 5, next, |id| format!("{error} ({id})"))
        .await
        .unwrap();
}

async fn status(admin: &Admin<impl OutboxAdmin>, id: Uuid) -> EventStatus {
    admin.show(id).await.unwrap().summary.status
}

fn seq_of(claim: &impl Claim, id: Uuid) -> i64 {
    claim.records().iter().find(|r| r.id() == id).unwrap().seq
}

#[tokio::test(flavor = "multi_thread")]
async fn replaying_a_later_dead_event_leaves_it_held_until_the_earlier_one_is_replayed() {
    let db = Db::new("admin-replay-order").await;
    let store = db.store();
    let admin = Admin::new(store.clone()).chunk_size(1);
    let ids = db.record(&[("a", 0), ("a", 1), ("b", 0)]).await;
    fail(&store, &ids, "nack", NextStep::Dead).await;

    let later = admin
        .replay(&operator(), &EventFilter::id(ids[1]), false, &|_| {})
        .await
        .unwrap();
    assert_eq!((later.matched, later.changed), (1, 1));
    assert!(
        store.claim(10).await.unwrap().is_none(),
        "the later event waits behind the earlier dead one"
    );
    assert_eq!(status(&admin, ids[1]).await, EventStatus::Held);

    // The rest of aggregate `a` (the earlier one), by filter, in chunks of
    // one: `b` stays dead.
    let dead_a = EventFilter::new()
        .with_status(EventStatus::Dead)
        .with_aggregate("piece", "a");
    assert_eq!(admin.store().count(&dead_a).await.unwrap(), 1);
    let report = admin
        .replay(&operator(), &dead_a, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(report.changed, 1);
    let claim = store.claim(10).await.unwrap().unwrap();
    let got: Vec<Uuid> = claim.records().iter().map(|r| r.id()).collect();
    assert_eq!(got, [ids[0], ids[1]], "both, in order; `b` is still dead");
    claim.finish().await.unwrap();
    assert_eq!(status(&admin, ids[2]).await, EventStatus::Dead);

    let log = admin.audit_log(None, 10).await.unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(log[0].entry.action, "replay");
    assert_eq!(log[0].entry.identity, "alice");
    assert_eq!(log[0].count, 1);
    assert_eq!(log[0].entry.target["aggregate_id"], "a");
    assert_eq!(log[0].outcome.as_deref(), Some("done"));
    assert!(log[0].finished_at.is_some_and(|at| at >= log[0].at));
    let older = admin.audit_log(Some(log[0].id), 10).await.unwrap();
    assert_eq!(older.len(), 1, "a page of the log before an id");
    assert_eq!(older[0].id, log[1].id);
}

#[tokio::test(flavor = "multi_thread")]
async fn failure_groups_list_show_count_and_replay_by_group() {
    let db = Db::new("admin-groups").await;
    let store = db.store();
    let admin = Admin::new(store.clone());
    let ids = db.record(&[("a", 0), ("b", 0), ("c", 0), ("d", 0)]).await;
    fail(&store, &ids[..3], "NOT_FOUND - no exchange", NextStep::Dead).await;
    let later = Utc::now() + chrono::Duration::hours(1);
    fail(&store, &ids[3..], "NO_ROUTE", NextStep::RetryAt(later)).await;

    let groups = admin.failure_groups(&EventFilter::new()).await.unwrap();
    assert_eq!(groups.len(), 2, "{groups:#?}");
    assert_eq!((groups[0].dead, groups[0].retry), (3, 0));
    assert_eq!(groups[0].error, "NOT_FOUND - no exchange (<id>)");
    assert_eq!((groups[1].dead, groups[1].retry), (0, 1));
    let one = EventFilter::new().with_group(groups[1].id.clone());
    assert_eq!(
        admin.failure_groups(&one).await.unwrap(),
        [groups[1].clone()]
    );

    let group = EventFilter::new().with_group(groups[0].id.clone());
    assert_eq!(admin.store().count(&group).await.unwrap(), 3);
    let page = admin.list(&group, None, 2).await.unwrap();
    let first: Vec<Uuid> = page.items.iter().map(|e| e.id).collect();
    assert_eq!(first, ids[..2], "in seq order");
    let rest = admin.list(&group, page.next, 2).await.unwrap();
    assert_eq!(rest.items.len(), 1);
    assert_eq!(rest.items[0].id, ids[2]);
    assert_eq!(rest.next, None);
    let errors = admin
        .list(
            &EventFilter::new().with_error_containing("not_found"),
            None,
            10,
        )
        .await
        .unwrap();
    assert_eq!(
        errors.items.len(),
        3,
        "error text matches case-insensitively"
    );
    let by_id = EventFilter::new().with_ids([ids[1], ids[3]]);
    assert_eq!(admin.store().count(&by_id).await.unwrap(), 2);
    let occurred =
        EventFilter::new().with_occurred(None, Some(Utc::now() - chrono::Duration::hours(1)));
    assert_eq!(
        admin.store().count(&occurred).await.unwrap(),
        0,
        "all occurred now"
    );

    let detail = admin.show(ids[0]).await.unwrap();
    assert_eq!(detail.history.len(), 1);
    assert_eq!(detail.history[0].outcome, AttemptOutcome::Dead);
    assert_eq!(
        detail.history[0].error,
        format!("NOT_FOUND - no exchange ({})", ids[0])
    );
    assert_eq!(detail.group.as_deref(), Some(groups[0].id.as_str()));
    assert!(detail.payload.is_some());
    assert_eq!(detail.summary.aggregate_id, "a");

    let report = admin
        .replay(&operator(), &group, false, &|_| {})
        .await
        .unwrap();
    assert_eq!((report.matched, report.changed), (3, 3));
    for id in &ids[..3] {
        assert_eq!(status(&admin, *id).await, EventStatus::Pending);
    }
    assert_eq!(admin.audit_log(None, 1).await.unwrap()[0].count, 3);

    let retry = EventFilter::new().with_status(EventStatus::Retry);
    let now = admin
        .retry_now(&operator(), &retry, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(now.changed, 1);
    let head = admin.store().head("piece", "d").await.unwrap().unwrap();
    assert_eq!(head.id, ids[3]);
    assert!(head.next_attempt_at.unwrap() <= Utc::now());
    assert_eq!(admin.store().head("piece", "a").await.unwrap(), None);
    let again = admin
        .retry_now(&operator(), &retry, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(again.changed, 0, "a due retry is left as it is");

    let missing = admin.show(Uuid::now_v7()).await;
    assert!(
        matches!(missing, Err(AdminError::NotFound(_))),
        "{missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn skipping_a_head_releases_its_aggregate_and_the_status_counts_it() {
    let db = Db::new("admin-skip").await;
    let store = db.store();
    let admin = Admin::new(store.clone());
    let ids = db.record(&[("a", 0), ("a", 1), ("b", 0)]).await;
    fail(&store, &ids[..1], "poison", NextStep::Dead).await;
    assert!(
        store
            .claim(10)
            .await
            .unwrap()
            .is_some_and(|c| { c.records().len() == 1 && c.records()[0].id() == ids[2] })
    );
    let report = admin.status().await.unwrap();
    assert_eq!(report.counts.dead, 1);
    assert_eq!(report.counts.held, 1, "the event behind the dead one");
    assert_eq!(report.counts.pending, 1);
    assert_eq!(report.counts.sent, 0);
    assert!(!report.counts.estimated);
    assert_eq!(report.blocked_aggregates, 1);
    assert_eq!(report.by_event_type.len(), 1);
    assert_eq!(report.by_event_type[0].event_type, "piece.moved");
    assert_eq!(report.delivery_order, DeliveryOrder::PerAggregate);
    assert!(report.oldest_unsent_age_seconds.is_some());

    let dry = admin
        .skip_head(&operator(), "piece", "a", true)
        .await
        .unwrap();
    assert_eq!((dry.matched, dry.changed), (1, 0));
    assert_eq!(status(&admin, ids[0]).await, EventStatus::Dead, "a dry run");
    admin
        .skip_head(&operator(), "piece", "a", false)
        .await
        .unwrap();
    assert_eq!(status(&admin, ids[0]).await, EventStatus::Skipped);
    let claim = store.claim(10).await.unwrap().unwrap();
    let got: Vec<Uuid> = claim.records().iter().map(|r| r.id()).collect();
    assert!(got.contains(&ids[1]), "released: {got:?}");
    claim.finish().await.unwrap();
    let none = admin.skip_head(&operator(), "piece", "a", false).await;
    assert!(matches!(none, Err(AdminError::NotFound(_))), "{none:?}");
    let report = admin.status().await.unwrap();
    assert_eq!((report.counts.dead, report.counts.skipped), (0, 1));
    assert_eq!(report.blocked_aggregates, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_attempt_history_keeps_the_last_twenty() {
    let db = Db::new("admin-history").await;
    let store = db.store();
    store
        .register_relay(&RelayRegistration::new("r1", Duration::from_secs(5)))
        .await
        .unwrap();
    let ids = db.record(&[("a", 0)]).await;
    for _ in 0..25 {
        fail(&store, &ids, "nack", NextStep::RetryAt(Utc::now())).await;
    }
    let detail = Admin::new(store).show(ids[0]).await.unwrap();
    assert_eq!(detail.history.len(), outbox_core::admin::ATTEMPTS_KEPT);
    assert!(
        detail
            .history
            .iter()
            .all(|a| a.relay.as_deref() == Some("r1") && a.outcome == AttemptOutcome::Retry)
    );
    assert!(detail.history.windows(2).all(|w| w[0].at <= w[1].at));
}

#[tokio::test(flavor = "multi_thread")]
async fn relays_register_heartbeat_pause_and_deregister() {
    let db = Db::new("admin-relays").await;
    let store = db.store();
    let admin = Admin::new(store.clone());
    store
        .register_relay(&RelayRegistration::new("r1", Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(store.stats().await.unwrap().relays_live, 1);
    let relays = admin.relays().await.unwrap();
    assert_eq!(relays.len(), 1);
    assert_eq!(relays[0].name, "r1");
    assert!(relays[0].live && !relays[0].paused);
    assert!(relays[0].heartbeat_at <= Utc::now());

    admin.set_paused(&operator(), "r1", true).await.unwrap();
    assert!(store.heartbeat("r1", 2).await.unwrap().paused);
    assert_eq!(admin.relays().await.unwrap()[0].in_flight, 2);
    assert_eq!(
        store.stats().await.unwrap().relays_live,
        0,
        "a paused relay delivers nothing"
    );
    let log = admin.audit_log(None, 1).await.unwrap();
    assert_eq!((log[0].entry.action.as_str(), log[0].count), ("pause", 1));
    // Registering again (a restart under the same name) keeps the pause.
    store
        .register_relay(&RelayRegistration::new("r1", Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(store.heartbeat("r1", 0).await.unwrap().paused);
    admin.set_paused(&operator(), "r1", false).await.unwrap();
    assert!(!store.heartbeat("r1", 0).await.unwrap().paused);
    let unknown = admin.set_paused(&operator(), "nobody", true).await;
    assert!(
        matches!(unknown, Err(AdminError::NotFound(_))),
        "{unknown:?}"
    );

    // A stale heartbeat is not live.
    db.run("UPDATE outbox_relays SET heartbeat_at = heartbeat_at - 60000000")
        .await;
    assert!(!admin.relays().await.unwrap()[0].live);
    assert_eq!(store.stats().await.unwrap().relays_live, 0);
    // A paused relay's entry outlives it (the next instance starts paused),
    // also past the janitor's stale cutoff.
    admin.set_paused(&operator(), "r1", true).await.unwrap();
    store.deregister_relay("r1").await.unwrap();
    assert_eq!(store.purge_stale_relays(Utc::now()).await.unwrap(), 0);
    assert_eq!(admin.relays().await.unwrap().len(), 1);
    // Resumed and stale: the janitor's cutoff removes it.
    admin.set_paused(&operator(), "r1", false).await.unwrap();
    let cutoff = Utc::now() - chrono::Duration::seconds(30);
    assert_eq!(store.purge_stale_relays(cutoff).await.unwrap(), 1);
    assert!(admin.relays().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn purges_delete_old_sent_events_and_inbox_entries_never_dead_ones() {
    let db = Db::new("admin-purge").await;
    let store = db.store().keep_sent(true);
    let admin = Admin::new(store.clone()).chunk_size(2);
    let ids = db
        .record(&[("a", 0), ("b", 0), ("c", 0), ("d", 0), ("e", 0)])
        .await;
    let mut claim = store.claim(10).await.unwrap().unwrap();
    let sent: Vec<i64> = ids[..4].iter().map(|id| seq_of(&claim, *id)).collect();
    claim.mark_sent(&sent).await.unwrap();
    claim
        .mark_failed(&[FailedAttempt::new(
            seq_of(&claim, ids[4]),
            5,
            "x",
            NextStep::Dead,
        )])
        .await
        .unwrap();
    claim.finish().await.unwrap();
    let week_ago = Utc::now().timestamp_micros() - 8 * DAY_US;
    db.run(&format!(
        "UPDATE outbox_events SET published_at = {week_ago}, occurred_at = {week_ago}"
    ))
    .await;
    let old = Utc::now().timestamp_micros() - 20 * DAY_US;
    let values: Vec<String> = (0..5)
        .map(|_| format!("('c', '{}', {old})", Uuid::now_v7()))
        .chain([format!(
            "('c', '{}', {})",
            Uuid::now_v7(),
            Utc::now().timestamp_micros()
        )])
        .collect();
    db.run(&format!(
        "INSERT INTO inbox_events (consumer, event_id, received_at) VALUES {}",
        values.join(", ")
    ))
    .await;

    let week = Duration::from_secs(7 * 24 * 3600);
    let dry = admin
        .purge(&operator(), PurgeTarget::Sent, week, true, &|_| {})
        .await
        .unwrap();
    assert_eq!(dry.changed, 0, "a dry run");
    assert_eq!(db.count("outbox_events", "").await, 5);
    // Chunks of two rows by seq (the dead one among them): the running
    // total grows by at most two per chunk.
    let totals = std::sync::Mutex::new(vec![0]);
    let report = admin
        .purge(&operator(), PurgeTarget::Sent, week, false, &|n| {
            totals.lock().unwrap().push(n)
        })
        .await
        .unwrap();
    assert_eq!(report.changed, 4);
    let totals = totals.into_inner().unwrap();
    assert!(totals.len() >= 4, "three chunks at least: {totals:?}");
    assert!(totals.windows(2).all(|w| w[1] - w[0] <= 2), "{totals:?}");
    assert_eq!(
        db.count("outbox_events", "").await,
        1,
        "the dead event stays"
    );
    assert_eq!(db.count("outbox_attempts", "").await, 1, "with its history");

    let inbox = admin
        .purge(&operator(), PurgeTarget::Inbox, week * 2, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(inbox.changed, 5);
    assert_eq!(db.count("inbox_events", "").await, 1);
    let log = admin.audit_log(None, 10).await.unwrap();
    assert_eq!(
        log.iter()
            .map(|r| (r.entry.action.as_str(), r.count))
            .collect::<Vec<_>>(),
        [("purge_inbox", 5), ("purge_sent", 4)],
        "a dry run writes no audit row"
    );
    assert!(
        log.iter()
            .all(|r| r.outcome.as_deref() == Some("done") && r.finished_at.is_some()),
        "{log:?}"
    );
}

/// The admin and the janitor end to end on one file: a relay delivers,
/// an operator replays and skips what failed, two janitors purge what is
/// past retention in chunks, keeping what is not.
#[tokio::test(flavor = "multi_thread")]
async fn two_janitors_purge_old_sent_events_in_chunks_and_keep_the_rest() {
    let db = Db::new("admin-janitor").await;
    let store = db.store();
    let events: Vec<(String, u32)> = (0..1_200).map(|n| (format!("a{}", n % 50), n)).collect();
    let events: Vec<(&str, u32)> = events.iter().map(|(a, n)| (a.as_str(), *n)).collect();
    db.record(&events).await;
    let kept = db.record(&[("fresh", 0)]).await;
    let week_ago = Utc::now().timestamp_micros() - 8 * DAY_US;
    // Everything but the fresh event was sent a week ago; one is dead.
    db.run(&format!(
        "UPDATE outbox_events SET status = 'sent', published_at = {week_ago}, \
         occurred_at = {week_ago} WHERE id <> '{}'",
        kept[0]
    ))
    .await;
    db.run(
        "UPDATE outbox_events SET status = 'dead', published_at = NULL \
         WHERE seq = (SELECT min(seq) FROM outbox_events)",
    )
    .await;
    let month_ago = Utc::now().timestamp_micros() - 30 * DAY_US;
    let inbox: Vec<String> = (0..250)
        .map(|_| format!("('c', '{}', {month_ago})", Uuid::now_v7()))
        .collect();
    db.run(&format!(
        "INSERT INTO inbox_events (consumer, event_id, received_at) VALUES {}",
        inbox.join(", ")
    ))
    .await;
    // Records of dead letters: two settled long ago, one settled lately,
    // one still open (in its dead-letter queue).
    let now = Utc::now().timestamp_micros();
    db.run(&format!(
        "INSERT INTO inbox_dead_letters (consumer, queue, exchange, routing_key, \
           attempts, reason, payload, replayed_at, purged_at) VALUES \
         ('c', 'q', 'q.dlx', 'k', 1, 'x', '', {month_ago}, NULL), \
         ('c', 'q', 'q.dlx', 'k', 1, 'x', '', NULL, {month_ago}), \
         ('c', 'q', 'q.dlx', 'k', 1, 'x', '', {now}, NULL), \
         ('c', 'q', 'q.dlx', 'k', 1, 'x', '', NULL, NULL)"
    ))
    .await;
    let janitor = |store: SqliteOutboxStore| {
        Janitor::new(store)
            .chunk_size(100)
            .chunk_pause(Duration::ZERO)
    };
    let (first, second) = (janitor(store.clone()), janitor(db.store()));
    let (a, b) = tokio::join!(first.run_once(), second.run_once());
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.sent + b.sent, 1_199, "{a:?} {b:?}");
    assert_eq!(a.inbox + b.inbox, 250, "{a:?} {b:?}");
    assert_eq!(a.dead_letters + b.dead_letters, 2, "{a:?} {b:?}");
    assert_eq!(
        db.count("inbox_dead_letters", "").await,
        2,
        "the recent and the open one stay"
    );
    assert_eq!(
        db.count("outbox_events", "").await,
        2,
        "the dead and the fresh event"
    );
    assert_eq!(db.count("outbox_events", "WHERE status = 'dead'").await, 1);
    assert_eq!(db.count("inbox_events", "").await, 0);
    let again = janitor(store.clone()).run_once().await.unwrap();
    assert_eq!((again.sent, again.inbox, again.dead_letters), (0, 0, 0));

    // The operator's side of the same file: the dead event is replayed,
    // a relay delivers it and the fresh one, and what it sent is purged
    // once past its retention.
    let admin = Admin::new(store.clone());
    let dead = EventFilter::new().with_status(EventStatus::Dead);
    let replayed = admin
        .replay(&operator(), &dead, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(replayed.changed, 1);
    let publisher = RecordingPublisher::new();
    let relay = Relay::builder(store.clone(), publisher.clone())
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    tokio::time::timeout(Duration::from_secs(10), publisher.wait_for(2))
        .await
        .expect("the relay delivers the replayed and the fresh event");
    handle.shutdown();
    task.await.unwrap();
    assert_eq!(publisher.published_ids().len(), 2);
    let purged = Janitor::new(store)
        .sent_retention(Duration::ZERO)
        .chunk_pause(Duration::ZERO)
        .run_once()
        .await
        .unwrap();
    assert_eq!(
        purged.sent, 0,
        "sent events are deleted when sent by default"
    );
    assert_eq!(db.count("outbox_events", "").await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_skip_waits_for_a_row_a_relay_is_publishing_and_says_so_when_it_holds_it_too_long() {
    let db = Db::new("admin-leased").await;
    let store = db.store();
    let admin = Admin::new(store.clone());
    let ids = db.record(&[("a", 0)]).await;
    fail(&store, &ids, "nack", NextStep::RetryAt(Utc::now())).await;
    // A relay claims the due retry: its lease holds it while it publishes.
    let claim = store.claim(10).await.unwrap().unwrap();
    assert_eq!(claim.records()[0].id(), ids[0]);
    let release = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(status(&admin, ids[0]).await, EventStatus::Retry, "not yet");
        // The publish failed without a word: the claim ends unmarked.
        claim.finish().await.unwrap();
    };
    let caller = operator();
    let started = std::time::Instant::now();
    let skip = admin.skip(&caller, ids[0], false);
    let (report, ()) = tokio::join!(skip, release);
    let report = report.unwrap();
    assert_eq!(
        (report.matched, report.changed),
        (1, 1),
        "waited for the relay instead of skipping the event"
    );
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert_eq!(status(&admin, ids[0]).await, EventStatus::Skipped);

    // A claim that holds its row past the wait: the chunk changes nothing
    // and says so, and so does the run's audit row.
    let ids = db.record(&[("b", 0)]).await;
    fail(&store, &ids, "nack", NextStep::RetryAt(Utc::now())).await;
    let claim = store.claim(10).await.unwrap().unwrap();
    let held = admin.skip(&operator(), ids[0], false).await;
    let error = held.unwrap_err().to_string();
    assert!(error.contains("run it again"), "{error}");
    let last = admin.audit_log(None, 1).await.unwrap().remove(0);
    assert!(
        last.outcome
            .as_deref()
            .is_some_and(|o| o.starts_with("failed: ") && o.contains("run it again")),
        "{last:?}"
    );
    assert_eq!(last.count, 0);
    assert_eq!(status(&admin, ids[0]).await, EventStatus::Retry);
    // The janitor does not wait for the relay: it purges the event skipped
    // above and leaves the one the relay holds.
    let started = std::time::Instant::now();
    let purged = Janitor::new(store.clone())
        .sent_retention(Duration::ZERO)
        .chunk_pause(Duration::ZERO)
        .run_once()
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(purged.sent, 1);
    assert_eq!(db.count("outbox_events", "").await, 1);
    assert_eq!(status(&admin, ids[0]).await, EventStatus::Retry);
    claim.finish().await.unwrap();
    // Once the relay is done, the same skip goes through.
    admin.skip(&operator(), ids[0], false).await.unwrap();
    assert_eq!(status(&admin, ids[0]).await, EventStatus::Skipped);
}

#[tokio::test(flavor = "multi_thread")]
async fn sent_events_take_their_history_along_and_skipped_ones_are_kept_from_the_skip() {
    let db = Db::new("admin-history-gone").await;
    let store = db.store().keep_sent(false);
    let ids = db.record(&[("a", 0), ("b", 0)]).await;
    fail(&store, &ids, "nack", NextStep::RetryAt(Utc::now())).await;
    assert_eq!(db.count("outbox_attempts", "").await, 2);
    assert_eq!(
        db.count("outbox_events", "WHERE error_group = 'nack (<id>)'")
            .await,
        2,
        "the normalized error is stored with the error"
    );
    let mut claim = store.claim(10).await.unwrap().unwrap();
    claim.mark_sent(&[seq_of(&claim, ids[0])]).await.unwrap();
    claim.finish().await.unwrap();
    assert_eq!(
        db.count("outbox_attempts", "").await,
        1,
        "deleted with its sent event"
    );

    // Skipped today, occurred long ago: kept for the retention from the skip.
    let month_ago = Utc::now().timestamp_micros() - 30 * DAY_US;
    db.run(&format!(
        "UPDATE outbox_events SET occurred_at = {month_ago}"
    ))
    .await;
    let admin = Admin::new(store);
    admin.skip(&operator(), ids[1], false).await.unwrap();
    let week = Duration::from_secs(7 * 24 * 3600);
    admin
        .purge(&operator(), PurgeTarget::Sent, week, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(
        db.count("outbox_events", "WHERE status = 'skipped'").await,
        1
    );
    // Orphaned attempts (their event deleted by hand) go with the next purge.
    db.run(
        "INSERT INTO outbox_attempts (event_seq, at, outcome, error) VALUES (999, 0, 'retry', 'x')",
    )
    .await;
    admin
        .purge(&operator(), PurgeTarget::Sent, week, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(
        db.count("outbox_attempts", "WHERE event_seq = 999").await,
        0
    );
    assert_eq!(
        db.count("outbox_attempts", "").await,
        1,
        "the skipped one's"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_for_a_paused_relay_takes_nothing_in_either_order() {
    let db = Db::new("admin-claim-paused").await;
    let store = db.store();
    let admin = Admin::new(store.clone());
    let ids = db.record(&[("a", 0), ("b", 0)]).await;
    store
        .register_relay(&RelayRegistration::new("r1", Duration::from_secs(5)))
        .await
        .unwrap();
    for order in [DeliveryOrder::PerAggregate, DeliveryOrder::Unordered] {
        store.set_delivery_order(order).await.unwrap();
        admin.set_paused(&operator(), "r1", true).await.unwrap();
        let paused = store.claim_for("r1", 10).await.unwrap();
        assert!(matches!(paused, Claimed::Paused), "{order:?}: {paused:?}");
        // Nothing stays leased: another relay gets it all while r1 is
        // paused.
        match store.claim_for("r2", 10).await.unwrap() {
            Claimed::Batch(claim) => {
                let got: Vec<Uuid> = claim.records().iter().map(|r| r.id()).collect();
                assert_eq!(got, ids, "{order:?}");
                claim.finish().await.unwrap();
            }
            other => panic!("{order:?}: r2 claims: {other:?}"),
        }
        admin.set_paused(&operator(), "r1", false).await.unwrap();
        match store.claim_for("r1", 10).await.unwrap() {
            Claimed::Batch(claim) => {
                assert_eq!(claim.records().len(), 2, "{order:?}");
                // What that claim holds, nobody else gets.
                let empty = store.claim_for("r2", 10).await.unwrap();
                assert!(matches!(empty, Claimed::Empty), "{order:?}: {empty:?}");
                claim.finish().await.unwrap();
            }
            other => panic!("{order:?}: resumed, r1 claims: {other:?}"),
        }
    }
    assert_eq!(
        db.count("outbox_events", "WHERE status = 'pending'").await,
        2,
        "claims that end unmarked change nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_stops_a_running_relay_at_its_next_claim_and_a_resume_delivers() {
    let db = Db::new("admin-pause-claim").await;
    let admin = Admin::new(db.store());
    let first = db
        .record(&(0..5).map(|n| ("a", n)).collect::<Vec<_>>())
        .await;
    let publisher = RecordingPublisher::new();
    // One event at a time, 100 ms each: events are pending while the relay
    // runs. Heartbeats every 5 s: the pause below is read by the claims.
    publisher.set_delay(|_| Duration::from_millis(100));
    let relay = Relay::builder(db.store(), publisher.clone())
        .name("r1")
        .batch_size(1)
        // One event per claim: claims must not grow while the backlog lasts.
        .max_batch_size(1)
        .concurrency(1)
        .poll_interval(Duration::from_millis(20))
        .stats_interval(Duration::from_secs(3600))
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    tokio::time::timeout(Duration::from_secs(10), publisher.wait_for(1))
        .await
        .expect("the relay runs");

    admin.set_paused(&operator(), "r1", true).await.unwrap();
    // At most the one batch in flight (or being claimed) when the pause
    // committed is published after it.
    let in_flight = publisher.published().len() + 1;
    let later = db
        .record(&(5..8).map(|n| ("a", n)).collect::<Vec<_>>())
        .await;
    handle.notify();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let published = publisher.published_ids();
    assert!(
        published.len() <= in_flight && published.len() < first.len(),
        "nothing claimed once paused: {} published",
        published.len()
    );
    assert!(later.iter().all(|id| !published.contains(id)));
    let relays = admin.relays().await.unwrap();
    assert!(relays[0].paused);

    admin.set_paused(&operator(), "r1", false).await.unwrap();
    tokio::time::timeout(Duration::from_secs(15), publisher.wait_for(8))
        .await
        .expect("delivered once resumed");
    handle.shutdown();
    task.await.unwrap();
    let expected: Vec<Uuid> = first.iter().chain(&later).copied().collect();
    assert_eq!(publisher.published_ids(), expected, "all of them, in order");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_leaves_alone_an_event_recorded_after_it_began_that_dies_while_it_runs() {
    let db = Db::new("admin-replay-bound").await;
    let store = db.store();
    let admin = Admin::new(store.clone()).chunk_size(1);
    let ids = db.record(&[("a", 0), ("b", 0), ("c", 0)]).await;
    fail(&store, &ids, "nack", NextStep::Dead).await;

    // After the first chunk, an event recorded then dies in a relay's
    // claim (run to completion inside the synchronous progress callback).
    let late = std::sync::Mutex::new(None);
    let dead = EventFilter::new().with_status(EventStatus::Dead);
    let report = admin
        .replay(&operator(), &dead, false, &|_| {
            let mut late = late.lock().unwrap();
            if late.is_none() {
                let id = tokio::task::block_in_place(|| {
                    tokio::runtime::Handle::current().block_on(async {
                        let id = db.record(&[("late", 0)]).await[0];
                        fail(&store, &[id], "nack", NextStep::Dead).await;
                        id
                    })
                });
                *late = Some(id);
            }
        })
        .await
        .unwrap();
    let late = late.into_inner().unwrap().expect("killed between chunks");
    assert_eq!(
        status(&admin, late).await,
        EventStatus::Dead,
        "not replayed"
    );
    assert_eq!((report.matched, report.changed), (3, 3));
    for id in &ids {
        assert_eq!(status(&admin, *id).await, EventStatus::Pending);
    }
    let log = admin.audit_log(None, 1).await.unwrap();
    assert_eq!(log[0].count, 3);
    assert_eq!(
        log[0].entry.target["seq_at_most"],
        store.last_seq().await.unwrap().unwrap() - 1,
        "the audit row says where the run stopped: before the late event"
    );
}
