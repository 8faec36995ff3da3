//! `sslmode` and `sslrootcert` taken out of a connection string before
//! tokio-postgres reads it: it knows only `disable`, `prefer` and `require`,
//! and no `sslrootcert` at all. A string that does not set
//! `target_session_attrs` gets `target_session_attrs=read-write`: the
//! outbox only ever writes, so with several hosts
//! (`postgres://u@h1:5432,h2:5432/db`) every connection goes to the one that
//! takes writes, the primary, and a standby is skipped. Strings also get
//! TCP keepalive and `tcp_user_timeout` defaults (see [`DEFAULTS`]).

use std::fmt;

/// libpq's `sslmode`, with libpq's meanings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    /// Plaintext only.
    Disable,
    /// Plaintext first; TLS if the server refuses plaintext.
    Allow,
    /// TLS if the server offers it, else plaintext (libpq's default).
    Prefer,
    /// TLS or nothing; the certificate checked only against a given root.
    Require,
    /// TLS, the server's certificate chain checked against the root.
    VerifyCa,
    /// As `VerifyCa`, and the certificate must name the host.
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Option<SslMode> {
        Some(match value {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => return None,
        })
    }

    /// Whether this mode refuses a plaintext connection.
    pub(crate) fn requires_tls(self) -> bool {
        matches!(
            self,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull
        )
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        })
    }
}

/// The parameters a connection string gets when it does not set them, each
/// overridden by the string's own value:
///
/// - `target_session_attrs=read-write`: with several hosts, the one that
///   takes writes (the primary).
/// - `keepalives_idle=30`, `keepalives_interval=10`, `keepalives_retries=3`:
///   an idle connection to a machine that vanished (powered off, cut off by
///   a failover) is found dead within about a minute (30 s idle, then a
///   probe every 10 s; with `tcp_user_timeout` set, Linux gives up at
///   about 40 s), not after the kernel's two hours.
/// - `tcp_user_timeout=30`: a statement sent to a machine that vanished
///   fails after 30 s without an acknowledgement, not after the kernel's
///   ~15 minutes of retransmissions (`tcp_retries2`).
///
/// tokio-postgres reads all four durations in seconds (libpq reads
/// `tcp_user_timeout` in milliseconds).
pub(crate) const DEFAULTS: [(&str, &str); 5] = [
    ("target_session_attrs", "read-write"),
    ("keepalives_idle", "30"),
    ("keepalives_interval", "10"),
    ("keepalives_retries", "3"),
    ("tcp_user_timeout", "30"),
];

/// A connection string split into what tokio-postgres reads and the TLS
/// settings this crate handles itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConnString {
    /// The string without `sslmode` and `sslrootcert`, every other
    /// parameter kept as written, and each of [`DEFAULTS`] it does not set
    /// put first (first, so that a string ending in `&`, or in an empty
    /// `key=` value, still reads the same).
    pub(crate) rest: String,
    /// `sslmode` as written; `None` means libpq's default, `prefer`.
    pub(crate) ssl_mode: Option<SslMode>,
    /// `sslrootcert`: the path of a PEM file with the trusted root(s).
    pub(crate) root_cert: Option<String>,
}

impl ConnString {
    /// The mode in effect.
    pub(crate) fn mode(&self) -> SslMode {
        self.ssl_mode.unwrap_or(SslMode::Prefer)
    }
}

