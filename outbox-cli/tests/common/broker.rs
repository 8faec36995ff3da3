//! A consumer queue and its dead-letter queue of one test on the real
//! RabbitMQ, deleted when the test ends (also when it panics), and dead
//! letters in them as the consumer leaves them.

use std::time::{Duration, Instant};

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use uuid::Uuid;

use super::TestDb;

pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// `<name>` and `<name>.dead`, named after the test and the process.
pub struct Queues {
    pub origin: String,
    pub dlq: String,
    conn: Connection,
    channel: Channel,
}

impl Queues {
    pub async fn new(test: &str) -> Queues {
        let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| {
                panic!("RabbitMQ not reachable: {e}; start it with scripts/dev-services")
            });
        let channel = conn.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let n = super::schema_name(test);
        let origin = format!("test.cli.{n}");
        let dlq = format!("{origin}.dead");
        for queue in [&origin, &dlq] {
            channel
                .queue_declare(
                    queue.as_str().into(),
                    QueueDeclareOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        }
        Queues {
            origin,
            dlq,
            conn,
            channel,
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
                self.channel
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
        self.channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap()
            .message_count()
    }

    /// Waits until `check(depth of origin, depth of dlq)` holds.
    pub async fn wait_for(&self, what: &str, check: impl Fn(u32, u32) -> bool) -> (u32, u32) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let depths = (self.depth(&self.origin).await, self.depth(&self.dlq).await);
            if check(depths.0, depths.1) {
                return depths;
            }
            assert!(Instant::now() < deadline, "{what}: depths {depths:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The message ids in `queue`, in order, leaving them there (got
    /// without ack on a channel that is then closed: they are requeued).
    pub async fn peek(&self, queue: &str) -> Vec<String> {
        let channel = self.conn.create_channel().await.unwrap();
        let ids = get_all(&channel, queue, false).await;
        channel.close(200, "OK".into()).await.unwrap();
        ids
    }

    /// The message ids in `queue`, in order, taking them out.
    pub async fn drain(&self, queue: &str) -> Vec<String> {
        get_all(&self.channel, queue, true).await
    }
}

async fn get_all(channel: &Channel, queue: &str, no_ack: bool) -> Vec<String> {
    let mut ids = Vec::new();
    while let Some(got) = channel
        .basic_get(queue.into(), BasicGetOptions { no_ack })
        .await
        .unwrap()
    {
        let id = got.delivery.properties.message_id().as_ref();
        ids.push(id.map(ToString::to_string).unwrap_or_default());
    }
    ids
}

impl Drop for Queues {
    fn drop(&mut self) {
        let queues = [self.origin.clone(), self.dlq.clone()];
        // A runtime of its own on another thread: this may run inside the
        // test's runtime, and during a panic.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                let Ok(conn) =
                    Connection::connect(&amqp_url(), ConnectionProperties::default()).await
                else {
                    return;
                };
                if let Ok(channel) = conn.create_channel().await {
                    for queue in &queues {
                        let _ = channel
                            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                            .await;
                    }
                }
                let _ = conn.close(200, "OK".into()).await;
            });
        })
        .join();
    }
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
