//! The admin API on MariaDB (`OutboxAdmin` for `MysqlOutboxStore`), the
//! PostgreSQL tests of `tests/admin.rs` ported: each verb, its chunks and
//! audit rows, the `seq_at_most` bound, the attempt history, the relay
//! registry, the purges (dead never purged, rows a claim holds skipped or
//! waited for), and `Admin` with the `Janitor` and a relay end to end.

use std::time::Duration;

use chrono::Utc;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::{AsyncMysqlConnection, SimpleAsyncConnection};
use outbox_core::admin::{
    Admin, AdminError, AttemptOutcome, Caller, EventFilter, Janitor, OutboxAdmin, PurgeTarget,
};
use outbox_core::testing::{RecordingPublisher, TestEvent, fail_claimed};
use outbox_core::{
    Claim, EventStatus, FailedAttempt, NextStep, OutboxStore, Relay, RelayRegistration,
};
use outbox_diesel::mysql::{self, MysqlOutboxStore, MysqlSettings};
use outbox_testkit::mysql::TestMysqlDatabase;
use uuid::Uuid;

use super::{count, migrated};

/// A migrated database of the test's own, a pool and the store on it.
struct Db {
    db: TestMysqlDatabase,
    pool: Pool<AsyncMysqlConnection>,
    store: MysqlOutboxStore,
}

impl Db {
    async fn new(test: &str) -> Db {
        let (db, _conn) = migrated(test).await;
        let pool = mysql::pool(db.url(), 6).unwrap();
        let store = MysqlSettings::default().store(pool.clone()).keep_sent(true);
        Db { db, pool, store }
    }

    async fn conn(&self) -> AsyncMysqlConnection {
        mysql::connect(self.db.url()).await.unwrap()
    }

    async fn execute(&self, sql: &str) {
        self.conn().await.batch_execute(sql).await.unwrap();
    }

    /// `SELECT COUNT(*) AS n FROM <table> <filter>`.
    async fn count(&self, table: &str, filter: &str) -> i64 {
        count(
            &mut self.conn().await,
            &format!("SELECT COUNT(*) AS n FROM {table} {filter}"),
        )
        .await
    }

    /// Records `events` (aggregate, n) as `piece.moved` events of
    /// aggregate type `piece`, 500 a transaction; their ids in order.
    async fn record(&self, events: &[(&str, u32)]) -> Vec<Uuid> {
        let mut ids = Vec::new();
        for chunk in events.chunks(500) {
            let batch: Vec<TestEvent> = chunk.iter().map(|(a, n)| moved(a, *n)).collect();
            let mut tx = outbox_diesel::MysqlTransaction::begin(&self.pool)
                .await
                .unwrap();
            ids.extend(mysql::record_all(&mut tx, &batch).await.unwrap());
            tx.commit().await.unwrap();
        }
        ids
    }

    /// Claims what is claimable and marks `ids` failed with `next`, each
    /// with error "`error` (<its id>)".
    async fn fail(&self, ids: &[Uuid], error: &str, next: NextStep) {
        fail_claimed(&self.store, ids, 5, next, |id| format!("{error} ({id})"))
            .await
            .unwrap();
    }
}

fn moved(aggregate: &str, n: u32) -> TestEvent {
    TestEvent::new(aggregate)
        .of_type("piece", "piece.moved")
        .version(i64::from(n))
        .field("n", n)
}

fn operator() -> Caller {
    Caller::operator("alice")
}

async fn status(admin: &Admin<impl OutboxAdmin>, id: Uuid) -> EventStatus {
    admin.show(id).await.unwrap().summary.status
}

const WEEK: Duration = Duration::from_secs(7 * 24 * 3600);