/// Splits `url` (a `postgres://` URL, one host or several, or a libpq
/// `key=value` string). The last `sslmode` or `sslrootcert` wins, as in
/// libpq. Each of [`DEFAULTS`] the string does not set is added. A
/// string this parser cannot read is passed through whole: tokio-postgres
/// then reports what is wrong with it.
///
/// # Errors
/// An `sslmode` value libpq does not know, as a sentence to show.
pub(crate) fn parse(url: &str) -> Result<ConnString, String> {
    let split = match ["postgres://", "postgresql://"]
        .iter()
        .find_map(|prefix| url.strip_prefix(prefix).map(|body| (prefix.len(), body)))
    {
        Some((prefix, body)) => split_url(url, prefix, body),
        None => split_key_values(url),
    };
    let Some(Split {
        head,
        kept,
        ssl_mode,
        root_cert,
        keys,
    }) = split
    else {
        return Ok(ConnString {
            rest: url.to_owned(),
            ssl_mode: None,
            root_cert: None,
        });
    };
    let added = DEFAULTS
        .iter()
        .filter(|(key, _)| !keys.iter().any(|set| set == key))
        .map(|(key, value)| format!("{key}={value}"));
    let params: Vec<String> = added.chain(kept).collect();
    let rest = match head {
        Some(head) if params.is_empty() => head,
        Some(head) => format!("{head}?{}", params.join("&")),
        None => params.join(" "),
    };
    let ssl_mode = match ssl_mode {
        Some(value) => Some(SslMode::parse(&value).ok_or_else(|| {
            format!(
                "sslmode={value:?} is not one of disable, allow, prefer, require, verify-ca, \
                 verify-full"
            )
        })?),
        None => None,
    };
    Ok(ConnString {
        rest,
        ssl_mode,
        root_cert,
    })
}

/// What [`split_url`] and [`split_key_values`] take out of a string.
struct Split {
    /// A URL's part before its query (`None` for a `key=value` string).
    head: Option<String>,
    /// The parameters kept, as written.
    kept: Vec<String>,
    ssl_mode: Option<String>,
    root_cert: Option<String>,
    /// The (decoded) keys of the parameters kept.
    keys: Vec<String>,
}

/// `postgres://user:pw@host:port/db?key=value&...`: the query parameters
/// (after the first `?` that follows the credentials, as tokio-postgres
/// reads it), keys and values percent-decoded.
fn split_url(url: &str, prefix: usize, body: &str) -> Option<Split> {
    let after_credentials = body.find('@').map_or(0, |at| at + 1);
    let Some(question) = body[after_credentials..].find('?') else {
        return Some(Split {
            head: Some(url.to_owned()),
            kept: Vec::new(),
            ssl_mode: None,
            root_cert: None,
            keys: Vec::new(),
        });
    };
    let head = &url[..prefix + after_credentials + question];
    let query = &body[after_credentials + question + 1..];
    let (mut ssl_mode, mut root_cert, mut keys) = (None, None, Vec::new());
    let mut kept = Vec::new();
    for param in query.split('&') {
        let Some((key, value)) = param.split_once('=') else {
            kept.push(param.to_owned());
            continue;
        };
        match percent_decode(key)?.as_str() {
            "sslmode" => ssl_mode = Some(percent_decode(value)?),
            "sslrootcert" => root_cert = Some(percent_decode(value)?),
            key => {
                keys.push(key.to_owned());
                kept.push(param.to_owned());
            }
        }
    }
    Some(Split {
        head: Some(head.to_owned()),
        kept,
        ssl_mode,
        root_cert,
        keys,
    })
}

