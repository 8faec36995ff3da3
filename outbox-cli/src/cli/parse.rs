//! Value parsers of the command line's flags.

use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_core::EventStatus;

/// `30s`, `15m`, `7d`, `1h 30m`.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (use e.g. 30s, 15m, 7d)"))
}

pub(crate) fn parse_status(text: &str) -> Result<EventStatus, String> {
    text.parse::<EventStatus>()
        .map_err(|_| "expected pending, retry, held, dead, sent or skipped".to_owned())
}

pub(crate) fn parse_aggregate(text: &str) -> Result<(String, String), String> {
    match text.split_once(':') {
        Some((t, i)) if !t.is_empty() && !i.is_empty() => Ok((t.to_owned(), i.to_owned())),
        _ => Err("expected TYPE:ID, e.g. order:42".to_owned()),
    }
}

pub(crate) fn parse_time(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let ago = parse_duration(text)
        .map_err(|_| "expected an RFC 3339 time or a duration ago (30s, 15m, 7d)".to_owned())?;
    chrono::Duration::from_std(ago)
        .ok()
        .and_then(|ago| Utc::now().checked_sub_signed(ago))
        .ok_or_else(|| format!("{text} ago is before the calendar's start"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_aggregates_parse() {
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert!(parse_duration("seven days").is_err());
        assert_eq!(
            parse_aggregate("order:4:2"),
            Ok(("order".to_owned(), "4:2".to_owned()))
        );
        assert!(parse_aggregate("order").is_err());
        assert!(parse_time("2026-01-01T00:00:00Z").is_ok());
        assert!(parse_time("1h").is_ok_and(|t| t < Utc::now()));
    }
}
