//! Query strings: an [`EventFilter`] with paging for `GET /events`, a bare
//! filter for `GET /failure-groups`, paging for `GET /audit`.
//!
//! `status` and `id` may repeat (`?status=dead&status=retry`), which
//! `axum::extract::Query` into a struct cannot express; the pairs are read
//! as a list and the filter is made with [`EventFilter`]'s own
//! deserializer, so values are checked the way a JSON body's are.

use outbox_core::admin::EventFilter;
use serde_json::{Map, Value};

use super::error::ApiError;

/// The default page size of `GET /events` and `GET /audit`.
pub(crate) const DEFAULT_LIMIT: usize = 100;

const FILTER_KEYS: &str = "status, id, aggregate_type, aggregate_id, event_type, error, group, \
                           occurred_after, occurred_before";

/// A filter with an optional cursor (`after`) and page size (`limit`).
#[derive(Debug)]
pub(crate) struct FilterQuery {
    pub(crate) filter: EventFilter,
    pub(crate) after: Option<i64>,
    pub(crate) limit: usize,
}

impl FilterQuery {
    /// Reads `pairs`; `paged` accepts `after` and `limit`.
    pub(crate) fn parse(pairs: Vec<(String, String)>, paged: bool) -> Result<Self, ApiError> {
        let mut filter = Map::new();
        let mut after = None;
        let mut limit = None;
        for (key, value) in pairs {
            let field = match key.as_str() {
                "status" => Some("statuses"),
                "id" => Some("ids"),
                "aggregate_type" | "aggregate_id" | "event_type" | "group" | "occurred_after"
                | "occurred_before" => Some(key.as_str()),
                "error" => Some("error_contains"),
                "after" if paged => {
                    once(&key, &mut after, number(&key, &value)?)?;
                    None
                }
                "limit" if paged => {
                    once(&key, &mut limit, number(&key, &value)?)?;
                    None
                }
                _ => {
                    let known = if paged {
                        format!("{FILTER_KEYS}, after, limit")
                    } else {
                        FILTER_KEYS.to_owned()
                    };
                    return Err(ApiError::invalid(format!(
                        "unknown query parameter {key:?}; known: {known}"
                    )));
                }
            };
            let Some(field) = field else { continue };
            if matches!(field, "statuses" | "ids") {
                if let Value::Array(values) = filter
                    .entry(field)
                    .or_insert_with(|| Value::Array(Vec::new()))
                {
                    values.push(Value::String(value));
                }
            } else if filter
                .insert(field.to_owned(), Value::String(value))
                .is_some()
            {
                return Err(ApiError::invalid(format!(
                    "query parameter {key:?} given twice; it takes one value"
                )));
            }
        }
        let filter = serde_json::from_value(Value::Object(filter))
            .map_err(|e| ApiError::invalid(format!("invalid filter in the query string: {e}")))?;
        Ok(FilterQuery {
            filter,
            after,
            limit: limit
                .unwrap_or(DEFAULT_LIMIT as i64)
                .try_into()
                .map_err(|_| ApiError::invalid("limit must be between 1 and 10000".to_owned()))?,
        })
    }
}

/// `before` and `limit` of `GET /audit`.
pub(crate) fn audit_page(pairs: Vec<(String, String)>) -> Result<(Option<i64>, usize), ApiError> {
    let mut before = None;
    let mut limit = None;
    for (key, value) in pairs {
        match key.as_str() {
            "before" => once(&key, &mut before, number(&key, &value)?)?,
            "limit" => once(&key, &mut limit, number(&key, &value)?)?,
            _ => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {key:?}; known: before, limit"
                )));
            }
        }
    }
    let limit = match limit {
        None => DEFAULT_LIMIT,
        Some(n) if (1..=10_000).contains(&n) => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(format!(
                "limit must be between 1 and 10000, not {n}"
            )));
        }
    };
    Ok((before, limit))
}

fn number(key: &str, value: &str) -> Result<i64, ApiError> {
    value.parse().map_err(|_| {
        ApiError::invalid(format!(
            "query parameter {key:?} must be an integer, not {value:?}"
        ))
    })
}

fn once(key: &str, slot: &mut Option<i64>, value: i64) -> Result<(), ApiError> {
    if slot.replace(value).is_some() {
        return Err(ApiError::invalid(format!(
            "query parameter {key:?} given twice; it takes one value"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use outbox_core::EventStatus;

    use super::*;

    fn pairs(query: &[(&str, &str)]) -> Vec<(String, String)> {
        query
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn message(result: Result<impl std::fmt::Debug, ApiError>) -> String {
        match result {
            Err(ApiError::Request(status, message)) => {
                assert_eq!(status, http::StatusCode::BAD_REQUEST);
                message
            }
            other => panic!("expected a 400, got {other:?}"),
        }
    }

    #[test]
    fn repeated_statuses_and_every_filter_field_are_read() {
        let q = FilterQuery::parse(
            pairs(&[
                ("status", "dead"),
                ("status", "retry"),
                ("aggregate_type", "order"),
                ("aggregate_id", "7"),
                ("error", "NOT_FOUND"),
                ("occurred_after", "2026-01-01T00:00:00Z"),
                ("after", "42"),
                ("limit", "10"),
            ]),
            true,
        )
        .unwrap();
        let expected = EventFilter::new()
            .with_status(EventStatus::Dead)
            .with_status(EventStatus::Retry)
            .with_aggregate("order", "7")
            .with_error_containing("NOT_FOUND")
            .with_occurred(Some("2026-01-01T00:00:00Z".parse().unwrap()), None);
        assert_eq!(q.filter, expected);
        assert_eq!((q.after, q.limit), (Some(42), 10));
        let q = FilterQuery::parse(Vec::new(), true).unwrap();
        assert_eq!(
            (q.filter, q.after, q.limit),
            (EventFilter::new(), None, 100)
        );
    }

    #[test]
    fn bad_queries_say_what_is_wrong() {
        let m = message(FilterQuery::parse(pairs(&[("status", "dea")]), true));
        assert!(m.contains("dea"), "{m}");
        let m = message(FilterQuery::parse(pairs(&[("limit", "10")]), false));
        assert!(m.contains("unknown query parameter \"limit\""), "{m}");
        let m = message(FilterQuery::parse(pairs(&[("after", "x")]), true));
        assert!(m.contains("must be an integer"), "{m}");
        let m = message(FilterQuery::parse(
            pairs(&[("event_type", "a"), ("event_type", "b")]),
            true,
        ));
        assert!(m.contains("given twice"), "{m}");
        let m = message(FilterQuery::parse(pairs(&[("limit", "-1")]), true));
        assert!(m.contains("limit"), "{m}");
        let m = message(audit_page(pairs(&[("limit", "0")])));
        assert!(m.contains("between 1 and 10000"), "{m}");
        assert_eq!(
            audit_page(pairs(&[("before", "9")])).unwrap(),
            (Some(9), 100)
        );
    }
}
