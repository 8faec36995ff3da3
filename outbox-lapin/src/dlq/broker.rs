//! [`DeadLetterQueues`]: the dead-letter queues of one broker, as the
//! [`DeadLetterBroker`] behind [`DeadLetters`](outbox_core::admin::DeadLetters),
//! and each replay's [`DeadLetterQueue`] as its [`DeadLetterSession`].

use std::fmt;

use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use outbox_core::admin::{
    DeadLetterBroker, DeadLetterSession, DlqReplay, DlqReplayReport, QueueDepth,
};

use super::DeadLetterQueue;
use crate::AmqpUrls;
use crate::Result;

/// The dead-letter queues of one broker, for
/// [`DeadLetters`](outbox_core::admin::DeadLetters): each inspection and
/// purge connects and closes again, and each replay holds its own
/// connection (its [`DeadLetterQueue`]) until it ends, so a long-lived admin
/// router holds no connection between calls and survives broker restarts.
#[derive(Clone)]
pub struct DeadLetterQueues {
    urls: AmqpUrls,
}

impl fmt::Debug for DeadLetterQueues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadLetterQueues")
            .field("urls", &self.urls)
            .finish()
    }
}

impl DeadLetterQueues {
    /// The dead-letter queues of the broker at `urls` (one URL, or one per
    /// cluster node: see [`AmqpUrls`]; not connected yet).
    pub fn new(urls: impl Into<AmqpUrls>) -> Self {
        DeadLetterQueues { urls: urls.into() }
    }

    async fn connect(&self, queue: &str) -> Result<DeadLetterQueue> {
        DeadLetterQueue::connect(&self.urls, queue).await
    }
}

impl DeadLetterBroker for DeadLetterQueues {
    type Error = crate::Error;
    type Session = DeadLetterQueue;

    async fn inspect(&self, queue: &str) -> Result<Option<QueueDepth>> {
        let dlq = self.connect(queue).await?;
        let depth = dlq.inspect().await;
        let _ = dlq.close().await;
        match depth {
            Ok(depth) => Ok(Some(depth)),
            Err(crate::Error::Amqp { source, .. }) if no_such_queue(&source) => Ok(None),
            Err(error) => Err(error),
        }
    }

    async fn open(&self, queue: &str) -> Result<Option<DeadLetterQueue>> {
        let mut dlq = self.connect(queue).await?;
        match dlq.claim().await {
            Ok(true) => Ok(Some(dlq)),
            Ok(false) => {
                let _ = dlq.close().await;
                Ok(None)
            }
            Err(error) => {
                let _ = dlq.close().await;
                Err(error)
            }
        }
    }

    async fn purge(&self, queue: &str) -> Result<u64> {
        let dlq = self.connect(queue).await?;
        let purged = dlq.purge().await;
        let _ = dlq.close().await;
        purged
    }
}

impl DeadLetterSession for DeadLetterQueue {
    type Error = crate::Error;

    async fn replay(
        &mut self,
        limit: usize,
        request: &DlqReplay,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Result<DlqReplayReport> {
        self.skip_unreplayable = request.skip_unreplayable;
        DeadLetterQueue::replay(self, Some(limit), progress).await
    }

    async fn close(self) {
        if let Err(error) = DeadLetterQueue::close(self).await {
            tracing::warn!(%error, "closing a dead-letter replay's connection failed");
        }
    }
}

/// The broker's `404` on a passive declare: the queue does not exist.
fn no_such_queue(error: &lapin::Error) -> bool {
    soft_error(error, &[AMQPSoftError::NOTFOUND])
}

/// The broker's `403`/`405` on an exclusive consume: another consumer holds
/// the queue.
pub(super) fn in_use(error: &lapin::Error) -> bool {
    soft_error(
        error,
        &[AMQPSoftError::ACCESSREFUSED, AMQPSoftError::RESOURCELOCKED],
    )
}

fn soft_error(error: &lapin::Error, kinds: &[AMQPSoftError]) -> bool {
    matches!(
        error.kind(),
        lapin::ErrorKind::ProtocolError(amqp)
            if matches!(amqp.kind(), AMQPErrorKind::Soft(kind) if kinds.contains(kind))
    )
}
