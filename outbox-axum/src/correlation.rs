//! The headers a request gives its events: correlation id and W3C trace
//! context, taken from the request's HTTP headers.

use http::{HeaderMap, HeaderName, HeaderValue};
use outbox_core::{Headers, trace_context};
use uuid::Uuid;

/// Longest correlation id taken from a request; longer ones are replaced.
const MAX_ID_LEN: usize = 200;
/// Longest `traceparent`/`tracestate` carried over (W3C asks for at least
/// 512 characters of `tracestate` to be propagated).
const MAX_TRACE_LEN: usize = 512;

/// The default request headers holding a correlation id, in order of preference.
pub(crate) fn default_correlation_headers() -> Vec<HeaderName> {
    vec![
        HeaderName::from_static("x-request-id"),
        HeaderName::from_static("x-correlation-id"),
    ]
}

/// The event headers for a request with `headers`: the first usable
/// correlation id among `correlation` (else a new UUID v7), and the
/// `traceparent`, `tracestate` and `baggage` headers if present.
pub(crate) fn event_headers(headers: &HeaderMap, correlation: &[HeaderName]) -> Headers {
    let id = correlation
        .iter()
        .find_map(|name| usable(headers.get(name), MAX_ID_LEN))
        .map_or_else(|| Uuid::now_v7().to_string(), str::to_owned);
    let mut out = Headers::new().with(Headers::CORRELATION_ID, id);
    // Baggage is kept at record only where it is carried (`carry_baggage`).
    for (key, max) in [
        (Headers::TRACEPARENT, MAX_TRACE_LEN),
        (Headers::TRACESTATE, MAX_TRACE_LEN),
        (Headers::BAGGAGE, trace_context::MAX_BAGGAGE_LEN),
    ] {
        let Some(value) = usable(headers.get(key), max) else {
            continue;
        };
        if trace_context::is_well_formed(key, value) {
            out.insert(key, value);
        } else {
            tracing::warn!(
                header = key,
                "outbox: the request's malformed {key} header is dropped: no event of the request \
                 carries it"
            );
        }
    }
    out
}

/// The value as text if it is visible ASCII (no control characters, so no
/// NUL either), not blank and at most `max` bytes.
fn usable(value: Option<&HeaderValue>, max: usize) -> Option<&str> {
    let text = value?.to_str().ok()?.trim();
    (!text.is_empty() && text.len() <= max).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&'static str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    HeaderName::from_static(k),
                    HeaderValue::from_str(v).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn request_id_wins_then_correlation_id_then_a_new_uuid_v7() {
        let names = default_correlation_headers();
        let both = map(&[("x-correlation-id", "corr"), ("x-request-id", "req")]);
        assert_eq!(
            event_headers(&both, &names).get(Headers::CORRELATION_ID),
            Some("req")
        );
        let corr = map(&[("x-correlation-id", "corr")]);
        assert_eq!(
            event_headers(&corr, &names).get(Headers::CORRELATION_ID),
            Some("corr")
        );
        for unusable in [map(&[]), map(&[("x-request-id", "  ")]), {
            let long = "x".repeat(MAX_ID_LEN + 1);
            map(&[("x-request-id", long.as_str())])
        }] {
            let headers = event_headers(&unusable, &names);
            let id: Uuid = headers
                .get(Headers::CORRELATION_ID)
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(id.get_version_num(), 7);
        }
    }

    #[test]
    fn a_configured_header_replaces_the_defaults() {
        let names = [HeaderName::from_static("x-trace-id")];
        let headers = map(&[("x-request-id", "req"), ("x-trace-id", "trace-7")]);
        assert_eq!(
            event_headers(&headers, &names).get(Headers::CORRELATION_ID),
            Some("trace-7")
        );
    }

    #[test]
    fn trace_context_is_carried_when_present() {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let headers = event_headers(
            &map(&[
                ("traceparent", tp),
                ("tracestate", "congo=t61rcWkgMzE"),
                ("baggage", "tenant=acme"),
            ]),
            &default_correlation_headers(),
        );
        assert_eq!(headers.get(Headers::TRACEPARENT), Some(tp));
        assert_eq!(headers.get(Headers::TRACESTATE), Some("congo=t61rcWkgMzE"));
        assert_eq!(
            headers.get(Headers::BAGGAGE),
            Some("tenant=acme"),
            "kept at record only where baggage is carried"
        );
        let none = event_headers(&HeaderMap::new(), &default_correlation_headers());
        assert_eq!(none.len(), 1, "only the generated correlation id");
        let mut binary = HeaderMap::new();
        binary.insert("traceparent", HeaderValue::from_bytes(b"\xff\xfe").unwrap());
        let skipped = event_headers(&binary, &default_correlation_headers());
        assert_eq!(skipped.get(Headers::TRACEPARENT), None);
        let malformed = event_headers(
            &map(&[
                ("traceparent", "garbage"),
                ("tracestate", "Bad=State"),
                ("baggage", "no equals"),
            ]),
            &default_correlation_headers(),
        );
        assert_eq!(malformed.len(), 1, "dropped: {malformed:?}");
    }
}
