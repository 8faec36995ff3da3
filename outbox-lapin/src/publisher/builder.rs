//! [`LapinPublisherBuilder`]: a [`LapinPublisher`]'s settings, their
//! defaults and their validation.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lapin::ExchangeKind;
use outbox_core::EventEnvelope;
use tokio::sync::Mutex;

use super::settings::Settings;
use super::{Inner, LapinPublisher};
use crate::{AmqpUrls, Error, Result};

/// Settings of a [`LapinPublisher`].
///
/// | setting | default |
/// |---|---|
/// | [`exchange`](Self::exchange) | `outbox.events` |
/// | [`exchange_kind`](Self::exchange_kind) | topic |
/// | [`declare_exchange`](Self::declare_exchange) | yes (durable) |
/// | [`source`](Self::source) | `/outbox` (`cloudEvents:source`) |
/// | [`routing_key`](Self::routing_key) | the event type |
/// | [`confirm_timeout`](Self::confirm_timeout) | 10 s |
/// | [`operation_timeout`](Self::operation_timeout) | 10 s |
/// | [`connection_name`](Self::connection_name) | `outbox-relay` |
#[must_use]
pub struct LapinPublisherBuilder {
    settings: Settings,
}

impl fmt::Debug for LapinPublisherBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LapinPublisherBuilder")
            .field("urls", &self.settings.urls)
            .field("exchange", &self.settings.exchange)
            .finish_non_exhaustive()
    }
}

impl LapinPublisherBuilder {
    /// The exchange to publish to. Default `outbox.events`.
    pub fn exchange(mut self, name: impl Into<String>) -> Self {
        self.settings.exchange = name.into();
        self
    }

    /// The exchange's kind, when the publisher declares it. Default topic.
    pub fn exchange_kind(mut self, kind: ExchangeKind) -> Self {
        self.settings.kind = kind;
        self
    }

    /// Whether to declare the exchange (durable) on connect. Default yes;
    /// turn it off when the exchange is managed elsewhere.
    pub fn declare_exchange(mut self, declare: bool) -> Self {
        self.settings.declare = declare;
        self
    }

    /// The `cloudEvents:source` of every message, a URI naming the producing
    /// service (e.g. `/ecommerce`). Default `/outbox`.
    pub fn source(mut self, source: impl Into<String>) -> Self {
        self.settings.source = source.into();
        self
    }

    /// Overrides the routing key (default: the event type, so dotted types
    /// such as `order.placed` route naturally on a topic exchange).
    pub fn routing_key(
        mut self,
        f: impl Fn(&EventEnvelope) -> String + Send + Sync + 'static,
    ) -> Self {
        self.settings.routing_key = Some(Arc::new(f));
        self
    }

    /// Sends some events to another exchange: when `f` returns `Some(name)`,
    /// that exchange is used instead of the configured one (it is not
    /// declared by the publisher). A missing exchange closes the channel
    /// (404); only the events routed there fail.
    pub fn exchange_for(
        mut self,
        f: impl Fn(&EventEnvelope) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.settings.exchange_for = Some(Arc::new(f));
        self
    }

    /// How long to wait for a batch's confirms (sending included); a message
    /// unconfirmed by then is [`PublishOutcome::Unconfirmed`]: no attempt
    /// is spent, and it is published again after the relay's pause or its
    /// destination's circuit breaker. The relay also passes its claim's
    /// deadline ([`Claim::valid_until`](outbox_core::Claim::valid_until)) to
    /// each publish, and the wait ends at whichever comes first, so a wave
    /// started late in a claim never outlives it, whatever this setting.
    /// Default 10 s.
    ///
    /// [`PublishOutcome::Unconfirmed`]: outbox_core::PublishOutcome::Unconfirmed
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.settings.confirm_timeout = timeout;
        self
    }

    /// How long the broker may take to answer any other operation (opening
    /// a channel, `confirm.select`, declaring the exchange, closing a
    /// channel); connecting is bounded by [`CONNECT_TIMEOUT`](crate::CONNECT_TIMEOUT).
    /// A call not answered in time counts as "broker unavailable" (the
    /// relay pauses, no attempt is spent) and its connection is not used
    /// again. Default 10 s.
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.settings.operation_timeout = timeout;
        self
    }

    /// The client-provided connection name (visible in the management UI and
    /// `rabbitmqctl list_connections`). Default `outbox-relay`.
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.settings.connection_name = name.into();
        self
    }

    /// Validates the settings. Does not connect: the first publish (or
    /// [`LapinPublisher::connect`]) does.
    ///
    /// # Errors
    /// [`Error::NoUrls`] for an empty URL list; [`Error::Config`] for an
    /// empty or over-long exchange name, or a zero confirm or operation
    /// timeout.
    pub fn build(self) -> Result<LapinPublisher> {
        self.settings.urls.check()?;
        if self.settings.exchange.len() > 255 {
            return Err(Error::Config("exchange name longer than 255 bytes".into()));
        }
        if self.settings.exchange.is_empty() && self.settings.declare {
            return Err(Error::Config(
                "the default exchange (\"\") cannot be declared; set declare_exchange(false)"
                    .into(),
            ));
        }
        if self.settings.confirm_timeout.is_zero() {
            return Err(Error::Config("confirm_timeout must be positive".into()));
        }
        if self.settings.operation_timeout.is_zero() {
            return Err(Error::Config("operation_timeout must be positive".into()));
        }
        Ok(LapinPublisher {
            inner: Arc::new(Inner {
                settings: self.settings,
                state: std::sync::Mutex::default(),
                connecting: Mutex::new(()),
            }),
        })
    }
}

impl LapinPublisher {
    /// Starts configuring a publisher for the broker at `urls`: one URL,
    /// or one per node of a cluster (a comma-separated string, a `Vec` or
    /// an array; see [`AmqpUrls`] for the order they are tried in).
    pub fn builder(urls: impl Into<AmqpUrls>) -> LapinPublisherBuilder {
        LapinPublisherBuilder {
            settings: Settings::new(urls.into()),
        }
    }
}
