//! Settings, read from the environment, with the defaults of the service's
//! contract.
//!
//! | variable | default | used by |
//! |---|---|---|
//! | `DATABASE_URL` | `postgres://postgres@127.0.0.1:5432/ecommerce` (created if missing); TLS (`sslmode`, `sslrootcert`) with the `postgres-tls` feature. Or MariaDB, `mysql://user:password@host:3306/ecommerce` (created if missing), or SQLite, `sqlite://shop.db` (a file, created if missing: no database server) | every role |
//! | `AMQP_URL` | `amqp://guest:guest@127.0.0.1:5672/%2f`; for a RabbitMQ cluster, every node's URL separated by commas (tried in turn) | every role |
//! | `BIND` | `127.0.0.1:3000` | `api`, `all` |
//! | `EXCHANGE` | `ecommerce.events` | every role |
//! | `QUEUE_PREFIX` | `ecommerce` (queues are `<prefix>.inventory`, `<prefix>.loyalty`, `<prefix>.orders`) | every role |
//! | `SENT_RETENTION` | `7d`: the janitor deletes sent events older than this | `relay`, `all` |
//! | `INBOX_RETENTION` | `14d`: and inbox entries older than this (at least the broker's redelivery window + the consumers' retry window + the replay window) | `relay`, `all` |
//! | `JANITOR_INTERVAL` | `5m`: time between janitor runs | `relay`, `all` |
//! | `ADMIN_TOKEN` | unset: no admin API. Set (16 bytes or more): the admin API at `/admin`, this bearer token acting as the operator `admin` | `api`, `all` |
//! | `ADMIN_READ_TOKEN` | unset. A bearer token for the read-only caller `read-only` (needs `ADMIN_TOKEN`) | `api`, `all` |
//! | `RUST_LOG` | `info` | every role (read in `main`) |

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use crate::db::Backend;

/// Default of `DATABASE_URL`.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/ecommerce";
/// Default of `AMQP_URL`.
pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
/// Default of `BIND`.
pub const DEFAULT_BIND: &str = "127.0.0.1:3000";
/// Default of `EXCHANGE`.
pub const DEFAULT_EXCHANGE: &str = "ecommerce.events";
/// Default of `QUEUE_PREFIX`.
pub const DEFAULT_QUEUE_PREFIX: &str = "ecommerce";

/// Default of `SENT_RETENTION`.
pub const DEFAULT_SENT_RETENTION: &str = "7d";
/// Default of `INBOX_RETENTION`: at least the broker's redelivery window,
/// plus the consumers' retry window, plus the replay window.
pub const DEFAULT_INBOX_RETENTION: &str = "14d";
/// Default of `JANITOR_INTERVAL`.
pub const DEFAULT_JANITOR_INTERVAL: &str = "5m";

/// The service's settings.
#[derive(Clone)]
pub struct Config {
    /// URL of the service's database.
    pub database_url: String,
    /// The back end `database_url` names.
    pub backend: Backend,
    /// RabbitMQ URL.
    pub amqp_url: String,
    /// Where the HTTP API listens.
    pub bind: SocketAddr,
    /// The durable topic exchange every event is published to.
    pub exchange: String,
    /// The prefix of the queue names.
    pub queue_prefix: String,
    /// How long the janitor keeps sent events (`SENT_RETENTION`, e.g. `7d`).
    pub sent_retention: Duration,
    /// How long the janitor keeps inbox entries (`INBOX_RETENTION`).
    pub inbox_retention: Duration,
    /// Time between janitor runs (`JANITOR_INTERVAL`).
    pub janitor_interval: Duration,
    /// The admin API's operator token (`ADMIN_TOKEN`); `None`: no admin API.
    pub admin_token: Option<String>,
    /// The admin API's read-only token (`ADMIN_READ_TOKEN`).
    pub admin_read_token: Option<String>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // URLs may carry passwords: never log them.
        f.debug_struct("Config")
            .field("database_url", &redact_url(&self.database_url))
            .field("backend", &self.backend)
            .field("amqp_url", &redact_url(&self.amqp_url))
            .field("bind", &self.bind)
            .field("exchange", &self.exchange)
            .field("queue_prefix", &self.queue_prefix)
            .field("sent_retention", &self.sent_retention)
            .field("inbox_retention", &self.inbox_retention)
            .field("janitor_interval", &self.janitor_interval)
            .field("admin_token", &self.admin_token.as_ref().map(|_| "***"))
            .field(
                "admin_read_token",
                &self.admin_read_token.as_ref().map(|_| "***"),
            )
            .finish()
    }
}

