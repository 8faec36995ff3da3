//! The publisher's connection (the exchange declared on connect) and its
//! confirm-mode channels: each batch checks one out for its exclusive use
//! and checks it back in when it is clean. Every broker call is bounded and
//! none runs under the state lock.

use std::sync::Arc;
use std::time::Duration;

use lapin::options::ConfirmSelectOptions;
use lapin::{Channel, Connection};
use tokio::time::Instant;

use super::{BLOCKED_GAUGE, LapinPublisher};
use crate::connection::{bounded, connect_to_node};
use crate::{Error, Result, declare_exchange};

#[derive(Default)]
pub(super) struct State {
    session: Option<Session>,
    /// Counts connections: a channel goes back to the idle ones only if it
    /// belongs to the current one.
    generation: u64,
}

struct Session {
    connection: Arc<Connection>,
    /// The [`State::generation`] of this connection.
    generation: u64,
    /// The index of its URL in the settings' [`AmqpUrls`](crate::AmqpUrls).
    node: usize,
    /// Confirm-mode channels not in use by a batch right now.
    idle: Vec<Channel>,
}

/// Idle channels kept per connection; more are closed when returned.
const MAX_IDLE_CHANNELS: usize = 8;

impl LapinPublisher {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // Every update of the state is a single assignment or push: a
        // panic elsewhere cannot leave it half-changed.
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The current connection and its generation, if it is still open.
    fn current(&self) -> Option<(Arc<Connection>, u64)> {
        let mut state = self.state();
        let usable = state
            .session
            .as_ref()
            .is_some_and(|s| s.connection.status().connected());
        if !usable {
            state.session = None;
            return None;
        }
        state
            .session
            .as_ref()
            .map(|s| (Arc::clone(&s.connection), s.generation))
    }

    /// The current connection, or a new one (with the exchange declared).
    /// Every step is bounded, and the state lock is never held across one.
    pub(super) async fn connection(&self) -> Result<(Arc<Connection>, u64)> {
        if let Some(current) = self.current() {
            return Ok(current);
        }
        // One batch connects while the others wait for it (a bounded wait:
        // connecting is bounded) and then use its connection.
        let _connecting = self.inner.connecting.lock().await;
        if let Some(current) = self.current() {
            return Ok(current);
        }
        let urls = &self.inner.settings.urls;
        let (connection, node) =
            connect_to_node(urls, &self.inner.settings.connection_name).await?;
        // The node is remembered only once the connection is usable: one
        // that completes the handshake and then never answers moves the
        // next round on to the next URL.
        let channel = match self.usable(&connection).await {
            Ok(channel) => {
                urls.worked(node);
                channel
            }
            Err(error) => {
                urls.failed(node);
                return Err(error);
            }
        };
        tracing::info!(
            connection = %self.inner.settings.connection_name,
            exchange = %self.inner.settings.exchange,
            "outbox publisher connected"
        );
        let connection = Arc::new(connection);
        let mut state = self.state();
        state.generation += 1;
        let generation = state.generation;
        state.session = Some(Session {
            connection: Arc::clone(&connection),
            generation,
            node,
            idle: vec![channel],
        });
        Ok((connection, generation))
    }

    /// A confirm-mode channel on `connection`, with the exchange declared
    /// when the settings ask for it.
    async fn usable(&self, connection: &Connection) -> Result<Channel> {
        let channel = self.open_channel(connection).await?;
        if self.inner.settings.declare {
            let limit = self.inner.settings.operation_timeout;
            tokio::time::timeout(
                limit,
                declare_exchange(
                    &channel,
                    &self.inner.settings.exchange,
                    self.inner.settings.kind.clone(),
                ),
            )
            .await
            .map_err(|_| Error::Timeout {
                operation: format!("declare exchange {}", self.inner.settings.exchange),
                after: limit,
            })??;
        }
        Ok(channel)
    }

    /// Stops using connection `generation` (a call on it timed out): the
    /// next batch connects anew. Batches still using it finish on it,
    /// bounded; the last one to drop it closes it without waiting.
    pub(super) fn discard(&self, generation: u64, why: &str) {
        let mut state = self.state();
        if state
            .session
            .as_ref()
            .is_some_and(|s| s.generation == generation)
        {
            tracing::warn!(
                connection = %self.inner.settings.connection_name,
                reason = why,
                "outbox publisher drops its RabbitMQ connection; the next batch reconnects"
            );
            // A call timed out on it: the next round starts at the next node.
            if let Some(session) = state.session.take() {
                self.inner.settings.urls.failed(session.node);
            }
        }
    }

