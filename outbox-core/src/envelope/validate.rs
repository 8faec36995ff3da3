//! The limits of an [`EventEnvelope`] (what stores index and AMQP
//! carries) and the invariants every store and publisher relies on.

use super::{EventEnvelope, Headers};
use crate::Error;

impl EventEnvelope {
    /// The longest aggregate id, in bytes (UTF-8). Stores index it (the
    /// PostgreSQL outbox's index entries are limited to 2,704 bytes), and
    /// it travels in two message headers.
    pub const MAX_AGGREGATE_ID_BYTES: usize = 2048;
    /// The longest aggregate type, event type, header name and correlation
    /// id, in bytes: they become AMQP short strings (`type` property, header
    /// names, `correlation_id` property, routing key), which hold 255.
    pub const MAX_SHORT_BYTES: usize = 255;
    /// The largest encoded size of the headers, as an AMQP field table:
    /// each header costs its name and value plus
    /// [`HEADER_ENTRY_OVERHEAD`](Self::HEADER_ENTRY_OVERHEAD) bytes of
    /// framing. AMQP carries all message properties in one frame (at most
    /// the negotiated `frame_max`, 128 KiB by default in RabbitMQ); a larger
    /// one makes the broker close the whole connection. Half of the default
    /// frame is left for the other properties and the headers a publisher
    /// adds (the aggregate id twice, the CloudEvents attributes).
    pub const MAX_HEADERS_BYTES: usize = 64 * 1024;
    /// Framing bytes of one header entry in an AMQP field table: the name's
    /// length (1), the value's type tag (1) and the long string's length (4).
    pub const HEADER_ENTRY_OVERHEAD: usize = 6;

    /// The encoded size of the headers as an AMQP field table (names,
    /// values and [`HEADER_ENTRY_OVERHEAD`](Self::HEADER_ENTRY_OVERHEAD)
    /// per entry), the figure [`MAX_HEADERS_BYTES`](Self::MAX_HEADERS_BYTES)
    /// limits. Only the headers a publisher forwards count: a malformed
    /// `traceparent`, `tracestate` or `baggage`
    /// ([`trace_context::is_well_formed`](crate::trace_context::is_well_formed))
    /// is never sent.
    pub fn encoded_headers_bytes(&self) -> usize {
        self.headers
            .iter()
            .filter(|(k, v)| crate::trace_context::is_well_formed(k, v))
            .map(|(k, v)| k.len() + v.len() + Self::HEADER_ENTRY_OVERHEAD)
            .sum()
    }

    /// Checks the invariants every store and publisher relies on:
    /// aggregate type, aggregate id and event type are not empty and hold no
    /// NUL character (PostgreSQL text cannot hold one); the aggregate id is
    /// at most [`MAX_AGGREGATE_ID_BYTES`](Self::MAX_AGGREGATE_ID_BYTES);
    /// header names are not empty and no header holds a NUL character; the
    /// headers as stored (a malformed trace context header, which is never
    /// sent, included) fit [`MAX_HEADERS_BYTES`](Self::MAX_HEADERS_BYTES);
    /// and everything [`validate_wire`](Self::validate_wire) checks.
    ///
    /// # Errors
    /// [`Error::InvalidEvent`] naming the offending field.
    pub fn validate(&self) -> Result<(), Error> {
        let fields = [
            ("aggregate_type", self.aggregate_type.as_str()),
            ("aggregate_id", self.aggregate_id.as_str()),
            ("event_type", self.event_type.as_str()),
        ];
        for (field, value) in fields {
            if value.is_empty() {
                return Err(self.invalid(format!("{field} is empty")));
            }
            if value.contains('\0') {
                return Err(self.invalid(format!("{field} contains a NUL character")));
            }
        }
        if self.aggregate_id.len() > Self::MAX_AGGREGATE_ID_BYTES {
            return Err(self.invalid(format!(
                "aggregate_id is {} bytes long; at most {} are allowed",
                self.aggregate_id.len(),
                Self::MAX_AGGREGATE_ID_BYTES
            )));
        }
        // What is stored, malformed trace context included (never sent, so
        // `validate_wire` leaves it out), is bounded all the same.
        let stored_bytes: usize = self
            .headers
            .iter()
            .map(|(k, v)| k.len() + v.len() + Self::HEADER_ENTRY_OVERHEAD)
            .sum();
        if stored_bytes > Self::MAX_HEADERS_BYTES {
            return Err(self.invalid(format!(
                "the headers are {stored_bytes} bytes long encoded ({} headers, {} bytes of \
                 framing each); at most {} are allowed",
                self.headers.len(),
                Self::HEADER_ENTRY_OVERHEAD,
                Self::MAX_HEADERS_BYTES
            )));
        }
        if let Some((key, _)) = self
            .headers
            .iter()
            .find(|(k, v)| k.is_empty() || k.contains('\0') || v.contains('\0'))
        {
            return Err(self.invalid(format!(
                "header {key:?} is empty or contains a NUL character"
            )));
        }
        self.validate_wire()
    }

    /// The part of [`validate`](Self::validate) that AMQP imposes: the
    /// aggregate type, event type, header names and correlation id fit an
    /// AMQP short string ([`MAX_SHORT_BYTES`](Self::MAX_SHORT_BYTES)) and
    /// the headers, encoded, fit [`MAX_HEADERS_BYTES`](Self::MAX_HEADERS_BYTES).
    /// Publishers check it before sending an event, whoever stored it.
    ///
    /// # Errors
    /// [`Error::InvalidEvent`] naming the offending field.
    pub fn validate_wire(&self) -> Result<(), Error> {
        for (field, value) in [
            ("aggregate_type", self.aggregate_type.as_str()),
            ("event_type", self.event_type.as_str()),
        ] {
            if value.len() > Self::MAX_SHORT_BYTES {
                return Err(self.invalid(format!(
                    "{field} is {} bytes long; at most {} are allowed",
                    value.len(),
                    Self::MAX_SHORT_BYTES
                )));
            }
        }
        let header_bytes = self.encoded_headers_bytes();
        if header_bytes > Self::MAX_HEADERS_BYTES {
            return Err(self.invalid(format!(
                "the headers are {header_bytes} bytes long encoded ({} headers, {} bytes of \
                 framing each); at most {} are allowed",
                self.headers.len(),
                Self::HEADER_ENTRY_OVERHEAD,
                Self::MAX_HEADERS_BYTES
            )));
        }
        if let Some((key, _)) = self
            .headers
            .iter()
            .find(|(k, _)| k.len() > Self::MAX_SHORT_BYTES)
        {
            return Err(self.invalid(format!(
                "header name {}… is {} bytes long; at most {} are allowed",
                key.chars().take(20).collect::<String>(),
                key.len(),
                Self::MAX_SHORT_BYTES
            )));
        }
        if let Some(correlation) = self.headers.get(Headers::CORRELATION_ID)
            && correlation.len() > Self::MAX_SHORT_BYTES
        {
            return Err(self.invalid(format!(
                "header {} is {} bytes long; at most {} are allowed",
                Headers::CORRELATION_ID,
                correlation.len(),
                Self::MAX_SHORT_BYTES
            )));
        }
        Ok(())
    }

    fn invalid(&self, reason: String) -> Error {
        Error::InvalidEvent {
            event_type: self.event_type.clone(),
            reason,
        }
    }
}
