//! The dead-letter verbs ([`DeadLetters`]) over the in-memory inbox and
//! broker: chunks, marking, audit rows, stops and skips, purges, and
//! permissions. The CLI's and the router's tests run the same verbs on
//! PostgreSQL and RabbitMQ.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Mutex;

use outbox_core::InboxDatabase as _;
use outbox_core::admin::{
    AdminError, Caller, DeadLetter, DeadLetterQuery, DeadLetterStore as _, DeadLetters, DlqPurge,
    DlqReplay, StopCause,
};
use outbox_core::testing::{InMemoryDeadLetterQueues, InMemoryInbox, QueuedMessage};
use uuid::Uuid;

const ORIGIN: &str = "loyalty.orders";
const DLQ: &str = "loyalty.orders.dead";

/// `n` dead letters of `origin` in `DLQ`, each recorded in the inbox as the
/// consumer records it (with its own id); their message ids.
async fn dead_letters(
    inbox: &InMemoryInbox,
    broker: &InMemoryDeadLetterQueues,
    origin: &str,
    n: usize,
) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let event = Uuid::now_v7();
        let letter_id = Uuid::now_v7();
        let mut letter = DeadLetter::new("loyalty", origin, "x.dlx", "k", "row 7 missing", b"{}");
        letter.event_id = Some(event);
        letter
            .headers
            .insert("x-outbox-dead-letter-id".into(), letter_id.to_string());
        inbox.record_dead_letter(&letter).await.unwrap();
        broker.push(
            DLQ,
            QueuedMessage::new(
                Some(event.to_string()),
                Some(letter_id),
                Some(origin.to_owned()),
            ),
        );
        ids.push(event.to_string());
    }
    ids
}

fn ids(messages: &[QueuedMessage]) -> Vec<String> {
    messages
        .iter()
        .map(|m| m.message_id.clone().unwrap())
        .collect()
}

fn setup() -> (
    InMemoryInbox,
    InMemoryDeadLetterQueues,
    DeadLetters<InMemoryInbox, InMemoryDeadLetterQueues>,
) {
    let inbox = InMemoryInbox::new();
    let broker = InMemoryDeadLetterQueues::new();
    broker.declare(ORIGIN);
    broker.declare(DLQ);
    let verbs = DeadLetters::new(inbox.clone(), broker.clone()).chunk_size(2);
    (inbox, broker, verbs)
}

#[tokio::test]
async fn a_replay_moves_every_message_back_in_order_in_chunks_marks_and_audits() {
    let (inbox, broker, verbs) = setup();
    let sent = dead_letters(&inbox, &broker, ORIGIN, 5).await;
    let alice = Caller::operator("alice");

    let dry = verbs
        .replay(&alice, &DlqReplay::new(DLQ).dry_run(true), &|_| {})
        .await
        .unwrap();
    assert_eq!((dry.depth, dry.report.replayed, dry.audit_id), (5, 0, None));
    assert_eq!(broker.messages(DLQ).len(), 5, "a dry run moves nothing");

    let seen = Mutex::new(Vec::new());
    let outcome = verbs
        .replay(&alice, &DlqReplay::new(DLQ), &|n| {
            seen.lock().unwrap().push(n);
        })
        .await
        .unwrap();
    assert_eq!(outcome.report.replayed, 5);
    assert_eq!(outcome.marked, 5);
    assert_eq!(outcome.report.error, None);
    assert_eq!(
        *seen.lock().unwrap(),
        [1, 2, 3, 4, 5],
        "progress across chunks"
    );
    assert_eq!(ids(&broker.messages(ORIGIN)), sent, "in order");
    assert!(broker.messages(DLQ).is_empty());
    let open = inbox.list(&DeadLetterQuery::new()).await.unwrap();
    assert!(open.items.is_empty(), "every record marked: {open:?}");

    let audit = inbox.audit_log();
    assert_eq!(audit.len(), 1);
    assert_eq!(Some(audit[0].id), outcome.audit_id);
    assert_eq!(audit[0].entry.identity, "alice");
    assert_eq!(audit[0].entry.action, "dlq_replay");
    assert_eq!(audit[0].count, 5);
    assert_eq!(
        audit[0].outcome.as_deref(),
        Some("done: 5 replayed, 0 skipped, 5 record(s) marked")
    );
}

#[tokio::test]
async fn a_limit_replays_the_head_only() {
    let (inbox, broker, verbs) = setup();
    let sent = dead_letters(&inbox, &broker, ORIGIN, 5).await;
    let outcome = verbs
        .replay(
            &Caller::operator("alice"),
            &DlqReplay::new(DLQ).limit(3),
            &|_| {},
        )
        .await
        .unwrap();
    assert_eq!((outcome.report.replayed, outcome.marked), (3, 3));
    assert_eq!(ids(&broker.messages(ORIGIN)), sent[..3]);
    assert_eq!(ids(&broker.messages(DLQ)), sent[3..]);
    assert_eq!(
        inbox
            .list(&DeadLetterQuery::new())
            .await
            .unwrap()
            .items
            .len(),
        2
    );
}