#[tokio::test]
async fn replaying_a_later_dead_event_leaves_it_held_until_the_earlier_one_is_replayed() {
    let db = Db::new("adm_replay_order").await;
    let store = db.store.clone();
    let admin = Admin::new(store.clone()).chunk_size(1);
    let ids = db.record(&[("a", 0), ("a", 1), ("b", 0)]).await;
    db.fail(&ids, "nack", NextStep::Dead).await;

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
    // one: its replay releases the held one in the same transaction.
    let dead_a = EventFilter::new()
        .with_status(EventStatus::Dead)
        .with_aggregate("piece", "a");
    let report = admin
        .replay(&operator(), &dead_a, false, &|_| {})
        .await
        .unwrap();
    assert_eq!((report.matched, report.changed), (1, 1));
    assert_eq!(status(&admin, ids[1]).await, EventStatus::Pending);
    let claim = store.claim(10).await.unwrap().unwrap();
    let got: Vec<Uuid> = claim.records().iter().map(|r| r.id()).collect();
    assert_eq!(got, [ids[0], ids[1]], "both, in order; `b` is still dead");
    drop(claim);
    assert_eq!(status(&admin, ids[2]).await, EventStatus::Dead);

    let log = admin.audit_log(None, 10).await.unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(log[0].entry.action, "replay");
    assert_eq!(log[0].entry.identity, "alice");
    assert_eq!(log[0].count, 1);
    assert_eq!(log[0].entry.target["aggregate_id"], "a");
    assert_eq!(log[0].outcome.as_deref(), Some("done"));
    assert!(log[0].id > log[1].id, "newest first");
    let older = admin.audit_log(Some(log[0].id), 10).await.unwrap();
    assert_eq!(older.len(), 1);
    assert_eq!(older[0].id, log[1].id);
}

#[tokio::test]
async fn failure_groups_list_count_show_and_replay_by_group() {
    let db = Db::new("adm_groups").await;
    let admin = Admin::new(db.store.clone());
    let ids = db.record(&[("a", 0), ("b", 0), ("c", 0), ("d", 0)]).await;
    db.fail(&ids[..3], "NOT_FOUND - no exchange", NextStep::Dead)
        .await;
    let later = Utc::now() + chrono::Duration::hours(1);
    db.fail(&ids[3..], "NO_ROUTE", NextStep::RetryAt(later))
        .await;

    let groups = admin.failure_groups(&EventFilter::new()).await.unwrap();
    assert_eq!(groups.len(), 2, "{groups:#?}");
    assert_eq!((groups[0].dead, groups[0].retry), (3, 0));
    assert_eq!(groups[0].error, "NOT_FOUND - no exchange (<id>)");
    assert_eq!((groups[1].dead, groups[1].retry), (0, 1));

    let group = EventFilter::new().with_group(groups[0].id.clone());
    let page = admin.list(&group, None, 2).await.unwrap();
    assert_eq!(page.items.len(), 2);
    assert_eq!(page.next, Some(page.items[1].seq));
    let rest = admin.list(&group, page.next, 2).await.unwrap();
    assert_eq!(rest.items.len(), 1);
    assert_eq!(rest.next, None);
    assert_eq!(admin.store().count(&group).await.unwrap(), 3);
    let errors = EventFilter::new().with_error_containing("not_found");
    assert_eq!(
        admin.list(&errors, None, 10).await.unwrap().items.len(),
        3,
        "error text matches case-insensitively"
    );

    // Every other condition, alone and together, selects what it says.
    let store = admin.store();
    let by_ids = EventFilter::new().with_ids([ids[1], ids[3]]);
    assert_eq!(store.count(&by_ids).await.unwrap(), 2);
    let one = by_ids
        .clone()
        .with_aggregate("piece", "d")
        .with_event_type("piece.moved")
        .with_status(EventStatus::Retry);
    let listed = admin.list(&one, None, 10).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].id, ids[3]);
    assert_eq!(
        store
            .count(&EventFilter::new().with_aggregate_type("piece"))
            .await
            .unwrap(),
        4
    );
    assert_eq!(
        store
            .count(&EventFilter::new().with_aggregate("piece", "A"))
            .await
            .unwrap(),
        0,
        "aggregate ids compare byte for byte"
    );
    assert_eq!(
        store
            .count(&EventFilter::new().with_event_type("other"))
            .await
            .unwrap(),
        0
    );
    let hour = chrono::Duration::hours(1);
    let now = Utc::now();
    let within = EventFilter::new().with_occurred(Some(now - hour), Some(now + hour));
    assert_eq!(store.count(&within).await.unwrap(), 4);
    let before = EventFilter::new().with_occurred(None, Some(now - hour));
    assert_eq!(store.count(&before).await.unwrap(), 0);
    let first_two = EventFilter::new().with_seq_at_most(listed.items[0].seq - 2);
    assert_eq!(store.count(&first_two).await.unwrap(), 2);
    assert_eq!(
        store.last_seq().await.unwrap(),
        Some(listed.items[0].seq),
        "the last recorded event"
    );

    let detail = admin.show(ids[0]).await.unwrap();
    assert_eq!(detail.history.len(), 1);
    assert_eq!(detail.history[0].outcome, AttemptOutcome::Dead);
    assert_eq!(detail.group.as_deref(), Some(groups[0].id.as_str()));
    assert!(detail.payload.is_some());

    let report = admin
        .replay(&operator(), &group, false, &|_| {})
        .await
        .unwrap();
    assert_eq!((report.matched, report.changed), (3, 3));
    for id in &ids[..3] {
        assert_eq!(status(&admin, *id).await, EventStatus::Pending);
    }

    let retry = EventFilter::new().with_status(EventStatus::Retry);
    let dry = admin
        .retry_now(&operator(), &retry, true, &|_| {})
        .await
        .unwrap();
    assert_eq!((dry.matched, dry.changed), (1, 0));
    let head = admin.store().head("piece", "d").await.unwrap().unwrap();
    assert!(head.next_attempt_at.unwrap() > Utc::now(), "a dry run");
    let now = admin
        .retry_now(&operator(), &retry, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(now.changed, 1);
    let head = admin.store().head("piece", "d").await.unwrap().unwrap();
    assert_eq!(head.id, ids[3]);
    assert!(head.next_attempt_at.unwrap() <= Utc::now());
    assert!(admin.store().head("piece", "a").await.unwrap().is_none());
    let log = admin.audit_log(None, 1).await.unwrap();
    assert_eq!(
        (log[0].entry.action.as_str(), log[0].count),
        ("retry_now", 1)
    );

    let missing = admin.show(Uuid::now_v7()).await;
    assert!(
        matches!(missing, Err(AdminError::NotFound(_))),
        "{missing:?}"
    );
}

