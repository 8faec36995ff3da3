//! The admin API on the real PostgreSQL: each verb, its chunks and audit
//! rows, the attempt history, the relay registry and the purges.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use chrono::Utc;
use common::{TestDb, one_each, record, seq_of, seqs_of};
use outbox_core::admin::{
    Admin, AdminError, AttemptOutcome, Caller, EventFilter, OutboxAdmin, PurgeTarget,
};
use outbox_core::testing::{RecordingPublisher, fail_claimed};
use outbox_core::{
    Claim, Claimed, DeliveryOrder, EventStatus, FailedAttempt, NextStep, OutboxStore, Relay,
    RelayRegistration,
};
use outbox_diesel::PgOutboxStore;
use uuid::Uuid;

fn operator() -> Caller {
    Caller::operator("alice")
}

/// Claims what is claimable and marks `ids` failed with `next`.
async fn fail(db: &TestDb, ids: &[Uuid], error: &str, next: NextStep) {
    fail_with(&db.store(), ids, error, next).await;
}

async fn fail_with(store: &PgOutboxStore, ids: &[Uuid], error: &str, next: NextStep) {
    fail_claimed(store, ids, 5, next, |id| format!("{error} ({id})"))
        .await
        .unwrap();
}

async fn status(admin: &Admin<impl OutboxAdmin>, id: Uuid) -> EventStatus {
    admin.show(id).await.unwrap().summary.status
}