#[tokio::test]
async fn a_broker_failure_half_way_keeps_what_moved_marked_and_counted() {
    let (inbox, broker, verbs) = setup();
    let sent = dead_letters(&inbox, &broker, ORIGIN, 5).await;
    // The fourth message fails: two chunks of two would be 1-2, 3-4.
    let failing = broker.clone();
    let outcome = verbs
        .replay(&Caller::operator("alice"), &DlqReplay::new(DLQ), &|n| {
            if n == 3 {
                failing.fail_next(1);
            }
        })
        .await
        .unwrap();
    assert_eq!(outcome.report.replayed, 3);
    assert_eq!(outcome.marked, 3);
    assert_eq!(outcome.report.stopped_by, Some(StopCause::Broker));
    assert_eq!(ids(&broker.messages(ORIGIN)), sent[..3]);
    assert_eq!(
        ids(&broker.messages(DLQ)),
        sent[3..],
        "the rest stays, in order"
    );
    let audit = &inbox.audit_log()[0];
    assert_eq!(audit.count, 3);
    assert_eq!(
        audit.outcome.as_deref(),
        Some("failed: the broker failed (see the log)"),
        "the driver's text stays in the log"
    );
}

#[tokio::test]
async fn a_message_that_cannot_go_back_stops_the_replay_or_is_skipped_to_the_tail() {
    let (inbox, broker, verbs) = setup();
    let first = dead_letters(&inbox, &broker, ORIGIN, 1).await;
    let gone = dead_letters(&inbox, &broker, "gone.queue", 1).await;
    let last = dead_letters(&inbox, &broker, ORIGIN, 1).await;
    let alice = Caller::operator("alice");

    let stopped = verbs
        .replay(&alice, &DlqReplay::new(DLQ), &|_| {})
        .await
        .unwrap();
    assert_eq!(stopped.report.replayed, 1);
    assert_eq!(stopped.report.stopped_by, Some(StopCause::Unreplayable));
    assert!(
        stopped
            .report
            .error
            .as_deref()
            .unwrap()
            .contains("gone.queue")
    );
    assert_eq!(ids(&broker.messages(ORIGIN)), first);
    assert_eq!(
        ids(&broker.messages(DLQ)),
        [gone.clone(), last.clone()].concat(),
        "it stays at the head"
    );

    let skipped = verbs
        .replay(
            &alice,
            &DlqReplay::new(DLQ).skip_unreplayable(true),
            &|_| {},
        )
        .await
        .unwrap();
    assert_eq!(skipped.report.error, None);
    assert_eq!(skipped.report.replayed, 1);
    assert_eq!(skipped.report.skipped.len(), 1);
    assert_eq!(
        skipped.report.skipped[0].message_id.as_deref(),
        Some(gone[0].as_str())
    );
    assert_eq!(ids(&broker.messages(DLQ)), gone, "moved to the tail, once");
    assert_eq!(ids(&broker.messages(ORIGIN)), [first, last].concat());
    let open = inbox.list(&DeadLetterQuery::new()).await.unwrap();
    assert_eq!(open.items.len(), 1, "the skipped one stays open");
    assert_eq!(open.items[0].letter.queue, "gone.queue");
}

#[tokio::test]
async fn read_only_callers_bad_names_and_missing_queues_are_refused_before_anything_moves() {
    let (inbox, broker, verbs) = setup();
    dead_letters(&inbox, &broker, ORIGIN, 2).await;
    let reader = Caller::read_only("grafana");
    assert!(matches!(
        verbs.replay(&reader, &DlqReplay::new(DLQ), &|_| {}).await,
        Err(AdminError::Forbidden { .. })
    ));
    assert!(matches!(
        verbs.purge(&reader, &DlqPurge::new(DLQ)).await,
        Err(AdminError::Forbidden { .. })
    ));
    let alice = Caller::operator("alice");
    for bad in ["", "nul\0name"] {
        assert!(matches!(
            verbs.replay(&alice, &DlqReplay::new(bad), &|_| {}).await,
            Err(AdminError::Invalid(_))
        ));
    }
    assert!(matches!(
        verbs
            .replay(&alice, &DlqReplay::new(DLQ).limit(0), &|_| {})
            .await,
        Err(AdminError::Invalid(_))
    ));
    assert!(matches!(
        verbs
            .replay(&alice, &DlqReplay::new("no.such.dead"), &|_| {})
            .await,
        Err(AdminError::NotFound(_))
    ));
    broker.fail_next(1);
    assert!(matches!(
        verbs.replay(&alice, &DlqReplay::new(DLQ), &|_| {}).await,
        Err(AdminError::Broker(_))
    ));
    assert_eq!(broker.messages(DLQ).len(), 2);
    assert!(
        inbox.audit_log().is_empty(),
        "nothing acted, nothing audited"
    );
}

