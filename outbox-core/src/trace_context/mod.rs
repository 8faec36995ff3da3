//! W3C Trace Context (`traceparent`, `tracestate`) and W3C Baggage
//! (`baggage`) carried in event headers.
//!
//! Every event carries the trace context of the work that raised it, so one
//! order is one trace from the HTTP request through the relay to the
//! consumer and the events the consumer raises in turn:
//!
//! - **Recording** ([`EventEnvelope::from_event`](crate::EventEnvelope::from_event),
//!   so `record` and the Axum layer): with the `opentelemetry` feature, the
//!   current `tracing` span's OpenTelemetry context is written to
//!   `traceparent`/`tracestate` unless the caller set them; without it (or
//!   outside any OpenTelemetry span) the [`context`](crate::context) scope's
//!   headers are used, as the Axum layer and the inbox consumer set them.
//! - **Malformed values are dropped with a warning, never forwarded**: a
//!   `traceparent` that is not `00-<32 hex>-<16 hex>-<2 hex>` (non-zero ids,
//!   lowercase), a `tracestate` that is not a W3C list of at most 32 members
//!   and 512 bytes, a `baggage` that is not a W3C baggage list.
//! - **Baggage is opt-in** ([`carry_baggage`]): it is persisted with every
//!   event and sent with every message, so it is off by default and capped:
//!   members past the cap are dropped whole (never the event), so a large
//!   baggage never makes `record` fail the header limit.
//!
//! Without the `opentelemetry` feature nothing of OpenTelemetry is compiled:
//! the headers are validated and carried as text. With it, the crate depends
//! on the `opentelemetry` API crate and `tracing-opentelemetry` only (never
//! the SDK), and no OpenTelemetry type appears in this crate's API: the
//! functions below take `tracing` spans and [`Headers`].

use std::sync::atomic::{AtomicUsize, Ordering};

use tracing::warn;

use crate::Headers;

/// Longest `tracestate` carried (W3C: "at least 512 characters" must be
/// propagated; longer values may be dropped).
pub const MAX_TRACESTATE_LEN: usize = 512;
/// Most members of a `tracestate` (W3C).
const MAX_TRACESTATE_MEMBERS: usize = 32;
/// Largest baggage [`carry_baggage`] accepts (the W3C Baggage limit).
pub const MAX_BAGGAGE_LEN: usize = 8192;
/// Most members of a baggage (W3C).
const MAX_BAGGAGE_MEMBERS: usize = 180;
/// Most members of a baggage carried: what an OpenTelemetry `Baggage`
/// holds (it drops the others silently, so a span parented from a larger
/// one would hand on only some of them).
const MAX_CARRIED_BAGGAGE_MEMBERS: usize = 64;

/// Bytes of baggage carried per event; 0 (the default) carries none.
static BAGGAGE_LIMIT: AtomicUsize = AtomicUsize::new(0);

/// Carries W3C baggage with every event recorded from now on, up to
/// `max_bytes` (at most [`MAX_BAGGAGE_LEN`]); `0` turns it off (the default).
///
/// Baggage is persisted in the outbox row and sent with the message, and the
/// inbox consumer hands it on to the events its handlers record, so it
/// survives the whole chain. Members past `max_bytes`, and past the 64th
/// (what an OpenTelemetry baggage holds), are dropped whole (with a
/// warning), never the event. Process-wide, like OpenTelemetry's own
/// propagator settings: set it once at start-up, in every service of the
/// chain that should carry it on.
pub fn carry_baggage(max_bytes: usize) {
    BAGGAGE_LIMIT.store(max_bytes.min(MAX_BAGGAGE_LEN), Ordering::Relaxed);
}

/// Bytes of baggage carried per event (0: baggage is not carried).
pub fn baggage_limit() -> usize {
    BAGGAGE_LIMIT.load(Ordering::Relaxed)
}

