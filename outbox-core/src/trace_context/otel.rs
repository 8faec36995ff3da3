//! The `opentelemetry` feature: trace context between `tracing` spans (with
//! `tracing-opentelemetry`'s layer) and event headers.
//!
//! The W3C formats are written and read here rather than through the SDK's
//! propagators: libraries depend on the `opentelemetry` API crate only.

use opentelemetry::Context;
use opentelemetry::baggage::{BaggageExt, KeyValueMetadata};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::{TraceParent, baggage_limit, baggage_members, capped_baggage};
use crate::Headers;

/// The span context `headers` carry, marked remote.
fn remote_span_context(headers: &Headers) -> Option<SpanContext> {
    let tp = TraceParent::parse(headers.get(Headers::TRACEPARENT)?)?;
    let (trace_id, span_id, flags) = tp.parts();
    let state = headers
        .get(Headers::TRACESTATE)
        .filter(|ts| super::valid_tracestate(ts))
        .and_then(|ts| ts.parse::<TraceState>().ok())
        .unwrap_or_default();
    Some(SpanContext::new(
        TraceId::from_bytes(trace_id.to_be_bytes()),
        SpanId::from_bytes(span_id.to_be_bytes()),
        TraceFlags::new(flags),
        true,
        state,
    ))
}

/// The OpenTelemetry context `headers` carry: their trace context and, when
/// baggage is carried ([`carry_baggage`](super::carry_baggage)), their
/// baggage. `None` when they carry neither.
fn remote_context(headers: &Headers) -> Option<Context> {
    let span = remote_span_context(headers);
    let baggage = (baggage_limit() > 0)
        .then(|| headers.get(Headers::BAGGAGE))
        .flatten()
        .and_then(parse_baggage)
        .filter(|b| !b.is_empty());
    if span.is_none() && baggage.is_none() {
        return None;
    }
    let mut cx = Context::new();
    if let Some(span) = span {
        cx = cx.with_remote_span_context(span);
    }
    if let Some(baggage) = baggage {
        cx = cx.with_baggage(baggage);
    }
    Some(cx)
}

/// A W3C baggage header's members, values percent-decoded.
fn parse_baggage(value: &str) -> Option<Vec<KeyValueMetadata>> {
    let members = baggage_members(value)?;
    Some(
        members
            .into_iter()
            .filter_map(|member| {
                let (pair, props) = member.split_once(';').unwrap_or((member, ""));
                let (key, val) = pair.split_once('=')?;
                Some(KeyValueMetadata::new(
                    key.trim().to_owned(),
                    percent_decode(val.trim())?,
                    props.trim().to_owned(),
                ))
            })
            .collect(),
    )
}

fn percent_decode(value: &str) -> Option<String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Makes the context `headers` carry the OpenTelemetry parent of `span`
/// (their trace context, and their baggage when carried). Call it right
/// after creating the span, before it is entered. `false` when `headers`
/// carry no valid context or `span` is not an OpenTelemetry span (no
/// `tracing-opentelemetry` layer, or filtered out, or already started).
pub fn set_parent(span: &tracing::Span, headers: &Headers) -> bool {
    match remote_context(headers) {
        Some(cx) => span.set_parent(cx).is_ok(),
        None => false,
    }
}

/// Links `span` to the trace context `headers` carry (`false` when they
/// carry none).
pub fn add_link(span: &tracing::Span, headers: &Headers) -> bool {
    match remote_span_context(headers) {
        Some(sc) => {
            span.add_link(sc);
            true
        }
        None => false,
    }
}

/// Links `span` to `to`'s OpenTelemetry context (`false` when `to` has
/// none): a message's `publish` span to its batch's span, say.
pub fn link_span(span: &tracing::Span, to: &tracing::Span) -> bool {
    let cx = to.context();
    let sc = cx.span().span_context().clone();
    if !sc.is_valid() {
        return false;
    }
    span.add_link(sc);
    true
}

/// Writes `span`'s OpenTelemetry context into `headers`: `traceparent`,
/// `tracestate` (removed when the span has none) and, when baggage is
/// carried, its context's baggage (capped). `false`, and `headers`
/// untouched, when `span` has no valid OpenTelemetry context.
pub fn inject(span: &tracing::Span, headers: &mut Headers) -> bool {
    write_context(&span.context(), headers)
}

fn write_context(cx: &Context, headers: &mut Headers) -> bool {
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return false;
    }
    headers.insert(
        Headers::TRACEPARENT,
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        ),
    );
    let state = sc.trace_state().header();
    if state.is_empty() || !super::valid_tracestate(&state) {
        headers.remove(Headers::TRACESTATE);
    } else {
        headers.insert(Headers::TRACESTATE, state);
    }
    let limit = baggage_limit();
    if limit > 0 && !cx.baggage().is_empty() {
        match capped_baggage(&cx.baggage().to_string(), limit) {
            Some((kept, _)) => headers.insert(Headers::BAGGAGE, kept),
            None => headers.remove(Headers::BAGGAGE),
        };
    }
    true
}

/// At record: the current span's context, if it is a valid OpenTelemetry
/// one. `true` when written.
pub(crate) fn capture(headers: &mut Headers) -> bool {
    inject(&tracing::Span::current(), headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_through_an_opentelemetry_context() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let headers = Headers::new()
            .with(Headers::TRACEPARENT, tp)
            .with(Headers::TRACESTATE, "congo=t61rcWkgMzE");
        let sc = remote_span_context(&headers).unwrap();
        assert!(sc.is_remote() && sc.is_sampled());
        let cx = Context::new().with_remote_span_context(sc);
        let mut out = Headers::new();
        assert!(write_context(&cx, &mut out));
        assert_eq!(out.get(Headers::TRACEPARENT), Some(tp));
        assert_eq!(out.get(Headers::TRACESTATE), Some("congo=t61rcWkgMzE"));
        assert!(
            !write_context(&Context::new(), &mut out),
            "no span: untouched"
        );
        assert_eq!(out.get(Headers::TRACEPARENT), Some(tp));
    }

    #[test]
    fn every_tracestate_carried_is_one_opentelemetry_keeps() {
        // What this crate accepts must not be dropped by the publish span
        // (whose parent's state is parsed by OpenTelemetry).
        for ts in [
            "congo=t61rcWkgMzE",
            "rojo=00f067aa0ba902b7, congo=t61rcWkgMzE,",
            "tenant@vendor=x",
            "0tenant@vendor-1=x",
            "a@b@c=v",
            "t@averyveryverylongvendor=v",
            "t@=v",
            "k=a b",
        ] {
            if super::super::valid_tracestate(ts) {
                assert!(ts.parse::<TraceState>().is_ok(), "{ts}");
            }
        }
    }

    #[test]
    fn baggage_values_are_percent_decoded() {
        let members = parse_baggage("user=a%20b;p=1, tier=gold").unwrap();
        let baggage: opentelemetry::baggage::Baggage = members.into_iter().collect();
        assert_eq!(baggage.get("user").map(|v| v.as_str()), Some("a b"));
        assert_eq!(baggage.get("tier").map(|v| v.as_str()), Some("gold"));
        assert!(parse_baggage("user=%zz").is_none_or(|m| m.is_empty()));
    }
}
