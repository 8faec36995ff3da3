//! [`InboxConsumer::run`]: starts the workers, opens a session and opens
//! it again with a backoff whenever it is lost (stopping at start on
//! errors that waiting does not heal), and shuts down gracefully.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use lapin::ErrorKind;
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use outbox_core::{Backoff, InboxDatabase};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use super::dispatch::consume;
use super::session::{Ended, NO_NODE, SESSION_TIMEOUT, open_session};
use super::worker::{self, Shared};
use super::{EventHandler, InboxConsumer, metric_names};
use crate::{Error, Result};

impl<D, H> InboxConsumer<D, H>
where
    D: InboxDatabase,
    H: EventHandler<D::Tx>,
{
    /// Consumes until `shutdown` completes, then shuts down gracefully (see
    /// the type's docs) and returns `Ok(())`.
    ///
    /// Lost connections are re-established; the broker being unreachable at
    /// start is retried the same way (and logged).
    ///
    /// # Errors
    /// [`Error::Amqp`] when the queue or dead-letter exchange does not exist
    /// or a declaration is refused, [`Error::Config`] for a
    /// [declared](crate::InboxConsumerBuilder::declare) topology with invalid names.
    /// Deliveries in hand are still finished first.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<()> {
        let InboxConsumer {
            settings,
            db,
            handler,
        } = self;
        let shared = Arc::new(Shared {
            settings: settings.clone(),
            db,
            handler,
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut workers = JoinSet::new();
        let mut queues = Vec::with_capacity(settings.concurrency);
        for _ in 0..settings.concurrency {
            let (tx, rx) = mpsc::channel(usize::from(settings.prefetch));
            queues.push(tx);
            workers.spawn(worker::run(shared.clone(), rx, stop_rx.clone()));
        }
        tracing::info!(
            consumer = %settings.name,
            queue = %settings.queue,
            concurrency = settings.concurrency,
            "inbox consumer starting"
        );

        let mut shutdown = pin!(shutdown);
        // Jittered: consumers that lost the same broker come back spread out.
        let mut backoff = Backoff::new(settings.reconnect_min, settings.reconnect_max);
        let mut kept_open = None;
        // Fatal errors stop `run` only before the first session: once the
        // consumer has run, a 404 or 403 while reconnecting is most likely
        // the broker restarting (queues recovering), so it keeps trying.
        let mut has_run = false;
        let result = loop {
            let node = AtomicUsize::new(NO_NODE);
            let opened = tokio::select! {
                biased;
                () = &mut shutdown => break Ok(()),
                // Bounded as a whole: a broker that is starting may accept
                // the connection and leave a declaration unanswered.
                opened = tokio::time::timeout(SESSION_TIMEOUT, open_session(&settings, &node)) => {
                    opened.unwrap_or_else(|_| Err(Error::ConnectTimeout {
                        url: settings.urls.to_string(),
                        after: SESSION_TIMEOUT,
                    }))
                }
            };
            // A node that answered the handshake but not the rest of the
            // session (a minority node in a partition, a node that froze):
            // the next round starts at the next URL.
            let node = node.into_inner();
            if opened.is_err() && node != NO_NODE {
                settings.urls.failed(node);
            }
            let reason = match opened {
                Ok(session) => {
                    has_run = true;
                    backoff.reset();
                    tracing::info!(consumer = %settings.name, queue = %settings.queue, "consuming");
                    match consume(&settings, session, &queues, &mut shutdown).await {
                        Ended::Shutdown(session) => {
                            kept_open = Some(session);
                            break Ok(());
                        }
                        Ended::Lost(reason) => {
                            ::metrics::counter!(
                                metric_names::CONNECTION_LOST_TOTAL,
                                "consumer" => settings.name.clone()
                            )
                            .increment(1);
                            reason
                        }
                    }
                }
                Err(error) if is_fatal(&error) && !has_run => {
                    tracing::error!(consumer = %settings.name, %error, "inbox consumer stops");
                    break Err(error);
                }
                Err(error) if is_fatal(&error) => {
                    tracing::error!(
                        consumer = %settings.name,
                        %error,
                        "inbox consumer cannot resume (the broker may be restarting); retrying"
                    );
                    error.to_string()
                }
                Err(error) => error.to_string(),
            };
            let retry_in = backoff.next_delay();
            tracing::warn!(
                consumer = %settings.name,
                error = %reason,
                ?retry_in,
                "not connected to RabbitMQ; reconnecting"
            );
            tokio::select! {
                biased;
                () = &mut shutdown => break Ok(()),
                () = tokio::time::sleep(retry_in) => {}
            }
        };

        // Graceful: workers finish the delivery in hand, requeue the rest.
        let _ = stop_tx.send(true);
        drop(queues);
        while let Some(joined) = workers.join_next().await {
            if let Err(error) = joined {
                tracing::error!(consumer = %settings.name, %error, "a consumer worker failed");
            }
        }
        drop(stop_tx);
        if let Some(session) = kept_open {
            drop(session.depth);
            drop(session.consumer);
            if let Err(error) = session.connection.close(200, "OK".into()).await {
                tracing::debug!(%error, "closing the connection at shutdown");
            }
            drop(session.channel);
        }
        tracing::info!(consumer = %settings.name, "inbox consumer stopped");
        result
    }
}

/// Errors that waiting does not heal: missing or conflicting topology,
/// refused access, invalid configuration.
fn is_fatal(error: &Error) -> bool {
    match error {
        Error::Config(_) => true,
        Error::Amqp { source, .. } => match source.kind() {
            ErrorKind::ProtocolError(amqp) => matches!(
                amqp.kind(),
                AMQPErrorKind::Soft(
                    AMQPSoftError::NOTFOUND
                        | AMQPSoftError::ACCESSREFUSED
                        | AMQPSoftError::PRECONDITIONFAILED
                )
            ),
            _ => false,
        },
        _ => false,
    }
}