#[tokio::test]
async fn replaying_a_later_dead_event_leaves_it_held_until_the_earlier_one_is_replayed() {
    let db = TestDb::new("admin_replay_order").await;
    let store = db.store();
    let admin = Admin::new(store.clone()).chunk_size(1);
    let ids = record(&db, &[("a".into(), 0), ("a".into(), 1), ("b".into(), 0)]).await;
    fail(&db, &ids, "nack", NextStep::Dead).await;

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

    // The rest of aggregate `a` (the earlier one) and `b`, by filter, in
    // chunks of one.
    let dead_a = EventFilter::new()
        .with_status(EventStatus::Dead)
        .with_aggregate("piece", "a");
    let report = admin
        .replay(&operator(), &dead_a, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(report.changed, 1);
    let claim = store.claim(10).await.unwrap().unwrap();
    let got: Vec<Uuid> = claim.records().iter().map(|r| r.id()).collect();
    assert_eq!(got, [ids[0], ids[1]], "both, in order; `b` is still dead");
    drop(claim);

    let log = admin.audit_log(None, 10).await.unwrap();
    assert_eq!(log.len(), 2);
    assert_eq!(log[0].entry.action, "replay");
    assert_eq!(log[0].entry.identity, "alice");
    assert_eq!(log[0].count, 1);
    assert_eq!(log[0].entry.target["aggregate_id"], "a");
}

#[tokio::test]
async fn failure_groups_list_show_and_replay_by_group() {
    let db = TestDb::new("admin_groups").await;
    let admin = Admin::new(db.store());
    let ids = record(&db, &one_each(&["a", "b", "c", "d"])).await;
    fail(&db, &ids[..3], "NOT_FOUND - no exchange", NextStep::Dead).await;
    let later = Utc::now() + chrono::Duration::hours(1);
    fail(&db, &ids[3..], "NO_ROUTE", NextStep::RetryAt(later)).await;

    let groups = admin.failure_groups(&EventFilter::new()).await.unwrap();
    assert_eq!(groups.len(), 2, "{groups:#?}");
    assert_eq!((groups[0].dead, groups[0].retry), (3, 0));
    assert_eq!(groups[0].error, "NOT_FOUND - no exchange (<id>)");
    assert_eq!((groups[1].dead, groups[1].retry), (0, 1));

    let page = admin
        .list(
            &EventFilter::new().with_group(groups[0].id.clone()),
            None,
            2,
        )
        .await
        .unwrap();
    assert_eq!(page.items.len(), 2);
    let rest = admin
        .list(
            &EventFilter::new().with_group(groups[0].id.clone()),
            page.next,
            2,
        )
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 1);
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

    let detail = admin.show(ids[0]).await.unwrap();
    assert_eq!(detail.history.len(), 1);
    assert_eq!(detail.history[0].outcome, AttemptOutcome::Dead);
    assert_eq!(detail.group.as_deref(), Some(groups[0].id.as_str()));
    assert!(detail.payload.is_some());

    let group = EventFilter::new().with_group(groups[0].id.clone());
    let report = admin
        .replay(&operator(), &group, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(report.changed, 3);
    for id in &ids[..3] {
        assert_eq!(status(&admin, *id).await, EventStatus::Pending);
    }

    let retry = EventFilter::new().with_status(EventStatus::Retry);
    let now = admin
        .retry_now(&operator(), &retry, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(now.changed, 1);
    let head = admin.store().head("piece", "d").await.unwrap().unwrap();
    assert!(head.next_attempt_at.unwrap() <= Utc::now());

    let missing = admin.show(Uuid::now_v7()).await;
    assert!(
        matches!(missing, Err(AdminError::NotFound(_))),
        "{missing:?}"
    );
}

#[tokio::test]
async fn skipping_a_head_releases_its_aggregate_and_the_status_counts_it() {
    let db = TestDb::new("admin_skip").await;
    let store = db.store();
    let admin = Admin::new(store.clone());
    let ids = record(&db, &[("a".into(), 0), ("a".into(), 1)]).await;
    fail(&db, &ids[..1], "poison", NextStep::Dead).await;
    assert!(store.claim(10).await.unwrap().is_none());
    let report = admin.status().await.unwrap();
    assert_eq!(report.counts.dead, 1);
    assert_eq!(report.blocked_aggregates, 1);
    assert_eq!(report.by_event_type.len(), 1);

    let dry = admin
        .skip_head(&operator(), "piece", "a", true)
        .await
        .unwrap();
    assert_eq!((dry.matched, dry.changed), (1, 0));
    admin
        .skip_head(&operator(), "piece", "a", false)
        .await
        .unwrap();
    assert_eq!(status(&admin, ids[0]).await, EventStatus::Skipped);
    let claim = store.claim(10).await.unwrap().unwrap();
    assert_eq!(claim.records()[0].id(), ids[1]);
    drop(claim);
    let none = admin.skip_head(&operator(), "piece", "a", false).await;
    assert!(matches!(none, Err(AdminError::NotFound(_))), "{none:?}");
}

#[tokio::test]
async fn the_attempt_history_keeps_the_last_twenty() {
    let db = TestDb::new("admin_history").await;
    let store = db.store();
    store
        .register_relay(&RelayRegistration::new("r1", Duration::from_secs(5)))
        .await
        .unwrap();
    let ids = record(&db, &[("a".into(), 0)]).await;
    for _ in 0..25 {
        fail_with(&store, &ids, "nack", NextStep::RetryAt(Utc::now())).await;
    }
    let detail = Admin::new(store).show(ids[0]).await.unwrap();
    assert_eq!(detail.history.len(), outbox_core::admin::ATTEMPTS_KEPT);
    assert!(
        detail
            .history
            .iter()
            .all(|a| a.relay.as_deref() == Some("r1"))
    );
    assert!(detail.history.windows(2).all(|w| w[0].at <= w[1].at));
}

#[tokio::test]
async fn relays_register_heartbeat_pause_and_deregister() {
    let db = TestDb::new("admin_relays").await;
    let store = db.store();
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
    // Registering again (a restart under the same name) keeps the pause.
    store
        .register_relay(&RelayRegistration::new("r1", Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(store.heartbeat("r1", 0).await.unwrap().paused);
    admin.set_paused(&operator(), "r1", false).await.unwrap();
    assert!(!store.heartbeat("r1", 0).await.unwrap().paused);

    // A stale heartbeat is not live.
    db.execute("UPDATE {schema}.outbox_relays SET heartbeat_at = now() - interval '1 minute'");
    assert!(!admin.relays().await.unwrap()[0].live);
    assert_eq!(store.stats().await.unwrap().relays_live, 0);
    // A paused relay's entry outlives it (the next instance starts paused),
    // also past the janitor's stale cutoff.
    admin.set_paused(&operator(), "r1", true).await.unwrap();
    store.deregister_relay("r1").await.unwrap();
    assert_eq!(store.purge_stale_relays(Utc::now()).await.unwrap(), 0);
    assert_eq!(admin.relays().await.unwrap().len(), 1);
    admin.set_paused(&operator(), "r1", false).await.unwrap();
    store.deregister_relay("r1").await.unwrap();
    assert!(admin.relays().await.unwrap().is_empty());
}

#[tokio::test]
async fn purges_delete_old_sent_events_and_inbox_entries_never_dead_ones() {
    let db = TestDb::new("admin_purge").await;
    let store = db.store();
    let admin = Admin::new(store.clone()).chunk_size(2);
    let ids = record(&db, &one_each(&["a", "b", "c", "d", "e"])).await;
    let mut claim = store.claim(10).await.unwrap().unwrap();
    claim.mark_sent(&seqs_of(&claim, &ids[..4])).await.unwrap();
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
    db.execute(
        "UPDATE {schema}.outbox_events SET published_at = now() - interval '8 days', \
         occurred_at = now() - interval '8 days'",
    );
    db.execute(
        "INSERT INTO {schema}.inbox_events (consumer, event_id, received_at) \
         SELECT 'c', gen_random_uuid(), now() - interval '20 days' FROM generate_series(1, 5)",
    );
    db.execute(
        "INSERT INTO {schema}.inbox_events (consumer, event_id) SELECT 'c', gen_random_uuid()",
    );

    let week = Duration::from_secs(7 * 24 * 3600);
    let report = admin
        .purge(&operator(), PurgeTarget::Sent, week, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(report.changed, 4);
    assert_eq!(db.count("outbox_events", ""), 1, "the dead event stays");
    assert_eq!(db.count("outbox_attempts", ""), 1, "with its history");

    let inbox = admin
        .purge(&operator(), PurgeTarget::Inbox, week * 2, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(inbox.changed, 5);
    assert_eq!(db.count("inbox_events", ""), 1);
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
    use outbox_core::admin::Janitor;
    let db = TestDb::new("admin_janitor").await;
    let store = db.store();
    let events: Vec<(String, u32)> = (0..1_200).map(|n| (format!("a{}", n % 50), n)).collect();
    record(&db, &events).await;
    let kept = record(&db, &[("fresh".into(), 0)]).await;
    // Everything but the fresh event was sent a week ago; one is dead.
    db.execute(&format!(
        "UPDATE {{schema}}.outbox_events SET status = 'sent', published_at = now() - interval '8 days', \
         occurred_at = now() - interval '8 days' WHERE id <> '{}'",
        kept[0]
    ));
    db.execute(
        "UPDATE {schema}.outbox_events SET status = 'dead', published_at = NULL \
         WHERE seq = (SELECT min(seq) FROM {schema}.outbox_events)",
    );
    db.execute(
        "INSERT INTO {schema}.inbox_events (consumer, event_id, received_at) \
         SELECT 'c', gen_random_uuid(), now() - interval '30 days' FROM generate_series(1, 250)",
    );
    // Records of dead letters: two settled long ago, one settled lately,
    // one still open (in its dead-letter queue).
    db.execute(
        "INSERT INTO {schema}.inbox_dead_letters (consumer, queue, exchange, routing_key, \
           attempts, reason, payload, replayed_at, purged_at) VALUES \
         ('c', 'q', 'q.dlx', 'k', 1, 'x', '', now() - interval '30 days', NULL), \
         ('c', 'q', 'q.dlx', 'k', 1, 'x', '', NULL, now() - interval '30 days'), \
         ('c', 'q', 'q.dlx', 'k', 1, 'x', '', now(), NULL), \
         ('c', 'q', 'q.dlx', 'k', 1, 'x', '', NULL, NULL)",
    );
    let janitor = |store: PgOutboxStore| {
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
        db.count("inbox_dead_letters", ""),
        2,
        "the recent and the open one stay"
    );
    assert_eq!(
        db.count("outbox_events", ""),
        2,
        "the dead and the fresh event"
    );
    assert_eq!(db.count("outbox_events", "WHERE status = 'dead'"), 1);
    assert_eq!(db.count("inbox_events", ""), 0);
    let again = janitor(store).run_once().await.unwrap();
    assert_eq!((again.sent, again.inbox), (0, 0));
}

#[tokio::test]
async fn a_replay_waits_for_a_row_a_relay_holds_and_says_so_when_it_holds_it_too_long() {
    use diesel_async::{AnsiTransactionManager, SimpleAsyncConnection, TransactionManager};
    let db = TestDb::new("admin_locked").await;
    let admin = Admin::new(db.store());
    let ids = record(&db, &[("a".into(), 0)]).await;
    fail(&db, &ids, "nack", NextStep::Dead).await;
    // What a claim does to a dead head while it publishes what follows it.
    let sql = format!(
        "SELECT 1 FROM \"{}\".outbox_events WHERE id = '{}' FOR SHARE",
        db.schema, ids[0]
    );
    async fn lock(conn: &mut diesel_async::AsyncPgConnection, sql: &str) {
        AnsiTransactionManager::begin_transaction(conn)
            .await
            .unwrap();
        conn.batch_execute(sql).await.unwrap();
    }
    let mut holder = db.conn().await;
    lock(&mut holder, &sql).await;
    let release = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        AnsiTransactionManager::commit_transaction(&mut holder)
            .await
            .unwrap();
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

    fail(&db, &ids, "nack", NextStep::Dead).await;
    lock(&mut holder, &sql).await;
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
    assert_eq!(status(&admin, ids[0]).await, EventStatus::Dead);
    AnsiTransactionManager::rollback_transaction(&mut holder)
        .await
        .unwrap();
}

#[tokio::test]
async fn sent_events_take_their_history_along_and_skipped_ones_are_kept_from_the_skip() {
    let db = TestDb::new("admin_history_gone").await;
    let store = PgOutboxStore::builder(db.pool.clone())
        .schema(&db.schema)
        .keep_sent(false)
        .build()
        .unwrap();
    let ids = record(&db, &[("a".into(), 0), ("b".into(), 0)]).await;
    fail_with(&store, &ids, "nack", NextStep::RetryAt(Utc::now())).await;
    assert_eq!(db.count("outbox_attempts", ""), 2);
    assert_eq!(
        db.count("outbox_events", "WHERE error_group = 'nack (<id>)'"),
        2,
        "the normalized error is stored with the error"
    );
    let mut claim = store.claim(10).await.unwrap().unwrap();
    claim.mark_sent(&seqs_of(&claim, &ids[..1])).await.unwrap();
    claim.finish().await.unwrap();
    assert_eq!(
        db.count("outbox_attempts", ""),
        1,
        "deleted with its sent event"
    );

    // Skipped today, occurred long ago: kept for the retention from the skip.
    db.execute("UPDATE {schema}.outbox_events SET occurred_at = now() - interval '30 days'");
    let admin = Admin::new(store);
    admin.skip(&operator(), ids[1], false).await.unwrap();
    let week = Duration::from_secs(7 * 24 * 3600);
    admin
        .purge(&operator(), PurgeTarget::Sent, week, false, &|_| {})
        .await
        .unwrap();
    assert_eq!(db.count("outbox_events", "WHERE status = 'skipped'"), 1);
}

#[tokio::test]
async fn a_claim_for_a_paused_relay_reads_and_locks_nothing_in_either_order() {
    let db = TestDb::new("admin_claim_paused").await;
    let store = db.store();
    let admin = Admin::new(store.clone());
    let ids = record(&db, &[("a".into(), 0), ("b".into(), 0)]).await;
    store
        .register_relay(&RelayRegistration::new("r1", Duration::from_secs(5)))
        .await
        .unwrap();
    for order in [DeliveryOrder::PerAggregate, DeliveryOrder::Unordered] {
        store.set_delivery_order(order).await.unwrap();
        admin.set_paused(&operator(), "r1", true).await.unwrap();
        let paused = store.claim_for("r1", 10).await.unwrap();
        assert!(matches!(paused, Claimed::Paused), "{order:?}: {paused:?}");
        // Nothing stays locked: another relay, registered or not, gets it
        // all while r1 is paused.
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
        db.count("outbox_events", "WHERE status = 'pending'"),
        2,
        "claims that end unfinished change nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_stops_a_running_relay_at_its_next_claim_and_a_resume_delivers() {
    let db = TestDb::new("admin_pause_claim").await;
    let admin = Admin::new(db.store());
    let first = record(&db, &(0..5).map(|n| ("a".into(), n)).collect::<Vec<_>>()).await;
    let publisher = RecordingPublisher::new();
    // One event at a time, 100 ms each: events are pending while the relay
    // runs. Heartbeats every 5 s (the most a stats interval of an hour
    // gives): the pause below is read by the claims, before the next one.
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
    let later = record(&db, &(5..8).map(|n| ("a".into(), n)).collect::<Vec<_>>()).await;
    handle.notify();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let published = publisher.published_ids();
    assert!(
        published.len() <= in_flight && published.len() < first.len(),
        "nothing claimed once paused: {} published",
        published.len()
    );
    assert!(later.iter().all(|id| !published.contains(id)));
    assert_eq!(
        db.count("outbox_events", "WHERE status = 'pending'") as usize,
        first.len() + later.len() - published.len(),
    );
    // No heartbeat since the pause (its audit row is older than the pause's
    // commit): the claims read it themselves.
    let paused_at = admin.audit_log(None, 1).await.unwrap()[0].at;
    let relays = admin.relays().await.unwrap();
    assert!(relays[0].paused);
    assert!(
        relays[0].heartbeat_at < paused_at,
        "the last heartbeat was before the pause"
    );

    admin.set_paused(&operator(), "r1", false).await.unwrap();
    // Resumed by the next heartbeat (within 5 s).
    tokio::time::timeout(Duration::from_secs(15), publisher.wait_for(8))
        .await
        .expect("delivered once resumed");
    handle.shutdown();
    task.await.unwrap();
    let expected: Vec<Uuid> = first.iter().chain(&later).copied().collect();
    assert_eq!(publisher.published_ids(), expected, "all of them, in order");
    assert_eq!(db.count("outbox_events", "WHERE status = 'sent'"), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_leaves_alone_an_event_recorded_after_it_began_that_dies_while_it_runs() {
    let db = TestDb::new("admin_replay_bound").await;
    let store = db.store();
    let admin = Admin::new(store.clone()).chunk_size(1);
    let ids = record(&db, &[("a".into(), 0), ("b".into(), 0), ("c".into(), 0)]).await;
    fail(&db, &ids, "nack", NextStep::Dead).await;

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
                        let id = record(&db, &[("late".into(), 0)]).await[0];
                        fail(&db, &[id], "nack", NextStep::Dead).await;
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
    assert!(report.changed <= report.matched);
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
