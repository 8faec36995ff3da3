//! Where an event goes (its exchange and routing key), and whether it can
//! go on the wire at all (short strings, the header frame against
//! `frame_max`): what cannot is unpublishable, never sent.

use outbox_core::{EventEnvelope, Headers};

use super::LapinPublisher;
use crate::wire;

impl LapinPublisher {
    pub(super) fn exchange(&self, envelope: &EventEnvelope) -> String {
        self.inner
            .settings
            .exchange_for
            .as_ref()
            .and_then(|f| f(envelope))
            .unwrap_or_else(|| self.inner.settings.exchange.clone())
    }

    pub(super) fn routing_key(&self, envelope: &EventEnvelope) -> String {
        match &self.inner.settings.routing_key {
            Some(f) => f(envelope),
            None => envelope.event_type.clone(),
        }
    }

    /// Where `envelope` goes (its exchange and routing key, computed once
    /// per publish), or why it cannot be put on the wire: it breaks
    /// [`EventEnvelope::validate_wire`] (an envelope stored by another
    /// writer, or before the limits were enforced), or its exchange name or
    /// routing key is longer than an AMQP short string holds (255 bytes).
    /// `validate_wire` counts the headers as they are sent (a malformed
    /// trace context header is left out).
    pub(super) fn target(
        &self,
        envelope: &EventEnvelope,
    ) -> std::result::Result<(String, String), String> {
        envelope.validate_wire().map_err(|err| err.to_string())?;
        let fits = |what: &str, value: String| {
            if value.len() > EventEnvelope::MAX_SHORT_BYTES {
                Err(format!(
                    "{what} is {} bytes long; AMQP allows at most {}",
                    value.len(),
                    EventEnvelope::MAX_SHORT_BYTES
                ))
            } else {
                Ok(value)
            }
        };
        Ok((
            fits("the exchange name", self.exchange(envelope))?,
            fits("the routing key", self.routing_key(envelope))?,
        ))
    }
}

/// Checks that `envelope`'s content header frame (its properties, headers
/// included, exactly as they are sent: with `trace`, its `publish` span's
/// trace context, in place of the recorded one) fits `frame_max`, and, when
/// `trace` is sent, that the headers still fit
/// [`EventEnvelope::MAX_HEADERS_BYTES`] (without it,
/// [`EventEnvelope::validate_wire`] checked them as they are sent).
pub(super) fn header_frame_fits(
    envelope: &EventEnvelope,
    source: &str,
    trace: Option<&Headers>,
    frame_max: u32,
) -> std::result::Result<(), String> {
    if trace.is_some() {
        let bytes = wire::forwarded_bytes(envelope, trace);
        if bytes > EventEnvelope::MAX_HEADERS_BYTES {
            return Err(format!(
                "its headers, with the publish span's trace context, are {bytes} bytes long \
                 encoded; at most {} are allowed",
                EventEnvelope::MAX_HEADERS_BYTES
            ));
        }
    }
    let properties = wire::properties_with(envelope, source, trace);
    let encoded = lapin::protocol::basic::gen_properties(&properties)(Vec::new().into())
        .map(|written| written.position)
        .map_err(|err| format!("its properties cannot be encoded: {err}"))?;
    // Frame type (1), channel (2), size (4), class (2), weight (2), body
    // size (8), the properties, frame end (1).
    let frame = encoded.saturating_add(20);
    if frame > u64::from(frame_max) {
        return Err(format!(
            "its header frame (properties and headers) is {frame} bytes; the connection's \
             frame_max is {frame_max}: fewer or shorter headers are needed"
        ));
    }
    Ok(())
}
