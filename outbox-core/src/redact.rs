//! [`redact_url`]: connection URLs safe to log.

/// `url` with its password (if any) replaced by `***`, for `Debug` output,
/// logs and error messages. URLs without a password come back unchanged.
///
/// ```
/// use outbox_core::redact_url;
///
/// assert_eq!(
///     redact_url("postgres://app:s3cret@db:5432/shop"),
///     "postgres://app:***@db:5432/shop"
/// );
/// assert_eq!(redact_url("amqp://127.0.0.1:5672/%2f"), "amqp://127.0.0.1:5672/%2f");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_are_redacted_and_nothing_else_changes() {
        assert_eq!(
            redact_url("amqp://guest:guest@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1/x"),
            "postgres://postgres@127.0.0.1/x"
        );
        assert_eq!(redact_url("not a url"), "not a url");
        assert_eq!(redact_url("postgres://u:p@h"), "postgres://u:***@h");
    }
}
