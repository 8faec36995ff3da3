//! Where the shared servers are: `DATABASE_URL`, `AMQP_URL` and `MYSQL_URL`,
//! or the local defaults that `scripts/dev-services` sets up.

/// PostgreSQL of `scripts/dev-services`, when `DATABASE_URL` is not set.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// RabbitMQ of `scripts/dev-services`, when `AMQP_URL` is not set.
pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// MariaDB of `scripts/dev-services` (user `outbox`, database
/// `outbox_test`), when `MYSQL_URL` is not set.
pub const DEFAULT_MYSQL_URL: &str = "mysql://outbox:outbox@127.0.0.1:3306/outbox_test";

/// How to get the servers, appended to every "not reachable" panic.
pub const HOW_TO_START: &str = "start the servers with scripts/dev-services, or set DATABASE_URL, \
                                AMQP_URL and MYSQL_URL";

/// The shared PostgreSQL: `DATABASE_URL`, or [`DEFAULT_DATABASE_URL`].
pub fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.to_owned())
}

/// The shared RabbitMQ: `AMQP_URL`, or [`DEFAULT_AMQP_URL`].
pub fn amqp_url() -> String {
    std::env::var("AMQP_URL").unwrap_or_else(|_| DEFAULT_AMQP_URL.to_owned())
}

/// The shared MariaDB: `MYSQL_URL`, or [`DEFAULT_MYSQL_URL`].
pub fn mysql_url() -> String {
    std::env::var("MYSQL_URL").unwrap_or_else(|_| DEFAULT_MYSQL_URL.to_owned())
}

/// `url` naming database `name` instead of its own (its query, e.g.
/// `sslmode`, kept).
///
/// ```
/// use outbox_testkit::urls::with_database;
///
/// assert_eq!(
///     with_database("postgres://u@h:5432/postgres?sslmode=require", "shop"),
///     "postgres://u@h:5432/shop?sslmode=require"
/// );
/// assert_eq!(with_database("postgres://u@h", "shop"), "postgres://u@h/shop");
/// ```
///
/// # Panics
/// When `url` has no scheme (`postgres://`).
pub fn with_database(url: &str, name: &str) -> String {
    let (scheme, rest) = url
        .split_once("://")
        .unwrap_or_else(|| panic!("a URL with a scheme, not {:?}", redact(url)));
    let (authority, query) = match rest.split_once('/') {
        Some((authority, path)) => (authority, path.split_once('?').map(|(_, q)| q)),
        None => (rest, None),
    };
    match query {
        Some(query) => format!("{scheme}://{authority}/{name}?{query}"),
        None => format!("{scheme}://{authority}/{name}"),
    }
}

/// `url` with its password replaced by `***`, for messages.
///
/// ```
/// use outbox_testkit::urls::redact;
///
/// assert_eq!(redact("amqp://guest:secret@h:5672/%2f"), "amqp://guest:***@h:5672/%2f");
/// assert_eq!(redact("postgres://postgres@h/db"), "postgres://postgres@h/db");
/// ```
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{path}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// The panic message of a server that does not answer: what, where
/// (redacted), why, and [`HOW_TO_START`].
pub fn unreachable(what: &str, url: &str, error: &dyn std::fmt::Display) -> String {
    format!(
        "{what} not reachable at {}: {error}; {HOW_TO_START}",
        redact(url)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_the_servers_of_dev_services() {
        // Whatever the environment says, the defaults are the local servers.
        assert!(DEFAULT_DATABASE_URL.starts_with("postgres://postgres@127.0.0.1:5432/"));
        assert!(DEFAULT_AMQP_URL.starts_with("amqp://guest:guest@127.0.0.1:5672/"));
        match std::env::var("DATABASE_URL") {
            Ok(url) => assert_eq!(database_url(), url),
            Err(_) => assert_eq!(database_url(), DEFAULT_DATABASE_URL),
        }
        match std::env::var("AMQP_URL") {
            Ok(url) => assert_eq!(amqp_url(), url),
            Err(_) => assert_eq!(amqp_url(), DEFAULT_AMQP_URL),
        }
        assert!(DEFAULT_MYSQL_URL.starts_with("mysql://outbox:outbox@127.0.0.1:3306/"));
        match std::env::var("MYSQL_URL") {
            Ok(url) => assert_eq!(mysql_url(), url),
            Err(_) => assert_eq!(mysql_url(), DEFAULT_MYSQL_URL),
        }
    }

    #[test]
    fn with_database_replaces_only_the_path() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/postgres", "t_1"),
            "postgres://postgres@127.0.0.1:5432/t_1"
        );
        assert_eq!(
            with_database(
                "postgres://a:b@h/x?sslmode=verify-full&sslrootcert=/ca.pem",
                "y"
            ),
            "postgres://a:b@h/y?sslmode=verify-full&sslrootcert=/ca.pem"
        );
        assert_eq!(with_database("postgres://h/", "y"), "postgres://h/y");
    }

    #[test]
    fn redact_hides_the_password_only() {
        assert_eq!(
            redact("postgres://app:s3cr3t@db:5432/shop?sslmode=require"),
            "postgres://app:***@db:5432/shop?sslmode=require"
        );
        assert_eq!(redact("amqp://h:5672"), "amqp://h:5672");
        assert_eq!(redact("not a url"), "not a url");
        // An `@` in the password: the host is after the last one.
        assert_eq!(redact("amqp://u:p@ss@h/%2f"), "amqp://u:***@h/%2f");
    }

    #[test]
    fn the_unreachable_message_says_how_to_start_the_servers() {
        let message = unreachable("RabbitMQ", "amqp://guest:pw@127.0.0.1:1/%2f", &"refused");
        assert_eq!(
            message,
            "RabbitMQ not reachable at amqp://guest:***@127.0.0.1:1/%2f: refused; \
             start the servers with scripts/dev-services, or set DATABASE_URL, AMQP_URL and \
             MYSQL_URL"
        );
    }
}