/// `%XX` decoded; `None` for a result that is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |at: usize| {
            bytes
                .get(at)
                .and_then(|b| char::from(*b).to_digit(16))
                .and_then(|d| u8::try_from(d).ok())
        };
        match (bytes[i], hex(i + 1), hex(i + 2)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push(hi * 16 + lo);
                i += 3;
            }
            (byte, _, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// libpq's `key = value ...` form: values bare or single-quoted, a
/// backslash escaping the next character. The kept parameters are copied as
/// written, separated by one space.
fn split_key_values(text: &str) -> Option<Split> {
    let (mut ssl_mode, mut root_cert, mut keys) = (None, None, Vec::new());
    let mut kept = Vec::new();
    let mut chars = text.char_indices().peekable();
    let skip_spaces = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
    };
    loop {
        skip_spaces(&mut chars);
        let Some(&(start, _)) = chars.peek() else {
            break;
        };
        let mut key_end = text.len();
        while let Some(&(at, c)) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                key_end = at;
                break;
            }
            chars.next();
        }
        let key = &text[start..key_end];
        skip_spaces(&mut chars);
        if chars.next().map(|(_, c)| c) != Some('=') || key.is_empty() {
            return None;
        }
        skip_spaces(&mut chars);
        let mut value = String::new();
        let quoted = chars.next_if(|(_, c)| *c == '\'').is_some();
        let mut end = text.len();
        let mut closed = !quoted;
        while let Some(&(at, c)) = chars.peek() {
            if !quoted && c.is_whitespace() {
                end = at;
                break;
            }
            chars.next();
            match c {
                '\\' => value.push(chars.next()?.1),
                '\'' if quoted => {
                    closed = true;
                    end = at + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        if !closed {
            return None;
        }
        match key {
            "sslmode" => ssl_mode = Some(value),
            "sslrootcert" => root_cert = Some(value),
            key => {
                keys.push(key.to_owned());
                kept.push(text[start..end].to_owned());
            }
        }
    }
    Some(Split {
        head: None,
        kept,
        ssl_mode,
        root_cert,
        keys,
    })
}

#[cfg(test)]
mod tests {
    use super::{ConnString, DEFAULTS, SslMode, parse};

    fn split(url: &str) -> ConnString {
        parse(url).unwrap()
    }

    /// Every default, as a URL's query parameters.
    fn q() -> String {
        let all: Vec<String> = DEFAULTS.iter().map(|(k, v)| format!("{k}={v}")).collect();
        all.join("&")
    }

    /// Every default, as `key=value` pairs.
    fn kv() -> String {
        q().replace('&', " ")
    }

    #[test]
    fn urls_lose_their_tls_parameters_and_keep_the_rest() {
        assert_eq!(
            split("postgres://u:p@db:5432/shop?sslmode=verify-full&sslrootcert=/etc/ca.pem"),
            ConnString {
                rest: format!("postgres://u:p@db:5432/shop?{}", q()),
                ssl_mode: Some(SslMode::VerifyFull),
                root_cert: Some("/etc/ca.pem".into()),
            }
        );
        assert_eq!(
            split("postgresql://db/shop?application_name=a&sslmode=verify-ca&connect_timeout=5"),
            ConnString {
                rest: format!(
                    "postgresql://db/shop?{}&application_name=a&connect_timeout=5",
                    q()
                ),
                ssl_mode: Some(SslMode::VerifyCa),
                root_cert: None,
            }
        );
        // Percent-encoded keys and values, a `?` in the password, the last
        // value wins.
        assert_eq!(
            split(
                "postgres://u:p?w@db?sslmode=prefer&ssl%6dode=require&sslrootcert=%2Fca%20dir%2Fca.pem"
            ),
            ConnString {
                rest: format!("postgres://u:p?w@db?{}", q()),
                ssl_mode: Some(SslMode::Require),
                root_cert: Some("/ca dir/ca.pem".into()),
            }
        );
        let plain = split("postgres://postgres@127.0.0.1:5432/postgres");
        assert_eq!(
            plain.rest,
            format!("postgres://postgres@127.0.0.1:5432/postgres?{}", q())
        );
        assert_eq!(plain.ssl_mode, None);
        assert_eq!(plain.mode(), SslMode::Prefer, "libpq's default");
    }

    #[test]
    fn key_value_strings_lose_their_tls_parameters_and_keep_the_rest() {
        assert_eq!(
            split(
                "host=db  sslmode = verify-full user=app sslrootcert='/c a/ca.pem' password='x\\'y'"
            ),
            ConnString {
                rest: format!("{} host=db user=app password='x\\'y'", kv()),
                ssl_mode: Some(SslMode::VerifyFull),
                root_cert: Some("/c a/ca.pem".into()),
            }
        );
        assert_eq!(
            split("host=db sslmode=allow").ssl_mode,
            Some(SslMode::Allow)
        );
        assert_eq!(split("dbname=x").rest, format!("{} dbname=x", kv()));
        // Unreadable strings go through whole for tokio-postgres to judge.
        assert_eq!(split("host=db sslmode").rest, "host=db sslmode");
        assert_eq!(split("host='db").rest, "host='db");
    }

    #[test]
    fn unknown_sslmodes_are_refused() {
        let err = parse("postgres://db?sslmode=verify_full").unwrap_err();
        assert!(err.contains("verify-full"), "{err}");
        assert!(parse("host=db sslmode=on").is_err());
        for mode in [
            "disable",
            "allow",
            "prefer",
            "require",
            "verify-ca",
            "verify-full",
        ] {
            let parsed = split(&format!("postgres://db?sslmode={mode}"));
            assert_eq!(parsed.mode().to_string(), mode);
            assert_eq!(parsed.rest, format!("postgres://db?{}", q()));
        }
    }

    #[test]
    fn every_string_asks_for_a_read_write_server_unless_it_says_otherwise() {
        // Several hosts: the connector tries them in order and keeps the
        // first that takes writes (`SHOW transaction_read_only` = off).
        assert_eq!(
            split("postgres://app@pg1:5432,pg2:5433/shop?sslmode=require").rest,
            format!("postgres://app@pg1:5432,pg2:5433/shop?{}", q())
        );
        assert_eq!(
            split("host=pg1,pg2 port=5432,5433 dbname=shop").rest,
            format!("{} host=pg1,pg2 port=5432,5433 dbname=shop", kv())
        );
        assert_eq!(split("").rest, kv());
        // Set by the string, in either form (even percent-encoded): kept
        // as written, not added.
        let others = q().replace("target_session_attrs=read-write&", "");
        for (url, rest) in [
            (
                "postgres://app@pg1,pg2/shop?target_session_attrs=any",
                format!("postgres://app@pg1,pg2/shop?{others}&target_session_attrs=any"),
            ),
            (
                "postgres://app@pg1,pg2/shop?connect_timeout=2&target%5Fsession%5Fattrs=read-write",
                format!(
                    "postgres://app@pg1,pg2/shop?{others}&connect_timeout=2&target%5Fsession%5Fattrs=read-write"
                ),
            ),
            (
                "host=pg1,pg2 target_session_attrs=any dbname=shop",
                format!(
                    "{} host=pg1,pg2 target_session_attrs=any dbname=shop",
                    others.replace('&', " ")
                ),
            ),
            (
                "host=pg1 target_session_attrs = 'read-write'",
                format!(
                    "{} host=pg1 target_session_attrs = 'read-write'",
                    others.replace('&', " ")
                ),
            ),
        ] {
            assert_eq!(split(url).rest, rest, "{url}");
        }
        // An unreadable string goes through untouched.
        assert_eq!(split("host='pg1").rest, "host='pg1");
    }

    /// The keepalive and `tcp_user_timeout` defaults, each overridden by the
    /// string's own value, as tokio-postgres reads them.
    #[test]
    fn keepalives_and_tcp_user_timeout_have_defaults_a_string_overrides() {
        use std::time::Duration;
        for url in ["postgres://app@db/shop", "host=db user=app dbname=shop"] {
            let config: tokio_postgres::Config = split(url).rest.parse().unwrap();
            assert!(config.get_keepalives(), "{url}");
            assert_eq!(config.get_keepalives_idle(), Duration::from_secs(30));
            assert_eq!(
                config.get_keepalives_interval(),
                Some(Duration::from_secs(10))
            );
            assert_eq!(config.get_keepalives_retries(), Some(3));
            assert_eq!(
                config.get_tcp_user_timeout(),
                Some(&Duration::from_secs(30))
            );
        }
        for url in [
            "postgres://app@db/shop?keepalives_idle=7&keepalives_interval=2&keepalives_retries=9&tcp_user_timeout=4",
            "host=db keepalives_idle=7 keepalives_interval=2 keepalives_retries=9 tcp_user_timeout=4",
        ] {
            let rest = split(url).rest;
            assert!(!rest.contains("keepalives_idle=30"), "{rest}");
            let config: tokio_postgres::Config = rest.parse().unwrap();
            assert_eq!(config.get_keepalives_idle(), Duration::from_secs(7));
            assert_eq!(
                config.get_keepalives_interval(),
                Some(Duration::from_secs(2))
            );
            assert_eq!(config.get_keepalives_retries(), Some(9));
            assert_eq!(config.get_tcp_user_timeout(), Some(&Duration::from_secs(4)));
        }
    }

    /// The defaults go first: a URL ending in `?` or `&` and a `key=value`
    /// string ending in an empty value (both valid for tokio-postgres)
    /// read the same, with the defaults.
    #[test]
    fn defaults_are_put_first_so_a_trailing_separator_or_empty_value_is_harmless() {
        use tokio_postgres::config::TargetSessionAttrs;
        for url in [
            "postgres://app@db/shop?",
            "postgres://app@db/shop?application_name=a&",
            "postgres://app@db/shop?application_name=a&sslmode=disable&",
        ] {
            let rest = split(url).rest;
            assert!(rest.starts_with(&format!("postgres://app@db/shop?{}", q())));
            let config: tokio_postgres::Config = rest
                .parse()
                .unwrap_or_else(|e| panic!("{url} → {rest}: {e}"));
            assert_eq!(
                config.get_target_session_attrs(),
                TargetSessionAttrs::ReadWrite,
                "{url}"
            );
        }
        // An empty last value: appended, a default would be read as that
        // value; first, it is not (tokio-postgres refuses the string as it
        // refuses it without the defaults, and an empty value it reads,
        // quoted, is kept empty).
        let rest = split("host=db dbname=shop application_name=").rest;
        assert_eq!(
            rest,
            format!("{} host=db dbname=shop application_name=", kv())
        );
        assert!(rest.parse::<tokio_postgres::Config>().is_err());
        assert!(
            "host=db dbname=shop application_name="
                .parse::<tokio_postgres::Config>()
                .is_err()
        );
        let config: tokio_postgres::Config =
            split("host=db application_name=''").rest.parse().unwrap();
        assert_eq!(config.get_application_name(), Some(""));
        assert_eq!(
            config.get_target_session_attrs(),
            TargetSessionAttrs::ReadWrite
        );
        assert_eq!(config.get_keepalives_retries(), Some(3));
    }

    /// What the driver makes of the strings: the hosts and ports of a
    /// multi-host URL and the session attributes this crate adds.
    #[test]
    fn tokio_postgres_reads_the_hosts_and_the_session_attrs() {
        use tokio_postgres::config::{Host, TargetSessionAttrs};
        for url in [
            "postgres://app@127.0.0.1:5432,127.0.0.1:5433/shop?sslmode=disable",
            "host=127.0.0.1,127.0.0.1 port=5432,5433 user=app dbname=shop",
        ] {
            let config: tokio_postgres::Config = split(url).rest.parse().unwrap();
            assert_eq!(
                config.get_hosts(),
                [Host::Tcp("127.0.0.1".into()), Host::Tcp("127.0.0.1".into())],
                "{url}"
            );
            assert_eq!(config.get_ports(), [5432, 5433], "{url}");
            assert_eq!(
                config.get_target_session_attrs(),
                TargetSessionAttrs::ReadWrite,
                "{url}"
            );
        }
        let any: tokio_postgres::Config = split("postgres://a,b/x?target_session_attrs=any")
            .rest
            .parse()
            .unwrap();
        assert_eq!(any.get_target_session_attrs(), TargetSessionAttrs::Any);
    }
}
