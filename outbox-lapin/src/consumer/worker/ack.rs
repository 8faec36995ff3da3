//! Acks and nacks, each bounded: on a connection going away they may
//! never complete, and the broker redelivers or requeues the message
//! anyway.

use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions};

/// Returns `delivery` to the queue (nack with requeue).
pub(super) async fn requeue(delivery: &Delivery) {
    let requeue = BasicNackOptions {
        requeue: true,
        multiple: false,
    };
    let Ok(nacked) = tokio::time::timeout(SETTLE_TIMEOUT, delivery.acker.nack(requeue)).await
    else {
        tracing::warn!("nack did not complete: the broker requeues the message with its channel");
        return;
    };
    match nacked {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            "nack not sent: the channel is closed and the broker requeues the message"
        ),
        Err(error) => tracing::warn!(
            %error,
            "nack failed: the channel is closed and the broker requeues the message"
        ),
    }
}

/// How long an ack or nack may take. On a connection that is going away it
/// may never complete; the broker then redelivers the message (to be
/// recognised by the inbox), so the worker moves on instead of waiting.
const SETTLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

pub(super) async fn ack(delivery: &Delivery) {
    let Ok(acked) = tokio::time::timeout(
        SETTLE_TIMEOUT,
        delivery.acker.ack(BasicAckOptions::default()),
    )
    .await
    else {
        tracing::warn!(
            "ack did not complete: the broker redelivers the message and the inbox recognises it"
        );
        return;
    };
    match acked {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            "ack not sent (the channel is closed): the broker redelivers the message and the \
             inbox recognises it"
        ),
        Err(error) => tracing::warn!(
            %error,
            "ack failed: the broker redelivers the message and the inbox recognises it"
        ),
    }
}
