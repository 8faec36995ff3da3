//! [`DeadLetterQueue::replay`]: one message at a time, each copy sent
//! back to the queue it came from and confirmed before its dead letter is
//! acked (or moved to the tail, or left in place, when it cannot go back).

use futures_util::StreamExt as _;
use lapin::message::Delivery;
use lapin::options::BasicAckOptions;
use lapin::types::FieldTable;
use outbox_core::admin::{DlqReplayReport, ReplayedMessage, SkippedMessage, StopCause};
use uuid::Uuid;

use super::headers::{dead_lettered, origin_queue, replay_properties};
use super::{DeadLetterQueue, close};
use crate::Result;
use crate::connection::bounded;
use crate::consumer::republish::RepublishError;
use crate::headers::{DEAD_LETTER_ID_HEADER, DEAD_REASON_HEADER, QUEUE_HEADER};
use crate::wire::header_str;

impl DeadLetterQueue {
    /// Sends up to `limit` dead letters (when `None`, as many as the queue
    /// holds when it starts: copies that fail again and come back to its
    /// tail are not replayed again in the same run) back to the queues they
    /// came from, one at a time, as the type's docs describe; `progress`
    /// gets the number taken (replayed or skipped) so far after each one.
    ///
    /// # Errors
    /// Only when it cannot start (no channel, the queue held by another
    /// consumer: `403`); a replay that stops on a message says why in
    /// [`DlqReplayReport::error`].
    pub async fn replay(
        &mut self,
        limit: Option<usize>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<DlqReplayReport> {
        self.replay_with_hook(limit, progress, &|_| {}).await
    }

    /// [`replay`](Self::replay) calling `confirmed(n)` after the `n`-th copy
    /// is confirmed and before its dead letter is acked: tests crash there.
    #[doc(hidden)]
    pub async fn replay_with_hook(
        &mut self,
        limit: Option<usize>,
        progress: &(dyn Fn(u64) + Sync),
        confirmed: &(dyn Fn(u64) + Sync),
    ) -> Result<DlqReplayReport> {
        // At most what the queue held at the start: a copy that fails again
        // at once is dead-lettered back to the tail and must not be replayed
        // forever in one run.
        let limit = match limit {
            Some(limit) => limit,
            None => self.depth().await? as usize,
        };
        self.reader().await?;
        let mut report = DlqReplayReport::default();
        while report.handled() < limit {
            match self.replay_one(confirmed, &report).await {
                Ok(Some(Taken::Replayed(message))) => {
                    report.replayed += 1;
                    report.messages.push(message);
                }
                Ok(Some(Taken::Skipped(message))) => {
                    tracing::warn!(
                        queue = %self.queue,
                        message_id = ?message.message_id,
                        reason = %message.reason,
                        "dead-letter replay: moved a message it cannot send back to the queue's tail"
                    );
                    report.skipped.push(message);
                }
                Ok(None) => break,
                Err((cause, error)) => {
                    tracing::warn!(queue = %self.queue, ?cause, %error, "dead-letter replay stopped");
                    report.stop(cause, error);
                    break;
                }
            }
            progress(report.handled() as u64);
        }
        if report.error.is_some() {
            // Nothing more this run: the message it stopped at, still
            // unacked, goes back to the queue at its place when the channel
            // closes (once: not nacked first, which a quorum queue would
            // count as a failed delivery).
            self.release().await;
        }
        tracing::info!(
            queue = %self.queue,
            replayed = report.replayed,
            skipped = report.skipped.len(),
            stopped = report.error.is_some(),
            "dead-letter replay done"
        );
        Ok(report)
    }

    /// Stops being the queue's reader: what it holds unacked returns to
    /// the queue.
    pub(super) async fn release(&mut self) {
        if let Some(reader) = self.reader.take() {
            close(reader.channel, self.timeout).await;
        }
    }

    /// The next message of the exclusive consumer; `None` when none comes
    /// within the timeout (the queue is empty).
    async fn next(&mut self) -> std::result::Result<Option<Delivery>, (StopCause, String)> {
        let timeout = self.timeout;
        let queue = self.queue.clone();
        let reader = self
            .reader()
            .await
            .map_err(|e| (StopCause::Broker, e.to_string()))?;
        match tokio::time::timeout(timeout, reader.consumer.next()).await {
            Err(_) => match self.inspect().await {
                Ok(depth) if depth.ready == 0 => Ok(None),
                Ok(depth) => Err((
                    StopCause::Broker,
                    format!(
                        "no message of `{queue}` delivered within {timeout:?} though {} are \
                         ready: the broker is slow or blocked",
                        depth.ready
                    ),
                )),
                Err(error) => Err((StopCause::Broker, error.to_string())),
            },
            Ok(Some(Ok(delivery))) => Ok(Some(delivery)),
            Ok(Some(Err(error))) => Err((
                StopCause::Broker,
                format!("consuming `{queue}` failed: {error}"),
            )),
            Ok(None) => Err((
                StopCause::Broker,
                format!("the broker cancelled the replay's consumer of `{queue}` (queue deleted?)"),
            )),
        }
    }

    /// Takes the next message: replayed, or skipped; `None` when the queue
    /// is empty.
    async fn replay_one(
        &mut self,
        confirmed: &(dyn Fn(u64) + Sync),
        report: &DlqReplayReport,
    ) -> std::result::Result<Option<Taken>, (StopCause, String)> {
        let Some(delivery) = self.next().await? else {
            return Ok(None);
        };
        let dlq = self.queue.clone();
        let message_id = delivery
            .properties
            .message_id()
            .as_ref()
            .map(|id| id.to_string());
        let named = message_id
            .clone()
            .unwrap_or_else(|| "without message_id".to_owned());
        let empty = FieldTable::default();
        let headers = delivery.properties.headers().as_ref().unwrap_or(&empty);
        if !dead_lettered(headers) {
            return Err((
                StopCause::Unreplayable,
                format!(
                    "message {named} in `{dlq}` carries no sign of having been dead-lettered \
                     (no `{QUEUE_HEADER}`, `x-death` or `{DEAD_REASON_HEADER}` header): is \
                     `{dlq}` a dead-letter queue? It was left in place"
                ),
            ));
        }
        let dead_letter_id =
            header_str(headers, DEAD_LETTER_ID_HEADER).and_then(|id| Uuid::parse_str(id).ok());
        let sent = match origin_queue(headers).filter(|origin| *origin != dlq) {
            None => Err(RepublishError::Refused(format!(
                "message {named} in `{dlq}` has neither an `{QUEUE_HEADER}` header nor an \
                 `x-death` entry naming another queue: where it came from is unknown"
            ))),
            Some(origin) => self
                .republisher
                .publish("", &origin, &delivery.data, replay_properties(&delivery))
                .await
                .map(|()| origin.clone())
                .map_err(|error| match error {
                    RepublishError::Refused(why) => RepublishError::Refused(format!(
                        "cannot replay message {named} to queue `{origin}` (does it still \
                         exist?): {why}"
                    )),
                    RepublishError::Failed(why) => RepublishError::Failed(format!(
                        "replaying message {named} to queue `{origin}` failed: {why}"
                    )),
                }),
        };
        let taken = match sent {
            Ok(origin) => {
                confirmed(report.replayed + 1);
                Taken::Replayed(ReplayedMessage::new(origin, message_id, dead_letter_id))
            }
            Err(RepublishError::Refused(reason)) if self.skip_unreplayable => {
                // To this queue's tail, as it is: confirmed before the ack,
                // so a crash leaves it here (once or twice), never nowhere.
                if let Err(error) = self
                    .republisher
                    .publish("", &dlq, &delivery.data, delivery.properties.clone())
                    .await
                {
                    return Err((
                        StopCause::Broker,
                        format!(
                            "{reason}; moving it to the tail of `{dlq}` failed ({error}): it \
                             was left in place"
                        ),
                    ));
                }
                Taken::Skipped(SkippedMessage::new(message_id, dead_letter_id, reason))
            }
            Err(RepublishError::Refused(reason)) => {
                return Err((
                    StopCause::Unreplayable,
                    format!(
                        "{reason}; it was left in `{dlq}` (replay with skip_unreplayable to \
                         move such messages aside and go on)"
                    ),
                ));
            }
            Err(RepublishError::Failed(reason)) => {
                return Err((
                    StopCause::Broker,
                    format!("{reason}; it was left in `{dlq}`"),
                ));
            }
        };
        bounded(
            &format!("ack the replayed message in `{dlq}`"),
            self.timeout,
            delivery.acker.ack(BasicAckOptions::default()),
        )
        .await
        .map_err(|error| {
            (
                StopCause::Broker,
                format!(
                    "message {named} was copied but its ack in `{dlq}` failed ({error}): it is \
                     still there too; a later replay sends it again and the consumer's inbox \
                     drops the duplicate"
                ),
            )
        })?;
        Ok(Some(taken))
    }
}

/// What a replay did with one message.
enum Taken {
    Replayed(ReplayedMessage),
    Skipped(SkippedMessage),
}
