//! [`TestEvent`]: one sample [`DomainEvent`] for every test that needs "an
//! event", whatever its store.

use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use crate::DomainEvent;

/// A [`DomainEvent`] for tests: its aggregate and event type, aggregate id,
/// version and payload are chosen by the test.
///
/// [`TestEvent::new`] makes a `thing.changed` event of aggregate type
/// `thing` whose payload is `{"aggregate": <id>}`; the builder methods
/// change the types ([`of_type`](Self::of_type)), add a version
/// ([`version`](Self::version)) or add payload fields
/// ([`field`](Self::field)). It serializes as its payload.
///
/// ```
/// use outbox_core::EventEnvelope;
/// use outbox_core::testing::TestEvent;
///
/// let event = TestEvent::new("p-1")
///     .of_type("piece", "piece.moved")
///     .version(3)
///     .field("n", 3);
/// let envelope = EventEnvelope::from_event(&event)?;
/// assert_eq!(envelope.aggregate_type, "piece");
/// assert_eq!(envelope.event_type, "piece.moved");
/// assert_eq!(envelope.aggregate_id, "p-1");
/// assert_eq!(envelope.aggregate_version, Some(3));
/// assert_eq!(envelope.payload, r#"{"aggregate":"p-1","n":3}"#);
/// # Ok::<(), outbox_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct TestEvent {
    aggregate_type: &'static str,
    event_type: &'static str,
    aggregate_id: String,
    version: Option<i64>,
    payload: Map<String, Value>,
}

impl TestEvent {
    /// The aggregate type of [`TestEvent::new`].
    pub const AGGREGATE_TYPE: &'static str = "thing";
    /// The event type of [`TestEvent::new`].
    pub const EVENT_TYPE: &'static str = "thing.changed";

    /// A `thing.changed` event of aggregate `thing`/`aggregate_id`, without
    /// a version, with the payload `{"aggregate": aggregate_id}`.
    pub fn new(aggregate_id: impl Into<String>) -> Self {
        let aggregate_id = aggregate_id.into();
        let mut payload = Map::new();
        payload.insert("aggregate".to_owned(), Value::from(aggregate_id.clone()));
        TestEvent {
            aggregate_type: Self::AGGREGATE_TYPE,
            event_type: Self::EVENT_TYPE,
            aggregate_id,
            version: None,
            payload,
        }
    }

    /// Another aggregate type and event type.
    #[must_use]
    pub fn of_type(mut self, aggregate_type: &'static str, event_type: &'static str) -> Self {
        self.aggregate_type = aggregate_type;
        self.event_type = event_type;
        self
    }

    /// The aggregate version (default: none).
    #[must_use]
    pub fn version(mut self, version: i64) -> Self {
        self.version = Some(version);
        self
    }

    /// Adds (or replaces) the payload field `key`.
    #[must_use]
    pub fn field(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.payload.insert(key.to_owned(), value.into());
        self
    }

    /// The payload, as it is serialized.
    pub fn payload(&self) -> &Map<String, Value> {
        &self.payload
    }
}

impl Serialize for TestEvent {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.payload.serialize(serializer)
    }
}

impl DomainEvent for TestEvent {
    fn aggregate_type(&self) -> &'static str {
        self.aggregate_type
    }
    fn event_type(&self) -> &'static str {
        self.event_type
    }
    fn aggregate_id(&self) -> String {
        self.aggregate_id.clone()
    }
    fn aggregate_version(&self) -> Option<i64> {
        self.version
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EventEnvelope;

    #[test]
    fn defaults_and_builder() {
        let plain = EventEnvelope::from_event(&TestEvent::new("a")).unwrap();
        assert_eq!(
            (plain.aggregate_type.as_str(), plain.event_type.as_str()),
            ("thing", "thing.changed")
        );
        assert_eq!(plain.aggregate_id, "a");
        assert_eq!(plain.aggregate_version, None);
        assert_eq!(plain.payload, r#"{"aggregate":"a"}"#);

        let event = TestEvent::new("p")
            .of_type("piece", "piece.moved")
            .version(7)
            .field("n", 7)
            .field("secret", "4111");
        assert_eq!(event.payload()["n"], 7);
        let built = EventEnvelope::from_event(&event).unwrap();
        assert_eq!(
            (built.aggregate_type.as_str(), built.event_type.as_str()),
            ("piece", "piece.moved")
        );
        assert_eq!(built.aggregate_version, Some(7));
        assert_eq!(
            serde_json::from_str::<Value>(&built.payload).unwrap(),
            serde_json::json!({ "aggregate": "p", "n": 7, "secret": "4111" })
        );
    }
}
