//! Dead letters against the real RabbitMQ, with the in-memory inbox: the
//! consumer records each one it dead-letters, [`DeadLetterQueue::replay`]
//! sends them back to their queue (attempt reset, processed once), a replay
//! killed between a confirmed publish and its ack loses nothing, a message
//! that cannot go back stays where it is, and purge empties the queue.
//!
//! Each test declares its own exchange and queues, named after the test and
//! the process, and deletes them when it ends, also when it fails.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use outbox_core::admin::DeadLetterBroker;
use outbox_core::testing::{InMemoryInbox, InboxTx};
use outbox_lapin::wire::header_str;
use outbox_lapin::{
    ATTEMPT_HEADER, DEAD_LETTER_ID_HEADER, DEAD_REASON_HEADER, DeadLetterQueue, DeadLetterQueues,
    HandlerError, IncomingEvent, ORIGINAL_ROUTING_KEY_HEADER, QUEUE_HEADER, REPLAYED_REASON_HEADER,
    StopCause, handler_fn,
};
use uuid::Uuid;

use common::{Broker, Running, WAIT, amqp_url, placed};

/// This test's broker objects: an exchange and a queue bound with
/// `order.*`, with its dead-letter exchange and queue.
async fn broker(test: &str) -> Broker {
    Broker::new("test_dlq", test, &["order.*"]).await
}

/// Successful handler calls per event id.
#[derive(Clone, Default)]
struct Handled(Arc<Mutex<HashMap<Uuid, u32>>>);

impl Handled {
    fn count(&self, id: Uuid) -> u32 {
        self.0.lock().unwrap().get(&id).copied().unwrap_or(0)
    }