    /// A new confirm-mode channel, each step bounded.
    async fn open_channel(&self, connection: &Connection) -> Result<Channel> {
        let limit = self.inner.settings.operation_timeout;
        let channel = bounded("open channel", limit, connection.create_channel()).await?;
        bounded(
            "confirm.select",
            limit,
            channel.confirm_select(ConfirmSelectOptions::default()),
        )
        .await?;
        Ok(channel)
    }

    /// A fresh channel after the broker closed the last one. While the old
    /// channel is still closing (another batch's message closed it a moment
    /// ago), lapin refuses to open one: retry for up to a second as long as
    /// the connection is up. A call that times out ends it at once: the
    /// broker is not answering.
    async fn reopen_channel(&self, connection: &Connection) -> std::result::Result<Channel, Error> {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            match self.open_channel(connection).await {
                Ok(channel) => return Ok(channel),
                Err(err @ Error::Timeout { .. }) => return Err(err),
                Err(err) if connection.status().connected() && Instant::now() < deadline => {
                    tracing::debug!(error = %err, "channel not reopened yet; retrying");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// Connects if needed, checks for a blocked connection, and hands out a
    /// confirm-mode channel for one batch's exclusive use: an idle one, or
    /// a `fresh` one. Every broker call is bounded and none runs under the
    /// state lock. `Err` is the reason every event of the batch counts as
    /// connection lost.
    pub(super) async fn checkout(&self, fresh: bool) -> std::result::Result<Checkout, String> {
        let (connection, generation) = match self.connection().await {
            Ok(current) => current,
            Err(err) => {
                tracing::warn!(error = %err, "outbox publisher cannot connect");
                return Err(err.to_string());
            }
        };
        let blocked = connection.status().blocked();
        metrics::gauge!(BLOCKED_GAUGE).set(if blocked { 1.0 } else { 0.0 });
        if blocked {
            tracing::warn!("RabbitMQ blocked the publisher (resource alarm); pausing");
            return Err(
                "RabbitMQ blocked publishing (connection.blocked: a memory or disk alarm)".into(),
            );
        }
        if !fresh {
            let mut state = self.state();
            if let Some(session) = state
                .session
                .as_mut()
                .filter(|s| s.generation == generation)
            {
                while let Some(channel) = session.idle.pop() {
                    if channel.status().connected() {
                        return Ok(Checkout {
                            connection,
                            channel,
                            generation,
                            fresh: false,
                        });
                    }
                }
            }
        }
        match self.reopen_channel(&connection).await {
            Ok(channel) => Ok(Checkout {
                connection,
                channel,
                generation,
                fresh: true,
            }),
            Err(err) => {
                if matches!(err, Error::Timeout { .. }) {
                    self.discard(generation, &err.to_string());
                }
                Err(format!("cannot open a channel: {err}"))
            }
        }
    }

    /// Returns a batch's channel to the idle ones if it is `clean` (every
    /// message answered), still open and of the current connection;
    /// otherwise closes it in the background (bounded), so that no batch
    /// waits for a broker that does not answer.
    pub(super) fn checkin(&self, checkout: Checkout, clean: bool) {
        let channel = checkout.channel;
        if !channel.status().connected() {
            return;
        }
        if clean {
            let mut state = self.state();
            if let Some(session) = state.session.as_mut()
                && session.generation == checkout.generation
                && session.connection.status().connected()
                && session.idle.len() < MAX_IDLE_CHANNELS
            {
                session.idle.push(channel);
                return;
            }
        }
        let limit = self.inner.settings.operation_timeout;
        tokio::spawn(async move {
            if let Err(error) = bounded(
                "close channel",
                limit,
                channel.close(200, "not needed".into()),
            )
            .await
            {
                tracing::debug!(%error, "closing a spare channel failed");
            }
        });
    }
}

/// A channel handed to one batch.
pub(super) struct Checkout {
    pub(super) connection: Arc<Connection>,
    pub(super) channel: Channel,
    /// The [`Session::generation`] it belongs to.
    pub(super) generation: u64,
    /// Opened for this batch (not reused): a channel error on it can only
    /// come from this batch's messages.
    pub(super) fresh: bool,
}
