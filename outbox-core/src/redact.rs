//! [`redact_url`]: connection URLs safe to log.

/// Connection-string keys whose values are secrets (libpq's names).
const SECRET_KEYS: &[&str] = &["password", "sslpassword"];

/// `url` with its passwords replaced by `***`, for `Debug` output, logs and
/// error messages. Strings without a password come back unchanged.
///
/// Masks the password in a URL's user info (`postgres://app:s3cret@db/shop`),
/// `password` and `sslpassword` query parameters
/// (`postgres://app@db/shop?password=s3cret`, also percent-encoded keys), and
/// the same keys in a libpq key/value connection string
/// (`host=db user=app password='s3 cret'`).
///
/// ```
/// use outbox_core::redact_url;
///
/// assert_eq!(
///     redact_url("postgres://app:s3cret@db:5432/shop"),
///     "postgres://app:***@db:5432/shop"
/// );
/// assert_eq!(
///     redact_url("postgres://app@db/shop?sslmode=require&password=s3cret"),
///     "postgres://app@db/shop?sslmode=require&password=***"
/// );
/// assert_eq!(
///     redact_url("host=db user=app password=s3cret dbname=shop"),
///     "host=db user=app password=*** dbname=shop"
/// );
/// assert_eq!(redact_url("amqp://127.0.0.1:5672/%2f"), "amqp://127.0.0.1:5672/%2f");
/// ```
pub fn redact_url(url: &str) -> String {
    if let Some(list) = redact_url_list(url) {
        return list;
    }
    match url.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://{}", redact_query(&redact_userinfo(rest))),
        None => redact_key_values(url),
    }
}

/// A comma-separated list of URLs (`amqp://a:s1@n1/%2f,amqp://a:s2@n2/%2f`,
/// one per cluster node) with each redacted, or `None` when `text` is not
/// such a list. An item is a URL when it starts with a scheme and `://`, so
/// the commas of a libpq multi-host URL (`postgres://u:p@h1,h2/db`) do not
/// split it.
fn redact_url_list(text: &str) -> Option<String> {
    let is_url = |item: &str| {
        item.trim_start()
            .split_once("://")
            .is_some_and(|(scheme, _)| {
                !scheme.is_empty()
                    && scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            })
    };
    let items: Vec<&str> = text.split(',').collect();
    if items.len() < 2 || !items[1..].iter().any(|item| is_url(item)) {
        return None;
    }
    // Items that do not start a URL (a multi-host URL's further hosts)
    // belong to the URL before them.
    let mut urls: Vec<String> = Vec::new();
    for item in items {
        match urls.last_mut() {
            Some(last) if !is_url(item) => {
                last.push(',');
                last.push_str(item);
            }
            _ => urls.push(item.to_owned()),
        }
    }
    Some(
        urls.iter()
            .map(|url| {
                let lead = url.len() - url.trim_start().len();
                format!("{}{}", &url[..lead], redact_url(&url[lead..]))
            })
            .collect::<Vec<_>>()
            .join(","),
    )
}

/// `user:password@host/...` → `user:***@host/...` (the part after `://`).
fn redact_userinfo(rest: &str) -> String {
    // As libpq, user info ends at the last `@` before the first `/`.
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}{tail}"),
            None => rest.to_owned(),
        },
        None => rest.to_owned(),
    }
}

/// Masks the value of every secret parameter in the query (any segment
/// after a `?` or `&`), up to the next `&` or `#`.
fn redact_query(rest: &str) -> String {
    let Some(start) = rest.find('?') else {
        return rest.to_owned();
    };
    let mut out = String::with_capacity(rest.len());
    out.push_str(&rest[..=start]);
    let query = &rest[start + 1..];
    let (query, fragment) = query.split_at(query.find('#').unwrap_or(query.len()));
    for (n, param) in query.split('&').enumerate() {
        if n > 0 {
            out.push('&');
        }
        match param.split_once('=') {
            Some((key, _value)) if is_secret(&percent_decode(key)) => {
                out.push_str(key);
                out.push_str("=***");
            }
            _ => out.push_str(param),
        }
    }
    out.push_str(fragment);
    out
}

/// `%XX` escapes decoded (invalid ones kept as they are).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            // Two hex digits make at most 0xff: the cast cannot truncate.
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn is_secret(key: &str) -> bool {
    SECRET_KEYS.contains(&key)
}

