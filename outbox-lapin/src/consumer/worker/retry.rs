//! A failed delivery: republished to its queue for another attempt after
//! the retry delay, or dead-lettered (confirmed, then recorded) at the
//! last; acked once its copy is confirmed, requeued otherwise.

use lapin::BasicProperties;
use lapin::message::Delivery;
use lapin::types::AMQPValue;
use outbox_core::InboxDatabase;
use tokio::sync::watch;
use uuid::Uuid;

use super::ack::{ack, requeue};
use super::headers::origin_headers;
use super::{Attempt, Shared};
use crate::IncomingEvent;
use crate::consumer::dead_letter::dead_letter;
use crate::consumer::republish::{Republisher, text, with_headers};
use crate::consumer::{EventHandler, HandlerError, metric_names};
use crate::headers::{
    ATTEMPT_HEADER, DEAD_LETTER_ID_HEADER, DEAD_REASON_HEADER, LAST_ERROR_HEADER, QUEUE_HEADER,
};

impl<D, H> Shared<D, H>
where
    D: InboxDatabase,
    H: EventHandler<D::Tx>,
{
    /// Retry (after the delay) or dead-letter a failed delivery.
    pub(super) async fn failed(
        &self,
        delivery: &Delivery,
        failure: &Attempt<'_>,
        error: &HandlerError,
        republisher: &Republisher,
        stop: &mut watch::Receiver<bool>,
    ) {
        let Attempt {
            event,
            routing_key,
            attempt,
        } = *failure;
        let settings = &self.settings;
        let reason = error.to_string();
        let max_attempts = i64::from(settings.max_attempts);
        let mut headers = vec![(ATTEMPT_HEADER, AMQPValue::LongLongInt(attempt))];
        headers.extend(origin_headers(delivery, routing_key));
        if error.is_permanent() || attempt >= max_attempts {
            tracing::warn!(
                error = %reason,
                max_attempts,
                permanent = error.is_permanent(),
                dead_letter_exchange = %settings.dead_letter_exchange,
                "handler failed for the last time: dead-lettering the message"
            );
            headers.push((DEAD_REASON_HEADER, text(&reason)));
            headers.push((QUEUE_HEADER, text(&settings.queue)));
            headers.push((DEAD_LETTER_ID_HEADER, text(&Uuid::now_v7().to_string())));
            let properties = with_headers(&delivery.properties, headers);
            self.dead_letter(
                delivery,
                routing_key,
                properties,
                &reason,
                Some(event),
                attempt,
                republisher,
                stop,
            )
            .await;
        } else {
            tracing::warn!(
                error = %reason,
                max_attempts,
                retry_in = ?settings.retry_delay,
                "handler failed: rolled back, retrying"
            );
            self.pause(stop).await;
            headers[0].1 = AMQPValue::LongLongInt(attempt + 1);
            headers.push((LAST_ERROR_HEADER, text(&reason)));
            let properties = with_headers(&delivery.properties, headers);
            // The default exchange routes by queue name: straight back to
            // this queue, whatever the original exchange and bindings.
            let result = republisher
                .publish("", &settings.queue, &delivery.data, properties)
                .await
                .map_err(|e| e.to_string());
            self.settle(delivery, result, metric_names::RETRIED_TOTAL, stop)
                .await;
        }
    }

    /// Republishes `delivery` with `properties` to the dead-letter exchange;
    /// once the broker confirmed the copy, records the dead letter in the
    /// database, then acks (a failed record is logged and acked anyway: the
    /// broker's copy is the message, the record its index). Not confirmed:
    /// requeued after the delay, nothing recorded.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn dead_letter(
        &self,
        delivery: &Delivery,
        routing_key: &str,
        properties: BasicProperties,
        reason: &str,
        event: Option<&IncomingEvent>,
        attempts: i64,
        republisher: &Republisher,
        stop: &mut watch::Receiver<bool>,
    ) {
        let settings = &self.settings;
        let letter = dead_letter(
            settings,
            &properties,
            &delivery.data,
            routing_key,
            reason,
            event,
            attempts,
        );
        let result = republisher
            .publish(
                &settings.dead_letter_exchange,
                routing_key,
                &delivery.data,
                properties,
            )
            .await
            .map_err(|e| e.to_string());
        if result.is_ok() {
            match tokio::time::timeout(RECORD_TIMEOUT, self.db.record_dead_letter(&letter)).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => tracing::warn!(
                    %error,
                    "dead letter not recorded in the database (it is in the dead-letter queue; \
                     `outbox dlq list` will not show it)"
                ),
                Err(_) => tracing::warn!(
                    "recording the dead letter in the database took over {RECORD_TIMEOUT:?}: \
                     given up (it is in the dead-letter queue; `outbox dlq list` may not show it)"
                ),
            }
        }
        self.settle(delivery, result, metric_names::DEAD_LETTERED_TOTAL, stop)
            .await;
    }

    /// Acks `delivery` when its copy was confirmed; otherwise waits the
    /// retry delay and returns it to the queue, so it is never lost.
    async fn settle(
        &self,
        delivery: &Delivery,
        republished: Result<(), String>,
        counter: &'static str,
        stop: &mut watch::Receiver<bool>,
    ) {
        match republished {
            Ok(()) => {
                self.count(counter);
                ack(delivery).await;
            }
            Err(error) => {
                tracing::error!(
                    %error,
                    retry_in = ?self.settings.retry_delay,
                    "republish not confirmed: the message goes back to the queue"
                );
                self.pause(stop).await;
                requeue(delivery).await;
            }
        }
    }
}

/// How long recording a dead letter may take before the worker acks
/// without it.
const RECORD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