#[tokio::test]
async fn skipping_a_head_releases_its_aggregate_and_the_status_counts_it() {
    let db = Db::new("adm_skip").await;
    let store = db.store.clone();
    let admin = Admin::new(store.clone());
    let ids = db.record(&[("a", 0), ("a", 1), ("b", 0)]).await;
    db.fail(&ids[..1], "poison", NextStep::Dead).await;
    // The claim that failed `a`'s head held the event behind it.
    assert_eq!(status(&admin, ids[1]).await, EventStatus::Held);
    let report = admin.status().await.unwrap();
    assert_eq!(report.counts.dead, 1);
    assert_eq!(report.counts.held, 1);
    assert_eq!(report.counts.pending, 1, "b");
    assert_eq!(report.blocked_aggregates, 1);
    assert_eq!(report.by_event_type.len(), 1);
    assert_eq!(report.by_event_type[0].counts.dead, 1);
    assert!(!report.counts.estimated);

    let dry = admin
        .skip_head(&operator(), "piece", "a", true)
        .await
        .unwrap();
    assert_eq!((dry.matched, dry.changed), (1, 0));
    assert_eq!(status(&admin, ids[0]).await, EventStatus::Dead);
    admin
        .skip_head(&operator(), "piece", "a", false)
        .await
        .unwrap();
    assert_eq!(status(&admin, ids[0]).await, EventStatus::Skipped);
    assert_eq!(
        status(&admin, ids[1]).await,
        EventStatus::Pending,
        "released by the skip's transaction"
    );
    let claim = store.claim(10).await.unwrap().unwrap();
    let got: Vec<Uuid> = claim.records().iter().map(|r| r.id()).collect();
    assert_eq!(got, [ids[1], ids[2]]);
    drop(claim);
    let none = admin.skip_head(&operator(), "piece", "a", false).await;
    assert!(matches!(none, Err(AdminError::NotFound(_))), "{none:?}");
    let report = admin.status().await.unwrap();
    assert_eq!((report.counts.dead, report.counts.skipped), (0, 1));
    assert_eq!(report.blocked_aggregates, 0);

    // A retrying head, skipped by id, releases what it held back too.
    let c = db.record(&[("c", 0), ("c", 1)]).await;
    let later = Utc::now() + chrono::Duration::hours(1);
    db.fail(&c[..1], "nack", NextStep::RetryAt(later)).await;
    assert_eq!(status(&admin, c[1]).await, EventStatus::Held);
    let skipped = admin.skip(&operator(), c[0], false).await.unwrap();
    assert_eq!((skipped.matched, skipped.changed), (1, 1));
    assert_eq!(status(&admin, c[0]).await, EventStatus::Skipped);
    assert_eq!(status(&admin, c[1]).await, EventStatus::Pending);
}

