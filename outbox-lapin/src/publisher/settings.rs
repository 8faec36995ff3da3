//! [`Settings`]: what a publisher's builder sets and the running publisher
//! reads, one struct for both, with the defaults the builder documents.

use std::sync::Arc;
use std::time::Duration;

use lapin::ExchangeKind;

use super::{ExchangeFn, RoutingKeyFn};
use crate::AmqpUrls;

/// A publisher's settings (see
/// [`LapinPublisherBuilder`](super::LapinPublisherBuilder) for each).
pub(crate) struct Settings {
    pub(crate) urls: AmqpUrls,
    pub(crate) exchange: String,
    pub(crate) kind: ExchangeKind,
    pub(crate) declare: bool,
    pub(crate) source: String,
    pub(crate) routing_key: Option<Arc<RoutingKeyFn>>,
    pub(crate) exchange_for: Option<Arc<ExchangeFn>>,
    pub(crate) confirm_timeout: Duration,
    pub(crate) operation_timeout: Duration,
    pub(crate) connection_name: String,
}

impl Settings {
    /// The defaults, for the broker at `urls`.
    pub(crate) fn new(urls: AmqpUrls) -> Self {
        Settings {
            urls,
            exchange: "outbox.events".into(),
            kind: ExchangeKind::Topic,
            declare: true,
            source: "/outbox".into(),
            routing_key: None,
            exchange_for: None,
            confirm_timeout: Duration::from_secs(10),
            operation_timeout: Duration::from_secs(10),
            connection_name: "outbox-relay".into(),
        }
    }
}