/// A libpq key/value connection string (`key = value ...`, values bare or
/// single-quoted with backslash escapes) with secret values masked;
/// everything else, spacing included, kept as it is.
fn redact_key_values(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    // Moves the first `n` bytes of `rest` to `out`.
    let take = |rest: &mut &str, out: &mut String, n: usize| {
        out.push_str(&rest[..n]);
        *rest = &rest[n..];
    };
    let spaces = |rest: &str| rest.len() - rest.trim_start().len();
    loop {
        let n = spaces(rest);
        take(&mut rest, &mut out, n);
        if rest.is_empty() {
            return out;
        }
        let key_len = rest
            .find(|c: char| c == '=' || c.is_whitespace())
            .unwrap_or(rest.len());
        let secret = is_secret(&rest[..key_len]);
        take(&mut rest, &mut out, key_len);
        let n = spaces(rest);
        take(&mut rest, &mut out, n);
        if !rest.starts_with('=') {
            // Not `key = value`: the next word starts over as a key.
            continue;
        }
        take(&mut rest, &mut out, 1);
        let n = spaces(rest);
        take(&mut rest, &mut out, n);
        let value_len = value_len(rest);
        if secret {
            out.push_str("***");
            rest = &rest[value_len..];
        } else {
            take(&mut rest, &mut out, value_len);
        }
    }
}

/// The length in bytes of the value at the start of `rest`: a quoted one up
/// to its closing quote (or the end), a bare one up to whitespace; a
/// backslash escapes the next character in both.
fn value_len(rest: &str) -> usize {
    let quoted = rest.starts_with('\'');
    let mut chars = rest.char_indices().skip(usize::from(quoted));
    while let Some((at, c)) = chars.next() {
        match c {
            '\\' => {
                chars.next();
            }
            '\'' if quoted => return at + 1,
            c if !quoted && c.is_whitespace() => return at,
            _ => {}
        }
    }
    rest.len()
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn each_url_of_a_comma_separated_list_is_redacted() {
        assert_eq!(
            redact_url("amqp://a:s1@n1:5672/%2f, amqp://a:s2@n2:5672/%2f,amqps://b:s3@n3/v"),
            "amqp://a:***@n1:5672/%2f, amqp://a:***@n2:5672/%2f,amqps://b:***@n3/v"
        );
        assert_eq!(
            redact_url("postgres://app:s3cret@h1:5432,h2:5432/shop"),
            "postgres://app:***@h1:5432,h2:5432/shop"
        );
        assert_eq!(
            redact_url("postgres://u:p@h1,h2/db,postgres://u:q@h3/db"),
            "postgres://u:***@h1,h2/db,postgres://u:***@h3/db"
        );
    }

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

    #[test]
    fn password_query_parameters_are_redacted() {
        assert_eq!(
            redact_url("postgres://app@db:5432/shop?password=s3cret"),
            "postgres://app@db:5432/shop?password=***"
        );
        assert_eq!(
            redact_url("postgres://db/shop?user=app&password=s3cret&sslmode=require"),
            "postgres://db/shop?user=app&password=***&sslmode=require"
        );
        assert_eq!(
            redact_url("postgresql://db?sslpassword=keypass&password=a%26b#frag"),
            "postgresql://db?sslpassword=***&password=***#frag"
        );
        // libpq decodes percent-encoded keys too.
        assert_eq!(
            redact_url("postgres://db/shop?pass%77ord=s3cret"),
            "postgres://db/shop?pass%77ord=***"
        );
        // Both places at once.
        assert_eq!(
            redact_url("postgres://u:one@db/x?password=two"),
            "postgres://u:***@db/x?password=***"
        );
        // Other keys and values that merely contain the word stay.
        assert_eq!(
            redact_url("postgres://db/x?passfile=/etc/pgpass&application_name=password"),
            "postgres://db/x?passfile=/etc/pgpass&application_name=password"
        );
    }

    #[test]
    fn key_value_connection_strings_are_redacted() {
        assert_eq!(
            redact_url("host=db port=5432 user=app password=s3cret dbname=shop"),
            "host=db port=5432 user=app password=*** dbname=shop"
        );
        assert_eq!(
            redact_url("host=db password = 's3 cr\\'et' sslmode=require"),
            "host=db password = *** sslmode=require"
        );
        assert_eq!(
            redact_url("password=a\\ b user=app"),
            "password=*** user=app"
        );
        assert_eq!(
            redact_url("host=db sslpassword='keypass'"),
            "host=db sslpassword=***"
        );
        // Unterminated quotes and non-ASCII text do not break it.
        assert_eq!(redact_url("password='s3cré"), "password=***");
        assert_eq!(
            redact_url("dbname='é\\é' password=x"),
            "dbname='é\\é' password=***"
        );
        assert_eq!(redact_url("host=db user=app"), "host=db user=app");
        assert_eq!(redact_url(""), "");
    }
}