/// A setting that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A variable is set to something that is not valid Unicode.
    #[error("environment variable {0} is not valid Unicode")]
    NotUnicode(&'static str),
    /// A variable is set but empty.
    #[error("environment variable {0} is set but empty; unset it to use the default")]
    Empty(&'static str),
    /// A duration variable does not parse.
    #[error("{name}={value:?} is not a duration such as 30s, 15m or 7d: {source}")]
    Duration {
        /// The variable.
        name: &'static str,
        /// The value given.
        value: String,
        /// Why it does not parse.
        #[source]
        source: humantime::DurationError,
    },
    /// `ADMIN_READ_TOKEN` without `ADMIN_TOKEN`.
    #[error(
        "ADMIN_READ_TOKEN is set but ADMIN_TOKEN is not: set ADMIN_TOKEN to enable the admin API"
    )]
    ReadTokenAlone,
    /// `DATABASE_URL` names a back end the service does not run on.
    #[error(
        "DATABASE_URL={url:?} is not a database URL the service knows: use postgres://…, \
         mysql://… or sqlite://path"
    )]
    DatabaseUrl {
        /// The value given, password redacted.
        url: String,
    },
    /// `BIND` is not an address.
    #[error("BIND={value:?} is not a socket address such as 127.0.0.1:3000: {source}")]
    Bind {
        /// The value given.
        value: String,
        /// Why it does not parse.
        #[source]
        source: std::net::AddrParseError,
    },
}

impl Config {
    /// Reads the settings from the environment.
    ///
    /// # Errors
    /// [`ConfigError`] naming the variable that cannot be used.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name))
    }

    /// Reads the settings through `lookup` (the environment, or a map in tests).
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Result<String, std::env::VarError>,
    ) -> Result<Self, ConfigError> {
        let var = |name: &'static str, default: &str| -> Result<String, ConfigError> {
            match lookup(name) {
                Ok(value) if value.is_empty() => Err(ConfigError::Empty(name)),
                Ok(value) => Ok(value),
                Err(std::env::VarError::NotPresent) => Ok(default.to_owned()),
                Err(std::env::VarError::NotUnicode(_)) => Err(ConfigError::NotUnicode(name)),
            }
        };
        let optional = |name: &'static str| -> Result<Option<String>, ConfigError> {
            match lookup(name) {
                Ok(value) if value.is_empty() => Err(ConfigError::Empty(name)),
                Ok(value) => Ok(Some(value)),
                Err(std::env::VarError::NotPresent) => Ok(None),
                Err(std::env::VarError::NotUnicode(_)) => Err(ConfigError::NotUnicode(name)),
            }
        };
        let admin_token = optional("ADMIN_TOKEN")?;
        let admin_read_token = optional("ADMIN_READ_TOKEN")?;
        if admin_token.is_none() && admin_read_token.is_some() {
            return Err(ConfigError::ReadTokenAlone);
        }
        let bind = var("BIND", DEFAULT_BIND)?;
        let duration = |name: &'static str, default: &str| -> Result<Duration, ConfigError> {
            let value = var(name, default)?;
            humantime::parse_duration(&value).map_err(|source| ConfigError::Duration {
                name,
                value,
                source,
            })
        };
        let database_url = var("DATABASE_URL", DEFAULT_DATABASE_URL)?;
        let backend = Backend::of(&database_url).ok_or_else(|| ConfigError::DatabaseUrl {
            url: redact_url(&database_url),
        })?;
        Ok(Config {
            database_url,
            backend,
            amqp_url: var("AMQP_URL", DEFAULT_AMQP_URL)?,
            bind: SocketAddr::from_str(&bind).map_err(|source| ConfigError::Bind {
                value: bind.clone(),
                source,
            })?,
            exchange: var("EXCHANGE", DEFAULT_EXCHANGE)?,
            queue_prefix: var("QUEUE_PREFIX", DEFAULT_QUEUE_PREFIX)?,
            sent_retention: duration("SENT_RETENTION", DEFAULT_SENT_RETENTION)?,
            inbox_retention: duration("INBOX_RETENTION", DEFAULT_INBOX_RETENTION)?,
            janitor_interval: duration("JANITOR_INTERVAL", DEFAULT_JANITOR_INTERVAL)?,
            admin_token,
            admin_read_token,
        })
    }

    /// The queue `<QUEUE_PREFIX>.<name>`.
    pub fn queue(&self, name: &str) -> String {
        format!("{}.{name}", self.queue_prefix)
    }
}