#[tokio::test]
async fn a_purge_empties_the_queue_and_marks_the_records_of_its_origins_only() {
    let (inbox, broker, verbs) = setup();
    dead_letters(&inbox, &broker, ORIGIN, 2).await;
    dead_letters(&inbox, &broker, "loyalty.refunds", 1).await;
    let alice = Caller::operator("alice");

    let dry = verbs
        .purge(&alice, &DlqPurge::new(DLQ).dry_run(true))
        .await
        .unwrap();
    assert_eq!(
        (dry.depth, dry.purged, dry.origins.clone()),
        (3, 0, vec![ORIGIN.to_owned()])
    );
    assert_eq!(broker.messages(DLQ).len(), 3);

    // The name implies one origin: the other queue's record stays open.
    let purged = verbs.purge(&alice, &DlqPurge::new(DLQ)).await.unwrap();
    assert_eq!((purged.purged, purged.marked), (3, 2));
    let open = inbox.list(&DeadLetterQuery::new()).await.unwrap();
    assert_eq!(open.items.len(), 1);
    assert_eq!(open.items[0].letter.queue, "loyalty.refunds");

    // A shared dead-letter queue names every origin.
    dead_letters(&inbox, &broker, ORIGIN, 1).await;
    let shared = verbs
        .purge(
            &alice,
            &DlqPurge::new(DLQ).origins([ORIGIN, "loyalty.refunds"]),
        )
        .await
        .unwrap();
    assert_eq!((shared.purged, shared.marked), (1, 2));
    assert!(
        inbox
            .list(&DeadLetterQuery::new())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    assert!(matches!(
        verbs.purge(&alice, &DlqPurge::new("shared-dlq")).await,
        Err(AdminError::Invalid(_))
    ));
    let audit = inbox.audit_log();
    assert_eq!(audit.len(), 2);
    assert_eq!(audit[1].entry.action, "dlq_purge");
    assert_eq!(
        (audit[1].count, audit[1].outcome.as_deref()),
        (1, Some("done: 1 purged, 2 record(s) marked"))
    );
}

#[tokio::test]
async fn a_live_queue_is_refused_and_two_replays_of_one_queue_never_run_at_once() {
    let (inbox, broker, verbs) = setup();
    dead_letters(&inbox, &broker, ORIGIN, 2).await;
    let alice = Caller::operator("alice");

    // A queue with a consumer is live (or being replayed): a dry run says
    // so, a replay is refused before anything moves.
    broker.consumer(DLQ, true);
    let dry = verbs
        .replay(&alice, &DlqReplay::new(DLQ).dry_run(true), &|_| {})
        .await
        .unwrap();
    assert_eq!((dry.depth, dry.consumers), (2, 1));
    let refused = verbs.replay(&alice, &DlqReplay::new(DLQ), &|_| {}).await;
    assert!(
        matches!(refused, Err(AdminError::Conflict(_))),
        "{refused:?}"
    );
    assert!(matches!(
        verbs.purge(&alice, &DlqPurge::new(DLQ)).await,
        Err(AdminError::Conflict(_))
    ));
    broker.consumer(DLQ, false);

    // A replay running: a second one is refused, purges too.
    let second = verbs.clone();
    let caller = alice.clone();
    let outcome = verbs
        .replay(&alice, &DlqReplay::new(DLQ), &move |n| {
            if n == 1 {
                let refused = ready(second.replay(&caller, &DlqReplay::new(DLQ), &|_| {}));
                assert!(
                    matches!(refused, Err(AdminError::Conflict(_))),
                    "{refused:?}"
                );
            }
        })
        .await
        .unwrap();
    assert_eq!(outcome.report.replayed, 2, "the first one finishes");

    // A message that was never dead-lettered stops the replay, even when
    // told to skip: the queue may be a live one.
    broker.push(DLQ, QueuedMessage::live("live-1"));
    dead_letters(&inbox, &broker, ORIGIN, 1).await;
    let stopped = verbs
        .replay(
            &alice,
            &DlqReplay::new(DLQ).skip_unreplayable(true),
            &|_| {},
        )
        .await
        .unwrap();
    assert_eq!(stopped.report.replayed, 0);
    assert_eq!(stopped.report.stopped_by, Some(StopCause::Unreplayable));
    assert_eq!(
        broker.messages(DLQ)[0].message_id.as_deref(),
        Some("live-1")
    );

    // A purge never names the dead-letter queue as its own origin.
    assert!(matches!(
        verbs
            .purge(&alice, &DlqPurge::new(DLQ).origins([DLQ]))
            .await,
        Err(AdminError::Invalid(_))
    ));
}

/// The value of `future`, which the in-memory parts complete without
/// waiting (polled from inside a synchronous progress callback).
fn ready<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(value) => value,
        std::task::Poll::Pending => panic!("the in-memory parts never wait"),
    }
}