    async fn wait_for_all(&self, ids: &[Uuid]) {
        let deadline = Instant::now() + WAIT;
        while !ids.iter().all(|id| self.count(*id) > 0) {
            assert!(Instant::now() < deadline, "not every event was handled");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A running consumer whose handler fails (not permanently) while `failing`
/// is set, and counts successes otherwise.
fn start_failing(
    broker: &Broker,
    inbox: &InMemoryInbox,
    failing: &Arc<AtomicBool>,
    handled: &Handled,
) -> Running {
    let failing = failing.clone();
    let handled = handled.clone();
    let handler = handler_fn(move |_tx: &mut InboxTx, event: &IncomingEvent| {
        let failing = failing.load(Ordering::SeqCst);
        let handled = handled.clone();
        let id = event.id;
        Box::pin(async move {
            if failing {
                return Err(HandlerError::new(format!("stock for {id} not found")));
            }
            *handled.0.lock().unwrap().entry(id).or_default() += 1;
            Ok(())
        })
    });
    let consumer = broker
        .consumer(inbox.clone(), handler)
        .declare(broker.topology.clone())
        .max_attempts(2)
        .retry_delay(Duration::from_millis(20))
        .build()
        .unwrap();
    Running::start(consumer)
}

/// Publishes `n` events that the consumer dead-letters (two failed
/// attempts each), waits until all are recorded and in the dead-letter
/// queue, and stops the consumer. Returns their ids in publish order.
async fn dead_letter(broker: &Broker, inbox: &InMemoryInbox, n: usize) -> Vec<Uuid> {
    let failing = Arc::new(AtomicBool::new(true));
    let running = start_failing(broker, inbox, &failing, &Handled::default());
    let mut ids = Vec::new();
    for i in 0..n {
        let event = placed(&format!("o-{i}"), 0);
        ids.push(event.id);
        broker.publish(&event).await;
    }
    let deadline = Instant::now() + WAIT;
    while inbox.dead_letters().len() < n {
        assert!(Instant::now() < deadline, "not every dead letter recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    running.stop().await;
    broker
        .wait_ready(broker.dlq(), u32::try_from(n).unwrap())
        .await;
    ids
}

#[tokio::test]
async fn dead_letters_are_recorded_and_a_replay_brings_each_back_once() {
    let broker = broker("replay").await;
    let inbox = InMemoryInbox::new();
    let ids = dead_letter(&broker, &inbox, 4).await;

    // Recorded: one per message, with queue, reason and attempts.
    let letters = inbox.dead_letters();
    assert_eq!(letters.len(), 4);
    let mut recorded: Vec<Uuid> = letters.iter().map(|l| l.event_id.unwrap()).collect();
    recorded.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(recorded, expected);
    for letter in &letters {
        let id = letter.event_id.unwrap();
        assert_eq!(letter.consumer, broker.consumer_name());
        assert_eq!(letter.queue, broker.queue());
        assert_eq!(letter.exchange, broker.dlx());
        assert_eq!(letter.routing_key, "order.placed");
        assert_eq!(letter.event_type.as_deref(), Some("order.placed"));
        assert_eq!(letter.message_id, Some(id.to_string()));
        assert_eq!(letter.attempts, 2);
        assert_eq!(letter.reason, format!("stock for {id} not found"));
        assert_eq!(letter.headers[QUEUE_HEADER], broker.queue());
        assert_eq!(letter.headers[ATTEMPT_HEADER], "2");
        assert!(letter.payload.contains("o-"), "{}", letter.payload);
        assert!(!letter.payload_truncated);
    }
    // The broker's copies carry the queue they came from.
    let dead = broker.peek(broker.dlq()).await;
    assert_eq!(dead.len(), 4);
    for (_, props) in &dead {
        let headers = props.headers().as_ref().unwrap();
        assert_eq!(header_str(headers, QUEUE_HEADER), Some(broker.queue()));
    }
    let dead_order: Vec<String> = dead.into_iter().map(|(id, _)| id).collect();

    let mut dlq = DeadLetterQueue::connect(&amqp_url(), broker.dlq())
        .await
        .unwrap();
    assert_eq!(dlq.depth().await.unwrap(), 4);
    let progress = AtomicU64::new(0);
    let report = dlq
        .replay(None, &|n| progress.store(n, Ordering::SeqCst))
        .await
        .unwrap();
    assert_eq!(report.error, None);
    assert_eq!(report.replayed, 4);
    assert_eq!(progress.load(Ordering::SeqCst), 4);
    assert!(report.messages.iter().all(|m| m.queue == broker.queue()));
    let replayed: Vec<String> = report.event_ids().iter().map(Uuid::to_string).collect();
    assert_eq!(replayed, dead_order, "replayed in dead-letter-queue order");
    assert_eq!(dlq.depth().await.unwrap(), 0);
    // Each dead letter's own id, recorded and reported: exactly its record
    // can be marked replayed.
    let mut recorded: Vec<String> = letters
        .iter()
        .map(|l| l.headers[DEAD_LETTER_ID_HEADER].clone())
        .collect();
    let mut reported: Vec<String> = report
        .dead_letter_ids()
        .iter()
        .map(Uuid::to_string)
        .collect();
    recorded.sort();
    reported.sort();
    assert_eq!(recorded.len(), 4);
    assert_eq!(reported, recorded);

    // Back in the origin queue, in the same order, attempt reset, reason
    // kept aside, original routing key kept.
    let back = broker.peek(broker.queue()).await;
    let back_order: Vec<String> = back.iter().map(|(id, _)| id.clone()).collect();
    assert_eq!(back_order, dead_order);
    for (id, props) in &back {
        let headers = props.headers().as_ref().unwrap();
        assert!(!headers.contains_key(ATTEMPT_HEADER), "attempt reset");
        assert!(!headers.contains_key(DEAD_REASON_HEADER));
        for stale in [QUEUE_HEADER, DEAD_LETTER_ID_HEADER, "x-death"] {
            assert!(
                !headers.contains_key(stale),
                "{stale} is told anew if it dies again"
            );
        }
        assert_eq!(
            header_str(headers, REPLAYED_REASON_HEADER),
            Some(format!("stock for {id} not found").as_str())
        );
        assert_eq!(
            header_str(headers, ORIGINAL_ROUTING_KEY_HEADER),
            Some("order.placed")
        );
    }

    // The handler now succeeds: each event processed exactly once.
    let handled = Handled::default();
    let running = start_failing(&broker, &inbox, &Arc::new(AtomicBool::new(false)), &handled);
    handled.wait_for_all(&ids).await;
    broker.wait_ready(broker.queue(), 0).await;
    running.stop().await;
    for id in &ids {
        assert_eq!(handled.count(*id), 1);
        assert!(inbox.contains(&broker.consumer_name(), *id));
    }
    assert_eq!(inbox.dead_letters().len(), 4, "nothing dead-lettered again");
    dlq.close().await.unwrap();
}

#[tokio::test]
async fn a_replay_killed_between_confirm_and_ack_loses_nothing() {
    let broker = broker("killed").await;
    let inbox = InMemoryInbox::new();
    let ids = dead_letter(&broker, &inbox, 6).await;

    // The replay process dies right after the third copy is confirmed,
    // before that dead letter is acked: its connection goes with it.
    let mut dlq = DeadLetterQueue::connect(&amqp_url(), broker.dlq())
        .await
        .unwrap();
    let killed = tokio::spawn(async move {
        dlq.replay_with_hook(None, &|_| {}, &|n| {
            assert!(n < 3, "killed after the third confirmed publish");
        })
        .await
    });
    assert!(killed.await.unwrap_err().is_panic());

    // Two replayed and acked, the third in both queues, three untouched.
    broker.wait_ready(broker.queue(), 3).await;
    broker.wait_ready(broker.dlq(), 4).await;
    let mut everywhere: Vec<String> = broker
        .peek(broker.queue())
        .await
        .into_iter()
        .chain(broker.peek(broker.dlq()).await)
        .map(|(id, _)| id)
        .collect();
    everywhere.sort();
    everywhere.dedup();
    let mut expected: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    expected.sort();
    assert_eq!(everywhere, expected, "every message is somewhere");

    // A second replay finishes the job.
    let mut dlq = DeadLetterQueue::connect(&amqp_url(), broker.dlq())
        .await
        .unwrap();
    let report = dlq.replay(None, &|_| {}).await.unwrap();
    assert_eq!(report.error, None);
    assert_eq!(report.replayed, 4);
    assert_eq!(dlq.depth().await.unwrap(), 0);
    dlq.close().await.unwrap();

    // The duplicate is dropped by the inbox: each processed once.
    let handled = Handled::default();
    let running = start_failing(&broker, &inbox, &Arc::new(AtomicBool::new(false)), &handled);
    handled.wait_for_all(&ids).await;
    broker.wait_ready(broker.queue(), 0).await;
    running.stop().await;
    for id in &ids {
        assert_eq!(handled.count(*id), 1, "{id} processed once");
    }
}

#[tokio::test]
async fn a_message_that_cannot_go_back_stays_and_purge_empties_the_queue() {
    let broker = broker("stuck").await;
    let mut dlq = DeadLetterQueue::connect(&amqp_url(), broker.dlq())
        .await
        .unwrap();

    // No origin at all.
    let props = BasicProperties::default().with_message_id("no-origin".into());
    broker
        .publish_to(broker.dlx(), "order.placed", b"{}", props)
        .await;
    let report = dlq.replay(None, &|_| {}).await.unwrap();
    assert_eq!(report.replayed, 0);
    let error = report.error.unwrap();
    assert!(
        error.contains("no-origin") && error.contains(QUEUE_HEADER),
        "{error}"
    );
    assert_eq!(dlq.depth().await.unwrap(), 1, "left where it was");
    assert_eq!(dlq.purge().await.unwrap(), 1);

    // An origin queue that no longer exists: unroutable, left, then the
    // next (good) message is not touched either.
    let gone = format!("{}.gone", broker.queue());
    for (id, origin) in [("to-gone", gone.as_str()), ("fine", broker.queue())] {
        broker
            .publish_to(
                broker.dlx(),
                "order.placed",
                b"{}",
                dead_letter_props(id, origin),
            )
            .await;
    }
    let report = dlq.replay(None, &|_| {}).await.unwrap();
    assert_eq!(report.replayed, 0);
    let error = report.error.unwrap();
    assert!(
        error.contains(&gone) && error.contains("to-gone"),
        "{error}"
    );
    let left: Vec<String> = broker
        .peek(broker.dlq())
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(left, ["to-gone", "fine"], "both left, in order");
    assert_eq!(broker.ready(broker.queue()).await, 0);

    assert_eq!(dlq.purge().await.unwrap(), 2);
    assert_eq!(dlq.depth().await.unwrap(), 0);
    // A missing queue is an error, not an empty one.
    let missing = DeadLetterQueue::connect(&amqp_url(), format!("{}.missing", broker.dlq()))
        .await
        .unwrap();
    assert!(missing.depth().await.is_err());
    dlq.close().await.unwrap();
}

/// A dead letter of `origin`, as a consumer dead-letters it.
fn dead_letter_props(id: &str, origin: &str) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(
        ShortString::from(QUEUE_HEADER),
        AMQPValue::LongString(LongString::from(origin)),
    );
    BasicProperties::default()
        .with_message_id(id.into())
        .with_headers(headers)
}

#[tokio::test]
async fn a_replay_holds_the_queue_alone_and_never_moves_a_live_message() {
    let broker = broker("alone").await;
    for id in ["one", "two"] {
        let props = dead_letter_props(id, broker.queue());
        broker
            .publish_to(broker.dlx(), "order.placed", b"{}", props)
            .await;
    }
    broker.wait_ready(broker.dlq(), 2).await;

    // The first replay's hold: a second reader is refused, and the queue
    // shows a consumer (so the admin refuses to replay or purge it).
    let mut first = DeadLetterQueue::connect(&amqp_url(), broker.dlq())
        .await
        .unwrap();
    assert!(first.claim().await.unwrap());
    let mut second = DeadLetterQueue::connect(&amqp_url(), broker.dlq())
        .await
        .unwrap();
    assert!(!second.claim().await.unwrap(), "held by the first");
    assert_eq!(second.inspect().await.unwrap().consumers, 1);
    let queues = DeadLetterQueues::new(amqp_url());
    assert!(
        DeadLetterBroker::open(&queues, broker.dlq())
            .await
            .unwrap()
            .is_none()
    );
    let report = first.replay(Some(2), &|_| {}).await.unwrap();
    assert_eq!(report.replayed, 2);
    first.close().await.unwrap();
    assert!(second.claim().await.unwrap(), "free once the first closed");
    second.close().await.unwrap();
    assert_eq!(broker.ready(broker.queue()).await, 2);

    // A message with no sign of having been dead-lettered stops a replay
    // even when told to skip what cannot go back: the queue may be live.
    let live = BasicProperties::default().with_message_id("live".into());
    broker
        .publish_to(broker.dlx(), "order.placed", b"{}", live)
        .await;
    broker.wait_ready(broker.dlq(), 1).await;
    let mut dlq = DeadLetterQueue::connect(&amqp_url(), broker.dlq())
        .await
        .unwrap()
        .skip_unreplayable(true);
    let report = dlq.replay(None, &|_| {}).await.unwrap();
    assert_eq!((report.replayed, report.skipped.len()), (0, 0));
    assert_eq!(report.stopped_by, Some(StopCause::Unreplayable));
    assert!(
        report
            .error
            .as_deref()
            .unwrap()
            .contains("dead-letter queue?"),
        "{report:?}"
    );
    assert_eq!(dlq.depth().await.unwrap(), 1, "left in place");
    dlq.close().await.unwrap();
}