/// A parsed W3C `traceparent` (version `00`).
///
/// ```
/// use outbox_core::trace_context::TraceParent;
///
/// let tp = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
/// assert_eq!(tp.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert!(tp.sampled());
/// assert!(TraceParent::parse("00-abc-def-01").is_none());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    trace_id: u128,
    span_id: u64,
    flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent`: `None` unless it is exactly version `00`,
    /// lowercase hex, with a non-zero trace id and span id.
    pub fn parse(value: &str) -> Option<Self> {
        let b = value.as_bytes();
        if b.len() != 55 || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let hex = |s: &[u8]| s.iter().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
        if &b[..2] != b"00" || !hex(&b[3..35]) || !hex(&b[36..52]) || !hex(&b[53..55]) {
            return None;
        }
        let trace_id = u128::from_str_radix(&value[3..35], 16).ok()?;
        let span_id = u64::from_str_radix(&value[36..52], 16).ok()?;
        let flags = u8::from_str_radix(&value[53..55], 16).ok()?;
        (trace_id != 0 && span_id != 0).then_some(Self {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The trace id, 32 lowercase hex digits (as logs and tracing back ends
    /// show it).
    pub fn trace_id(&self) -> String {
        format!("{:032x}", self.trace_id)
    }

    /// The parent span id, 16 lowercase hex digits.
    pub fn span_id(&self) -> String {
        format!("{:016x}", self.span_id)
    }

    /// Whether the caller sampled this trace (flag `01`).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    #[cfg(feature = "opentelemetry")]
    pub(crate) fn parts(&self) -> (u128, u64, u8) {
        (self.trace_id, self.span_id, self.flags)
    }
}

impl std::fmt::Display for TraceParent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id, self.span_id, self.flags
        )
    }
}

/// The trace id of `headers`' `traceparent`, if it holds a valid one: for
/// log lines.
pub fn trace_id(headers: &Headers) -> Option<String> {
    headers
        .get(Headers::TRACEPARENT)
        .and_then(TraceParent::parse)
        .map(|tp| tp.trace_id())
}

/// Whether `value` is a W3C `tracestate` this crate carries: at most 32
/// comma-separated `key=value` members and [`MAX_TRACESTATE_LEN`] bytes.
pub fn valid_tracestate(value: &str) -> bool {
    if value.len() > MAX_TRACESTATE_LEN {
        return false;
    }
    let mut members = 0;
    for member in value.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            continue; // W3C allows empty list members
        }
        members += 1;
        let Some((key, val)) = member.split_once('=') else {
            return false;
        };
        let key_ok = valid_tracestate_key(key);
        let val_ok = !val.is_empty()
            && val.len() <= 256
            && val
                .bytes()
                .all(|c| (0x20..=0x7e).contains(&c) && c != b',' && c != b'=')
            && !val.ends_with(' ');
        if !key_ok || !val_ok {
            return false;
        }
    }
    members <= MAX_TRACESTATE_MEMBERS
}

/// A W3C `tracestate` key: `simple-key` (at most 256 characters) or
/// `tenant@system` (a tenant of at most 241, a system of at most 14), each
/// part starting with a lowercase letter or a digit and made of lowercase
/// letters, digits and `_-*/`.
fn valid_tracestate_key(key: &str) -> bool {
    let part = |part: &str, max: usize| {
        !part.is_empty()
            && part.len() <= max
            && part.as_bytes()[0].is_ascii_alphanumeric()
            && part
                .bytes()
                .all(|c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'*' | b'/'))
    };
    match key.split_once('@') {
        None => part(key, 256),
        Some((tenant, system)) => part(tenant, 241) && part(system, 14),
    }
}

/// The members of a W3C `baggage` value (`key=value` plus `;` properties,
/// comma-separated) if it is well formed: `None` otherwise.
fn baggage_members(value: &str) -> Option<Vec<&str>> {
    let mut out = Vec::new();
    for member in value.split(',') {
        let member = member.trim_matches([' ', '\t']);
        if member.is_empty() {
            return None;
        }
        let mut parts = member.split(';');
        let pair = parts.next().unwrap_or_default();
        let (key, val) = pair.split_once('=')?;
        if !baggage_pair_ok(key, val) {
            return None;
        }
        // Properties: `key` or `key=value`, as strict as the member (they
        // are forwarded and handed on too).
        for property in parts {
            let (key, val) = property.split_once('=').unwrap_or((property, ""));
            if !baggage_pair_ok(key, val) {
                return None;
            }
        }
        out.push(member);
    }
    (out.len() <= MAX_BAGGAGE_MEMBERS).then_some(out)
}

/// A baggage member's or property's key (a token) and value (baggage
/// octets), optional whitespace around each.
fn baggage_pair_ok(key: &str, val: &str) -> bool {
    let key = key.trim_matches([' ', '\t']);
    let val = val.trim_matches([' ', '\t']);
    !key.is_empty() && key.bytes().all(is_token_char) && val.bytes().all(is_baggage_octet)
}

/// RFC 7230 `tchar`.
fn is_token_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c)
}

/// W3C `baggage-octet` (percent-encoding uses `%`, itself a baggage octet).
fn is_baggage_octet(c: u8) -> bool {
    matches!(c, 0x21 | 0x23..=0x2b | 0x2d..=0x3a | 0x3c..=0x5b | 0x5d..=0x7e)
}

/// `value` as a baggage this crate carries under `limit` bytes: whole
/// members while they fit, at most [`MAX_CARRIED_BAGGAGE_MEMBERS`] of
/// them; `None` if malformed or nothing fits.
fn capped_baggage(value: &str, limit: usize) -> Option<(String, usize)> {
    let members = baggage_members(value)?;
    let total = members.len();
    let mut out = String::new();
    let mut kept = 0;
    for member in members {
        if kept == MAX_CARRIED_BAGGAGE_MEMBERS {
            break;
        }
        let extra = member.len() + usize::from(!out.is_empty());
        if out.len() + extra > limit {
            continue; // a smaller member later may still fit
        }
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(member);
        kept += 1;
    }
    (kept > 0).then_some((out, total - kept))
}

/// Whether a header may be forwarded as is: a `traceparent`, `tracestate`
/// or `baggage` must be well formed (a baggage at most [`MAX_BAGGAGE_LEN`]
/// bytes, whether or not this process [carries](carry_baggage) baggage it
/// records); any other header is. What a publisher checks before sending.
pub fn is_well_formed(key: &str, value: &str) -> bool {
    match key {
        Headers::TRACEPARENT => TraceParent::parse(value).is_some(),
        Headers::TRACESTATE => valid_tracestate(value),
        Headers::BAGGAGE => value.len() <= MAX_BAGGAGE_LEN && baggage_members(value).is_some(),
        _ => true,
    }
}

/// Drops malformed trace context and, per [`carry_baggage`], baggage from
/// `headers` (each with a warning): what an event carries and a message
/// forwards. A `tracestate` without a valid `traceparent` goes with it.
pub fn sanitize(headers: &mut Headers) {
    if let Some(tp) = headers.get(Headers::TRACEPARENT)
        && TraceParent::parse(tp).is_none()
    {
        warn!(
            traceparent = %truncated(tp),
            "outbox: dropped a malformed traceparent (not W3C version 00); the event starts no trace"
        );
        headers.remove(Headers::TRACEPARENT);
    }
    if let Some(ts) = headers.get(Headers::TRACESTATE) {
        if headers.get(Headers::TRACEPARENT).is_none() {
            headers.remove(Headers::TRACESTATE);
        } else if !valid_tracestate(ts) {
            warn!(
                tracestate = %truncated(ts),
                "outbox: dropped a malformed or oversized tracestate (W3C: at most 32 key=value \
                 members, 512 bytes)"
            );
            headers.remove(Headers::TRACESTATE);
        }
    }
    if let Some(baggage) = headers.get(Headers::BAGGAGE) {
        let limit = baggage_limit();
        if limit == 0 {
            headers.remove(Headers::BAGGAGE);
            return;
        }
        match capped_baggage(baggage, limit) {
            Some((kept, 0)) if kept == baggage => {}
            Some((kept, dropped)) => {
                if dropped > 0 {
                    warn!(
                        dropped,
                        limit,
                        "outbox: baggage members past the carried size dropped (see \
                         outbox_core::trace_context::carry_baggage)"
                    );
                }
                headers.insert(Headers::BAGGAGE, kept);
            }
            None => {
                warn!(
                    baggage = %truncated(baggage),
                    "outbox: dropped a malformed baggage (not a W3C baggage list), or one none \
                     of whose members fits the carried size"
                );
                headers.remove(Headers::BAGGAGE);
            }
        }
    }
}

/// At most 80 bytes of a value for a log line (on a char boundary).
fn truncated(value: &str) -> &str {
    let mut end = value.len().min(80);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    &value[..end]
}

#[cfg(feature = "opentelemetry")]
mod otel;
#[cfg(feature = "opentelemetry")]
pub(crate) use otel::capture;
#[cfg(feature = "opentelemetry")]
pub use otel::{add_link, inject, link_span, set_parent};

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn traceparent_parses_only_w3c_version_00() {
        let tp = TraceParent::parse(TP).unwrap();
        assert_eq!(tp.to_string(), TP);
        assert_eq!(tp.span_id(), "00f067aa0ba902b7");
        for bad in [
            "00-abc-def-01",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "",
        ] {
            assert!(TraceParent::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn tracestate_is_a_bounded_w3c_list() {
        assert!(valid_tracestate("congo=t61rcWkgMzE"));
        assert!(valid_tracestate(
            "rojo=00f067aa0ba902b7, congo=t61rcWkgMzE,"
        ));
        assert!(valid_tracestate("tenant@vendor=x"));
        assert!(!valid_tracestate("Congo=t61"));
        assert!(!valid_tracestate("congo"));
        assert!(!valid_tracestate("congo=a=b"));
        assert!(!valid_tracestate(&format!("k={}", "v".repeat(600))));
        // Multi-tenant keys: one `@`, a system id of at most 14.
        for bad in [
            "a@b@c=v",
            "t@averyveryverylongvendor=v",
            "t@=v",
            "@v=x",
            "t@_v=x",
        ] {
            assert!(!valid_tracestate(bad), "{bad}");
        }
        assert!(valid_tracestate("0tenant@vendor-1=x"));
        let many = (0..33)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(",");
        assert!(!valid_tracestate(&many));
    }

    #[test]
    fn baggage_properties_are_checked_too() {
        for ok in ["a=1;p", "a=1;p=v", "a=1 ; p = v ;q, b=2"] {
            assert!(is_well_formed(Headers::BAGGAGE, ok), "{ok}");
        }
        for bad in [
            "a=1;\r\nx-injected: yes",
            "a=1;p=\u{7f}",
            "a=1;p=caf\u{e9}",
            "a=1;p=a,b",
            "a=1;",
            "a=1;=v",
            "a=1;p=\"quoted\"",
        ] {
            assert!(!is_well_formed(Headers::BAGGAGE, bad), "{bad:?}");
        }
    }

    #[test]
    fn sanitize_drops_what_is_malformed_and_caps_baggage() {
        // One test owns the process-wide baggage setting.
        carry_baggage(0);
        let mut h = Headers::new()
            .with(Headers::TRACEPARENT, "00-abc-def-01")
            .with(Headers::TRACESTATE, "congo=t61")
            .with(Headers::BAGGAGE, "user=1");
        sanitize(&mut h);
        assert!(h.is_empty(), "{h:?}");

        let mut h = Headers::new()
            .with(Headers::TRACEPARENT, TP)
            .with(Headers::TRACESTATE, "Bad=State");
        sanitize(&mut h);
        assert_eq!(h.get(Headers::TRACEPARENT), Some(TP));
        assert_eq!(h.get(Headers::TRACESTATE), None);

        carry_baggage(20);
        let mut h = Headers::new().with(Headers::BAGGAGE, "a=1,big=0123456789abcdef,b=2;p=1");
        sanitize(&mut h);
        assert_eq!(h.get(Headers::BAGGAGE), Some("a=1,b=2;p=1"));
        let mut h = Headers::new().with(Headers::BAGGAGE, "no equals sign");
        sanitize(&mut h);
        assert_eq!(h.get(Headers::BAGGAGE), None);
        let mut h = Headers::new().with(Headers::BAGGAGE, "user=%22x%22");
        sanitize(&mut h);
        assert_eq!(h.get(Headers::BAGGAGE), Some("user=%22x%22"));
        carry_baggage(usize::MAX);
        assert_eq!(baggage_limit(), MAX_BAGGAGE_LEN);
        carry_baggage(0);
    }
}