#[tokio::test]
async fn the_attempt_history_keeps_the_last_twenty() {
    let db = Db::new("adm_history").await;
    db.store
        .register_relay(&RelayRegistration::new("r1", Duration::from_secs(5)))
        .await
        .unwrap();
    let ids = db.record(&[("a", 0)]).await;
    for _ in 0..25 {
        db.fail(&ids, "nack", NextStep::RetryAt(Utc::now())).await;
    }
    let detail = Admin::new(db.store.clone()).show(ids[0]).await.unwrap();
    assert_eq!(detail.history.len(), outbox_core::admin::ATTEMPTS_KEPT);
    assert!(
        detail
            .history
            .iter()
            .all(|a| a.relay.as_deref() == Some("r1") && a.outcome == AttemptOutcome::Retry)
    );
    assert!(detail.history.windows(2).all(|w| w[0].at <= w[1].at));
    assert_eq!(detail.summary.attempts, 5);
}

#[tokio::test]
async fn relays_register_heartbeat_pause_and_deregister() {
    let db = Db::new("adm_relays").await;
    let store = db.store.clone();
    let admin = Admin::new(store.clone());
    store
        .register_relay(&RelayRegistration::new("r1", Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(store.stats().await.unwrap().relays_live, 1);
    let relays = admin.relays().await.unwrap();
    assert_eq!(relays[0].name, "r1");
    assert!(relays[0].live && !relays[0].paused);

    admin.set_paused(&operator(), "r1", true).await.unwrap();
    assert!(store.heartbeat("r1", 2).await.unwrap().paused);
    assert_eq!(
        store.stats().await.unwrap().relays_live,
        0,
        "a paused relay delivers nothing"
    );
    assert_eq!(admin.relays().await.unwrap()[0].in_flight, 2);
    // Pausing a paused relay finds it (and counts it), an unknown one not.
    assert!(store.set_paused("r1", true, 0).await.unwrap());
    assert!(!store.set_paused("nobody", true, 0).await.unwrap());
    // Registering again (a restart under the same name) keeps the pause.
    store
        .register_relay(&RelayRegistration::new("r1", Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(store.heartbeat("r1", 0).await.unwrap().paused);
    admin.set_paused(&operator(), "r1", false).await.unwrap();
    assert!(!store.heartbeat("r1", 0).await.unwrap().paused);
    let log = admin.audit_log(None, 10).await.unwrap();
    assert_eq!(log.len(), 2);
    assert!(log.iter().all(|r| r.count == 1), "{log:?}");

    // A stale heartbeat is not live, and the janitor's cutoff removes it.
    db.execute("UPDATE outbox_relays SET heartbeat_at = UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE")
        .await;
    assert!(!admin.relays().await.unwrap()[0].live);
    assert_eq!(store.stats().await.unwrap().relays_live, 0);
    // A paused relay's entry outlives it (the next instance starts
    // paused), also past the janitor's stale cutoff.
    admin.set_paused(&operator(), "r1", true).await.unwrap();
    store.deregister_relay("r1").await.unwrap();
    assert_eq!(store.purge_stale_relays(Utc::now()).await.unwrap(), 0);
    assert_eq!(admin.relays().await.unwrap().len(), 1);
    admin.set_paused(&operator(), "r1", false).await.unwrap();
    assert_eq!(
        store
            .purge_stale_relays(Utc::now() - chrono::Duration::hours(1))
            .await
            .unwrap(),
        0,
        "heard of within the cutoff"
    );
    assert_eq!(store.purge_stale_relays(Utc::now()).await.unwrap(), 1);
    assert!(admin.relays().await.unwrap().is_empty());
}

#[tokio::test]
async fn purges_delete_old_sent_events_and_inbox_entries_never_dead_ones() {
    let db = Db::new("adm_purge").await;
    let store = db.store.clone();
    let admin = Admin::new(store.clone()).chunk_size(2);
    let ids = db
        .record(&[("a", 0), ("b", 0), ("c", 0), ("d", 0), ("e", 0)])
        .await;
    let mut claim = store.claim(10).await.unwrap().unwrap();
    let seq = |id: Uuid| claim.records().iter().find(|r| r.id() == id).unwrap().seq;
    let sent: Vec<i64> = ids[..4].iter().map(|id| seq(*id)).collect();
    let dead = FailedAttempt::new(seq(ids[4]), 5, "x", NextStep::Dead);
    claim.mark_sent(&sent).await.unwrap();
    claim.mark_failed(&[dead]).await.unwrap();
    claim.finish().await.unwrap();
    db.execute(
        "UPDATE outbox_events SET published_at = UTC_TIMESTAMP(6) - INTERVAL 8 DAY, \
         occurred_at = UTC_TIMESTAMP(6) - INTERVAL 8 DAY",
    )
    .await;
    db.execute(
        "INSERT INTO inbox_events (consumer, event_id, received_at) \
         SELECT 'c', UUID(), UTC_TIMESTAMP(6) - INTERVAL 20 DAY FROM seq_1_to_5; \
         INSERT INTO inbox_events (consumer, event_id) VALUES ('c', UUID())",
    )
    .await;

    let dry = admin
        .purge(&operator(), PurgeTarget::Sent, WEEK, true, &|_| {})
        .await
        .unwrap();
    assert_eq!(dry.changed, 0);
    assert_eq!(db.count("outbox_events", "").await, 5);
    let report = admin
        .purge(&operator(), PurgeTarget::Sent, WEEK, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(report.changed, 4);
    assert_eq!(
        db.count("outbox_events", "").await,
        1,
        "the dead event stays"
    );
    assert_eq!(db.count("outbox_attempts", "").await, 1, "with its history");

    let inbox = admin
        .purge(&operator(), PurgeTarget::Inbox, WEEK * 2, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(inbox.changed, 5);
    assert_eq!(db.count("inbox_events", "").await, 1);
    let log = admin.audit_log(None, 10).await.unwrap();
    assert_eq!(
        log.iter()
            .map(|r| (r.entry.action.as_str(), r.count))
            .collect::<Vec<_>>(),
        [("purge_inbox", 5), ("purge_sent", 4)]
    );
    assert!(
        log.iter()
            .all(|r| r.outcome.as_deref() == Some("done") && r.finished_at.is_some()),
        "{log:?}"
    );
}

#[tokio::test]
async fn two_janitors_purge_old_sent_events_in_chunks_and_keep_the_rest() {
    let db = Db::new("adm_janitor").await;
    let names: Vec<String> = (0..50).map(|n| format!("a{n}")).collect();
    let events: Vec<(&str, u32)> = (0..1_200u32)
        .map(|n| (names[n as usize % 50].as_str(), n))
        .collect();
    db.record(&events).await;
    let kept = db.record(&[("fresh", 0)]).await;
    // Everything but the fresh event was sent a week ago; one is dead.
    db.execute(&format!(
        "UPDATE outbox_events SET status = 'sent', \
           published_at = UTC_TIMESTAMP(6) - INTERVAL 8 DAY, \
           occurred_at = UTC_TIMESTAMP(6) - INTERVAL 8 DAY WHERE id <> '{}'; \
         UPDATE outbox_events SET status = 'dead', published_at = NULL ORDER BY seq LIMIT 1; \
         INSERT INTO inbox_events (consumer, event_id, received_at) \
           SELECT 'c', UUID(), UTC_TIMESTAMP(6) - INTERVAL 30 DAY FROM seq_1_to_250; \
         INSERT INTO inbox_dead_letters (consumer, queue, exchange, routing_key, attempts, \
           reason, payload, replayed_at, purged_at) VALUES \
           ('c', 'q', 'q.dlx', 'k', 1, 'x', '', UTC_TIMESTAMP(6) - INTERVAL 30 DAY, NULL), \
           ('c', 'q', 'q.dlx', 'k', 1, 'x', '', NULL, UTC_TIMESTAMP(6) - INTERVAL 30 DAY), \
           ('c', 'q', 'q.dlx', 'k', 1, 'x', '', UTC_TIMESTAMP(6), NULL), \
           ('c', 'q', 'q.dlx', 'k', 1, 'x', '', NULL, NULL)",
        kept[0]
    ))
    .await;
    // Attempt rows whose event was deleted by hand go too.
    db.execute(
        "INSERT INTO outbox_attempts (event_seq, outcome, error) VALUES (-1, 'retry', 'gone')",
    )
    .await;
    let janitor = |store: MysqlOutboxStore| {
        Janitor::new(store)
            .chunk_size(100)
            .chunk_pause(Duration::ZERO)
    };
    let other = MysqlSettings::default().store(mysql::pool(db.db.url(), 4).unwrap());
    let (first, second) = (janitor(db.store.clone()), janitor(other));
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
    assert_eq!(db.count("outbox_attempts", "").await, 0);
    let again = janitor(db.store.clone()).run_once().await.unwrap();
    assert_eq!((again.sent, again.inbox, again.dead_letters), (0, 0, 0));
}

/// Opens a transaction on `conn` that locks event `id` as a claim does.
async fn hold(conn: &mut AsyncMysqlConnection, id: Uuid) {
    conn.batch_execute(&format!(
        "BEGIN; SELECT seq FROM outbox_events WHERE id = '{id}' FOR UPDATE"
    ))
    .await
    .unwrap();
}

#[tokio::test]
async fn a_replay_waits_for_a_row_a_relay_holds_and_says_so_when_it_holds_it_too_long() {
    let db = Db::new("adm_locked").await;
    let admin = Admin::new(db.store.clone());
    let ids = db.record(&[("a", 0)]).await;
    db.fail(&ids, "nack", NextStep::Dead).await;
    let mut holder = db.conn().await;
    hold(&mut holder, ids[0]).await;
    let release = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        holder.batch_execute("COMMIT").await.unwrap();
    };
    let (caller, one) = (operator(), EventFilter::id(ids[0]));
    let replay = admin.replay(&caller, &one, false, &|_| {});
    let (report, ()) = tokio::join!(replay, release);
    let report = report.unwrap();
    assert_eq!(
        (report.matched, report.changed),
        (1, 1),
        "waited for the holder instead of skipping the event"
    );

    db.fail(&ids, "nack", NextStep::Dead).await;
    hold(&mut holder, ids[0]).await;
    let held = admin
        .replay(&operator(), &EventFilter::id(ids[0]), false, &|_| {})
        .await;
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
    holder.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(status(&admin, ids[0]).await, EventStatus::Dead);
}

#[tokio::test]
async fn a_purge_skips_a_sent_row_another_transaction_holds_and_a_later_run_takes_it() {
    let db = Db::new("adm_purge_held").await;
    let admin = Admin::new(db.store.clone());
    let ids = db.record(&[("a", 0), ("b", 0)]).await;
    db.execute(
        "UPDATE outbox_events SET status = 'sent', \
         published_at = UTC_TIMESTAMP(6) - INTERVAL 8 DAY",
    )
    .await;
    let mut holder = db.conn().await;
    hold(&mut holder, ids[0]).await;
    let report = tokio::time::timeout(
        Duration::from_secs(3),
        admin.purge(&operator(), PurgeTarget::Sent, WEEK, false, &|_| {}),
    )
    .await
    .expect("skipped, not waited for")
    .unwrap();
    assert_eq!(report.changed, 1);
    holder.batch_execute("COMMIT").await.unwrap();
    let later = admin
        .purge(&operator(), PurgeTarget::Sent, WEEK, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(later.changed, 1);
    assert_eq!(db.count("outbox_events", "").await, 0);
}

#[tokio::test]
async fn sent_events_take_their_history_along_and_skipped_ones_are_kept_from_the_skip() {
    let db = Db::new("adm_history_gone").await;
    let store = MysqlSettings::default()
        .store(db.pool.clone())
        .keep_sent(false);
    let ids = db.record(&[("a", 0), ("b", 0)]).await;
    fail_claimed(&store, &ids, 5, NextStep::RetryAt(Utc::now()), |id| {
        format!("nack ({id})")
    })
    .await
    .unwrap();
    assert_eq!(db.count("outbox_attempts", "").await, 2);
    assert_eq!(
        db.count("outbox_events", "WHERE error_group = 'nack (<id>)'")
            .await,
        2,
        "the normalized error is stored with the error"
    );
    let mut claim = store.claim(10).await.unwrap().unwrap();
    let first = claim
        .records()
        .iter()
        .find(|r| r.id() == ids[0])
        .unwrap()
        .seq;
    claim.mark_sent(&[first]).await.unwrap();
    claim.finish().await.unwrap();
    assert_eq!(
        db.count("outbox_attempts", "").await,
        1,
        "deleted with its sent event"
    );

    // Skipped today, occurred long ago: kept for the retention from the skip.
    db.execute("UPDATE outbox_events SET occurred_at = UTC_TIMESTAMP(6) - INTERVAL 30 DAY")
        .await;
    let admin = Admin::new(store);
    admin.skip(&operator(), ids[1], false).await.unwrap();
    admin
        .purge(&operator(), PurgeTarget::Sent, WEEK, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(
        db.count("outbox_events", "WHERE status = 'skipped'").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_leaves_alone_an_event_recorded_after_it_began_that_dies_while_it_runs() {
    let db = Db::new("adm_replay_bound").await;
    let store = db.store.clone();
    let admin = Admin::new(store.clone()).chunk_size(1);
    let ids = db.record(&[("a", 0), ("b", 0), ("c", 0)]).await;
    db.fail(&ids, "nack", NextStep::Dead).await;

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
                        db.fail(&[id], "nack", NextStep::Dead).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_replays_what_died_and_the_janitor_purges_what_a_relay_then_delivered() {
    let db = Db::new("adm_end_to_end").await;
    let admin = Admin::new(db.store.clone()).chunk_size(2);
    let ids = db
        .record(&[("a", 0), ("a", 1), ("a", 2), ("b", 0), ("c", 0)])
        .await;
    // `a`'s head and `c` die (the broker had no exchange for them); `a`'s
    // followers are held behind its head.
    db.fail(&[ids[0], ids[4]], "NOT_FOUND - no exchange", NextStep::Dead)
        .await;
    let report = admin.status().await.unwrap();
    assert_eq!(
        (
            report.counts.dead,
            report.counts.held,
            report.counts.pending
        ),
        (2, 2, 1)
    );
    assert_eq!(report.blocked_aggregates, 2);
    let groups = admin.failure_groups(&EventFilter::new()).await.unwrap();
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].dead, 2);

    // A relay delivers what nothing holds back.
    let publisher = RecordingPublisher::new();
    let relay = Relay::builder(db.store.clone(), publisher.clone())
        .name("r1")
        .poll_interval(Duration::from_millis(20))
        .build()
        .unwrap();
    let handle = relay.handle();
    let task = tokio::spawn(relay.run());
    tokio::time::timeout(Duration::from_secs(10), publisher.wait_for(1))
        .await
        .expect("b is delivered");
    assert_eq!(publisher.published_ids(), [ids[3]]);

    // The operator replays the group; the relay delivers the rest in order.
    let group = EventFilter::new().with_group(groups[0].id.clone());
    let replayed = admin
        .replay(&operator(), &group, false, &|_| {})
        .await
        .unwrap();
    assert_eq!((replayed.matched, replayed.changed), (2, 2));
    handle.notify();
    tokio::time::timeout(Duration::from_secs(10), publisher.wait_for(5))
        .await
        .expect("all delivered once replayed");
    let report = admin.status().await.unwrap();
    assert_eq!(report.counts.sent, 5);
    assert_eq!(report.counts.unsent() + report.counts.dead, 0);
    assert_eq!(report.relays.len(), 1, "{:?}", report.relays);
    assert_eq!(report.relays[0].name, "r1");
    handle.shutdown();
    task.await.unwrap();
    let published = publisher.published_ids();
    let a: Vec<Uuid> = published
        .iter()
        .copied()
        .filter(|id| ids[..3].contains(id))
        .collect();
    assert_eq!(a, ids[..3], "a's events in order");
    assert_eq!(published.len(), 5);

    // A week later the janitor purges them, in chunks, and the audit trail
    // keeps the operator's replay.
    db.execute(
        "UPDATE outbox_events SET published_at = UTC_TIMESTAMP(6) - INTERVAL 8 DAY, \
         occurred_at = UTC_TIMESTAMP(6) - INTERVAL 9 DAY",
    )
    .await;
    let janitor = Janitor::new(db.store.clone())
        .chunk_size(2)
        .chunk_pause(Duration::ZERO);
    let purged = janitor.run_once().await.unwrap();
    assert_eq!(purged.sent, 5);
    assert_eq!(db.count("outbox_events", "").await, 0);
    assert_eq!(db.count("outbox_attempts", "").await, 0);
    let log = admin.audit_log(None, 10).await.unwrap();
    assert_eq!(log.len(), 1, "the janitor's purges are not operators'");
    assert_eq!((log[0].entry.action.as_str(), log[0].count), ("replay", 2));
}

#[tokio::test]
async fn each_purge_chunk_is_bounded_and_counted_in_its_audit_row() {
    let db = Db::new("adm_purge_chunks").await;
    let store = db.store.clone();
    db.record(&[("a", 0), ("b", 0), ("c", 0), ("d", 0), ("e", 0)])
        .await;
    db.execute(
        "UPDATE outbox_events SET status = 'sent', \
           published_at = UTC_TIMESTAMP(6) - INTERVAL 8 DAY, \
           occurred_at = UTC_TIMESTAMP(6) - INTERVAL 8 DAY; \
         INSERT INTO inbox_events (consumer, event_id, received_at) \
           SELECT 'c', UUID(), UTC_TIMESTAMP(6) - INTERVAL 30 DAY FROM seq_1_to_5; \
         INSERT INTO inbox_dead_letters (consumer, queue, exchange, routing_key, attempts, \
           reason, payload, replayed_at) \
           SELECT 'c', 'q', 'q.dlx', 'k', 1, 'x', '', UTC_TIMESTAMP(6) - INTERVAL 30 DAY \
           FROM seq_1_to_5",
    )
    .await;
    let audit = store
        .begin_audit(&outbox_core::admin::AuditEntry::new(
            "alice",
            "purge_sent",
            serde_json::json!({}),
        ))
        .await
        .unwrap();
    let before = Utc::now() - chrono::Duration::days(7);
    let first = store
        .purge_sent_chunk(before, None, 2, Some(audit))
        .await
        .unwrap();
    assert_eq!(first.changed, 2);
    let second = store
        .purge_sent_chunk(before, first.last, 2, Some(audit))
        .await
        .unwrap();
    assert_eq!(second.changed, 2);
    assert!(second.last > first.last, "{first:?} {second:?}");
    assert_eq!(db.count("outbox_events", "").await, 1);
    let log = store.audit_log(None, 1).await.unwrap();
    assert_eq!(log[0].count, 4, "each chunk adds its count");

    let mut inbox = Vec::new();
    let mut letters = Vec::new();
    for _ in 0..4 {
        inbox.push(store.purge_inbox_chunk(before, 2, None).await.unwrap());
        letters.push(
            store
                .purge_dead_letter_records_chunk(before, 2)
                .await
                .unwrap(),
        );
    }
    assert_eq!(inbox, [2, 2, 1, 0]);
    assert_eq!(letters, [2, 2, 1, 0]);
}

#[tokio::test]
async fn a_claim_for_a_paused_relay_reads_and_locks_nothing_in_either_order() {
    use outbox_core::{Claimed, DeliveryOrder};
    let db = Db::new("adm_claim_paused").await;
    let store = db.store.clone();
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
        // Nothing stays locked: another relay gets it all while r1 is
        // paused.
        match store.claim_for("r2", 10).await.unwrap() {
            Claimed::Batch(claim) => {
                let got: Vec<Uuid> = claim.records().iter().map(|r| r.id()).collect();
                assert_eq!(got, ids, "{order:?}");
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
            }
            other => panic!("{order:?}: resumed, r1 claims: {other:?}"),
        }
    }
    assert_eq!(
        db.count("outbox_events", "WHERE status = 'pending'").await,
        2,
        "claims that end unfinished change nothing"
    );
}
