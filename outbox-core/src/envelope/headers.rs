//! [`Headers`]: the string headers carried with an event (trace context,
//! correlation ids).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// String headers carried with an event (trace context, correlation ids).
///
/// Well-known keys are associated constants; any other key is allowed.
///
/// ```
/// use outbox_core::Headers;
///
/// let headers = Headers::new()
///     .with(Headers::CORRELATION_ID, "req-42")
///     .with("tenant", "acme");
/// assert_eq!(headers.get(Headers::CORRELATION_ID), Some("req-42"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Headers(BTreeMap<String, String>);

impl Headers {
    /// W3C trace context `traceparent`.
    pub const TRACEPARENT: &'static str = "traceparent";
    /// W3C trace context `tracestate`.
    pub const TRACESTATE: &'static str = "tracestate";
    /// W3C baggage (carried only when opted in:
    /// [`carry_baggage`](crate::trace_context::carry_baggage)).
    pub const BAGGAGE: &'static str = "baggage";
    /// Groups every event caused, directly or not, by one request.
    pub const CORRELATION_ID: &'static str = "correlation_id";
    /// The id of the event (or command) that directly caused this one.
    pub const CAUSATION_ID: &'static str = "causation_id";

    /// Empty headers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a header, builder style.
    #[must_use]
    pub fn with(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.insert(key, value);
        self
    }

    /// Adds or replaces a header, returning the previous value.
    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<String>) -> Option<String> {
        self.0.insert(key.into(), value.into())
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        self.0.remove(key)
    }

    /// Iterates over the headers in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Number of headers.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// `true` when there are no headers.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Adds every header of `other` that is not already set here.
    pub fn merge_missing(&mut self, other: &Headers) {
        for (k, v) in other.iter() {
            self.0.entry(k.to_owned()).or_insert_with(|| v.to_owned());
        }
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Headers {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Headers(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}