pub use outbox::redact_url;

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Config::from_lookup(|name| {
            vars.get(name)
                .cloned()
                .ok_or(std::env::VarError::NotPresent)
        })
    }

    #[test]
    fn defaults_are_the_contract() {
        let config = config(&[]).unwrap();
        assert_eq!(config.database_url, DEFAULT_DATABASE_URL);
        assert_eq!(config.amqp_url, DEFAULT_AMQP_URL);
        assert_eq!(config.bind.to_string(), "127.0.0.1:3000");
        assert_eq!(config.exchange, "ecommerce.events");
        assert_eq!(config.queue("inventory"), "ecommerce.inventory");
        assert_eq!(config.sent_retention, Duration::from_secs(7 * 86_400));
        assert_eq!(config.inbox_retention, Duration::from_secs(14 * 86_400));
        assert_eq!(config.janitor_interval, Duration::from_secs(300));
        assert_eq!((config.admin_token, config.admin_read_token), (None, None));
    }

    #[test]
    fn retentions_are_durations() {
        let config = config(&[("SENT_RETENTION", "30s"), ("INBOX_RETENTION", "2m")]).unwrap();
        assert_eq!(config.sent_retention, Duration::from_secs(30));
        assert_eq!(config.inbox_retention, Duration::from_secs(120));
        let err = super::tests::config(&[("SENT_RETENTION", "a week")]).unwrap_err();
        assert!(
            err.to_string().starts_with("SENT_RETENTION=\"a week\""),
            "{err}"
        );
    }

    #[test]
    fn admin_tokens_are_optional_need_the_operator_one_and_never_show() {
        let config = config(&[
            ("ADMIN_TOKEN", "op-0123456789abcdef"),
            ("ADMIN_READ_TOKEN", "ro-0123456789abcdef"),
        ])
        .unwrap();
        assert_eq!(config.admin_token.as_deref(), Some("op-0123456789abcdef"));
        assert_eq!(
            config.admin_read_token.as_deref(),
            Some("ro-0123456789abcdef")
        );
        let shown = format!("{config:?}");
        assert!(!shown.contains("0123456789abcdef"), "{shown}");
        let err = super::tests::config(&[("ADMIN_READ_TOKEN", "ro-0123456789abcdef")]).unwrap_err();
        assert!(matches!(err, ConfigError::ReadTokenAlone), "{err}");
        let err = super::tests::config(&[("ADMIN_TOKEN", "")]).unwrap_err();
        assert!(err.to_string().contains("ADMIN_TOKEN"), "{err}");
    }

    #[test]
    fn variables_override_and_bad_values_name_the_variable() {
        let config = config(&[("QUEUE_PREFIX", "shop"), ("BIND", "0.0.0.0:8080")]).unwrap();
        assert_eq!(config.queue("orders"), "shop.orders");
        assert_eq!(config.bind.port(), 8080);
        let err = super::tests::config(&[("BIND", "localhost")]).unwrap_err();
        assert!(err.to_string().starts_with("BIND=\"localhost\""), "{err}");
        let err = super::tests::config(&[("EXCHANGE", "")]).unwrap_err();
        assert!(err.to_string().contains("EXCHANGE"), "{err}");
    }

    #[test]
    fn the_database_url_chooses_the_back_end() {
        for (url, backend) in [
            (DEFAULT_DATABASE_URL, Backend::Postgres),
            ("postgresql://db/shop", Backend::Postgres),
            ("mysql://outbox:outbox@127.0.0.1:3306/shop", Backend::Mysql),
            ("sqlite://shop.db", Backend::Sqlite),
            ("sqlite:///var/lib/shop.db", Backend::Sqlite),
        ] {
            assert_eq!(
                config(&[("DATABASE_URL", url)]).unwrap().backend,
                backend,
                "{url}"
            );
        }
        for url in [
            "shop.db",
            "redis://127.0.0.1/0",
            "mysql:/db",
            "mariadb://u:secret@db/shop",
            "SQLITE://shop.db",
        ] {
            let err = config(&[("DATABASE_URL", url)]).unwrap_err();
            assert!(
                matches!(err, ConfigError::DatabaseUrl { .. }),
                "{url}: {err}"
            );
            let text = err.to_string();
            assert!(text.contains("sqlite://path"), "{text}");
            assert!(!text.contains("secret"), "{text}");
        }
    }

    #[test]
    fn debug_redacts_passwords() {
        let config = config(&[("AMQP_URL", "amqp://app:s3cret@mq:5672/%2f")]).unwrap();
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("amqp://app:***@mq:5672/%2f"), "{shown}");
    }
}
