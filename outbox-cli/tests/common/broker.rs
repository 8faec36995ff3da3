//! A consumer queue and its dead-letter queue of one test on the real
//! RabbitMQ, deleted when the test ends (also when it panics), and dead
//! letters in them as the consumer leaves them.

use std::time::Duration;

use lapin::BasicProperties;
use lapin::message::BasicGetMessage;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use outbox_testkit::amqp::TestBroker;
use outbox_testkit::eventually::eventually;
use uuid::Uuid;

use super::TestDb;

#[allow(unused_imports)]
pub use outbox_testkit::urls::amqp_url;

/// `<name>` and `<name>.dead`, named after the test and the process; both
/// deleted when the test ends (also when it panics).
pub struct Queues {
    pub origin: String,
    pub dlq: String,
    broker: TestBroker,
}

impl Queues {
    pub async fn new(test: &str) -> Queues {
        let broker = TestBroker::new(format!("test.cli.{}", super::schema_name(test))).await;
        let origin = broker.name().to_owned();
        let dlq = format!("{origin}.dead");
        for queue in [&origin, &dlq] {
            broker
                .queue_with(queue, QueueDeclareOptions::default(), FieldTable::default())
                .await;
        }
        Queues {
            origin,
            dlq,
            broker,
        }
    }

    /// Publishes `n` messages into the dead-letter queue as the consumer
    /// dead-letters them (`x-outbox-queue` = `origin`, `message_id` = the
    /// event id), confirmed; returns their event ids in order.
    pub async fn dead_letter(&self, n: usize, origin: &str) -> Vec<Uuid> {
        let mut ids = Vec::with_capacity(n);
        let mut confirms = Vec::with_capacity(n);
        for i in 0..n {
            let id = Uuid::now_v7();
            ids.push(id);
            let mut headers = FieldTable::default();
            headers.insert(
                ShortString::from(outbox_lapin::QUEUE_HEADER),
                AMQPValue::LongString(LongString::from(origin)),
            );
            let props = BasicProperties::default()
                .with_message_id(ShortString::from(id.to_string()))
                .with_type(ShortString::from("piece.moved"))
                .with_headers(headers);
            let body = format!("{{\"n\":{i}}}");
            confirms.push(
                self.broker
                    .channel()
                    .basic_publish(
                        "".into(),
                        self.dlq.as_str().into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..BasicPublishOptions::default()
                        },
                        body.as_bytes(),
                        props,
                    )
                    .await
                    .unwrap(),
            );
        }
        for confirm in confirms {
            assert_eq!(confirm.await.unwrap(), lapin::Confirmation::Ack(None));
        }
        ids
    }

    /// Ready messages in `queue`.
    pub async fn depth(&self, queue: &str) -> u32 {
        self.broker.ready(queue).await
    }

    /// Waits until `check(depth of origin, depth of dlq)` holds.
    pub async fn wait_for(&self, what: &str, check: impl Fn(u32, u32) -> bool) -> (u32, u32) {
        eventually(what)
            .within(Duration::from_secs(30))
            .every(Duration::from_millis(20))
            .some(|| async {
                let depths = (self.depth(&self.origin).await, self.depth(&self.dlq).await);
                check(depths.0, depths.1).then_some(depths)
            })
            .await
    }

    /// The message ids in `queue`, in order, leaving them there (got
    /// without ack on a channel that is then closed: they are requeued).
    pub async fn peek(&self, queue: &str) -> Vec<String> {
        message_ids(self.broker.peek(queue).await)
    }

    /// The message ids in `queue`, in order, taking them out.
    pub async fn drain(&self, queue: &str) -> Vec<String> {
        message_ids(self.broker.drain(queue).await)
    }
}

fn message_ids(messages: Vec<BasicGetMessage>) -> Vec<String> {
    messages
        .iter()
        .map(|got| {
            let id = got.delivery.properties.message_id().as_ref();
            id.map(ToString::to_string).unwrap_or_default()
        })
        .collect()
}

impl TestDb {
    /// Records a dead letter of `consumer` read from `queue` for each event
    /// id, in order (as the consumer does when it dead-letters them).
    pub async fn record_dead_letters(&self, consumer: &str, queue: &str, ids: &[Uuid]) {
        let inbox = outbox_diesel::PgInbox::new(&self.schema).unwrap();
        let mut conn = outbox_diesel::connect(&self.url).await.unwrap();
        for (i, id) in ids.iter().enumerate() {
            let body = format!("{{\"n\":{i}}}");
            let mut letter = outbox_core::admin::DeadLetter::new(
                consumer,
                queue,
                format!("{queue}.dlx"),
                "piece.moved",
                format!("row {i} missing"),
                body.as_bytes(),
            );
            letter.event_id = Some(*id);
            letter.message_id = Some(id.to_string());
            letter.event_type = Some("piece.moved".to_owned());
            letter.attempts = 3;
            inbox.record_dead_letter(&mut conn, &letter).await.unwrap();
        }
    }
}
