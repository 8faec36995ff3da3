//! Opening connections: every connection this crate opens (the pool, the
//! `LISTEN` connection, migrations, [`connect`](crate::connect)) goes
//! through [`Connector`], which honours `sslmode` and `sslrootcert` as libpq
//! does (see the crate docs, "TLS"), and asks for a server that takes
//! writes (`target_session_attrs=read-write`, unless the URL sets it): with
//! the hosts of a primary and its standbys in the URL, connections follow a
//! failover to the promoted standby (see the crate docs, "Failover").

mod params;
#[cfg(feature = "postgres-tls")]
mod tls;

use std::time::Duration;

use diesel::{ConnectionError, ConnectionResult};
use diesel_async::AsyncPgConnection;

use crate::error::redact_url;
use crate::{Error, Result};
use params::{ConnString, SslMode};

/// How long each host of a URL naming several gets to answer when the URL
/// sets no `connect_timeout`: the TCP connection, TLS, the startup and
/// authentication and the read-write check together. A host that takes
/// longer (a frozen server, a vanished machine) is given up for the next.
/// A URL with one host gets [`POOL_CONNECT_TIMEOUT`](crate::POOL_CONNECT_TIMEOUT)
/// (10 s), as its pool always did.
pub(crate) const HOST_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How to open connections to one URL, worked out once.
pub(crate) struct Connector {
    target: ConnString,
    /// One configuration per host of the URL, in its order, each with only
    /// that host (and its port and `hostaddr`); empty without the
    /// `postgres-tls` feature when tokio-postgres cannot read the URL.
    hosts: Vec<HostConfig>,
    /// The limit of one host's attempt: the URL's `connect_timeout`, else
    /// [`HOST_CONNECT_TIMEOUT`] with several hosts, 10 s with one.
    per_host: Duration,
    /// `load_balance_hosts=random`: hosts tried in a random order.
    random: bool,
    #[cfg(feature = "postgres-tls")]
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
}

/// One host of the URL and the configuration that connects to it alone.
struct HostConfig {
    /// `host:port`, for errors.
    label: String,
    config: tokio_postgres::Config,
}

impl Connector {
    /// Reads the TLS settings of `url`.
    ///
    /// # Errors
    /// [`Error::Tls`]: an unknown `sslmode`; without the `postgres-tls`
    /// feature, a URL that asks for TLS; with it, `verify-ca` or
    /// `verify-full` without a usable `sslrootcert`. [`Error::Config`]: a
    /// URL tokio-postgres cannot read (with the feature; without it, that is
    /// reported when connecting, as before).
    pub(crate) fn new(url: &str) -> Result<Connector> {
        let tls_error = |reason: String| Error::Tls {
            url: redact_url(url),
            reason,
        };
        let target = params::parse(url).map_err(tls_error)?;
        let parsed = target.rest.parse::<tokio_postgres::Config>();
        #[cfg(not(feature = "postgres-tls"))]
        let config = {
            plaintext_only(&target).map_err(tls_error)?;
            // Without the feature a URL tokio-postgres cannot read is
            // reported when connecting, as diesel-async reports it.
            parsed.ok()
        };
        #[cfg(feature = "postgres-tls")]
        let (config, tls) = {
            let config = parsed.map_err(|e| {
                Error::Config(format!(
                    "cannot read the PostgreSQL URL {}: {e}",
                    redact_url(url)
                ))
            })?;
            let tls = match target.mode() {
                SslMode::Disable => None,
                mode => Some(tls::connector(mode, target.root_cert.as_deref()).map_err(tls_error)?),
            };
            (Some(config), tls)
        };
        let hosts = config.as_ref().map(one_per_host).unwrap_or_default();
        let per_host = config
            .as_ref()
            .and_then(|config| config.get_connect_timeout().copied())
            .unwrap_or(if hosts.len() > 1 {
                HOST_CONNECT_TIMEOUT
            } else {
                crate::POOL_CONNECT_TIMEOUT
            });
        let random = config.as_ref().is_some_and(|config| {
            config.get_load_balance_hosts() == tokio_postgres::config::LoadBalanceHosts::Random
        });
        Ok(Connector {
            hosts,
            target,
            per_host,
            random,
            #[cfg(feature = "postgres-tls")]
            tls,
        })
    }

    /// How long opening one connection may take at most: every host's
    /// limit, one after the other.
    pub(crate) fn walk_limit(&self) -> Duration {
        let hosts = u32::try_from(self.hosts.len().max(1)).unwrap_or(u32::MAX);
        self.per_host.saturating_mul(hosts)
    }

    /// Opens one connection: tries the hosts of the URL one at a time, in
    /// order (random with `load_balance_hosts=random`), each for at most
    /// its limit (the URL's `connect_timeout`, else
    /// [`HOST_CONNECT_TIMEOUT`] with several hosts, 10 s with one); the
    /// first that connects (and, by default, takes writes) wins.
    ///
    /// # Errors
    /// The driver's, as diesel's [`ConnectionError`]; with several hosts,
    /// one text naming each host's failure.
    pub(crate) async fn connect(&self) -> ConnectionResult<AsyncPgConnection> {
        if self.hosts.is_empty() {
            use diesel_async::AsyncConnection as _;
            let establish = AsyncPgConnection::establish(&self.target.rest);
            return tokio::time::timeout(self.per_host, establish)
                .await
                .unwrap_or_else(|_| Err(self.timed_out()));
        }
        let mut order: Vec<&HostConfig> = self.hosts.iter().collect();
        if self.random {
            shuffle(&mut order);
        }
        let mut failures = Vec::with_capacity(order.len());
        for host in order {
            let attempt = tokio::time::timeout(self.per_host, self.connect_to(&host.config));
            let error = match attempt.await {
                Ok(Ok(conn)) => return Ok(conn),
                Ok(Err(error)) => error,
                Err(_) => self.timed_out(),
            };
            if self.hosts.len() == 1 {
                return Err(match error {
                    ConnectionError::BadConnection(text) => {
                        ConnectionError::BadConnection(explain_read_only(text))
                    }
                    other => other,
                });
            }
            tracing::debug!(host = %host.label, %error, "PostgreSQL host not usable, trying the next");
            failures.push(format!("{}: {error}", host.label));
        }
        Err(ConnectionError::BadConnection(explain_read_only(format!(
            "no host of the URL could be used: {}",
            failures.join("; ")
        ))))
    }

    fn timed_out(&self) -> ConnectionError {
        ConnectionError::BadConnection(format!(
            "timed out: no answer within {} s (the URL's connect_timeout, else {} s per host \
             with several, {} s with one): the server is down, frozen or unreachable",
            self.per_host.as_secs_f32(),
            HOST_CONNECT_TIMEOUT.as_secs(),
            crate::POOL_CONNECT_TIMEOUT.as_secs()
        ))
    }

    /// One connection to the one host of `config`, with the URL's TLS.
    async fn connect_to(
        &self,
        config: &tokio_postgres::Config,
    ) -> ConnectionResult<AsyncPgConnection> {
        #[cfg(not(feature = "postgres-tls"))]
        {
            let mut config = config.clone();
            config.ssl_mode(tokio_postgres::config::SslMode::Disable);
            open(&config, tokio_postgres::NoTls).await
        }
        #[cfg(feature = "postgres-tls")]
        {
            use tokio_postgres::config::SslMode as Mode;
            let mode = self.target.mode();
            let Some(tls) = &self.tls else {
                let mut config = config.clone();
                config.ssl_mode(Mode::Disable);
                return open(&config, tokio_postgres::NoTls).await;
            };
            let mut config = config.clone();
            match mode {
                SslMode::Allow => {
                    // libpq's `allow`: plaintext first, TLS if refused.
                    config.ssl_mode(Mode::Disable);
                    let plain = match open(&config, tokio_postgres::NoTls).await {
                        Ok(conn) => return Ok(conn),
                        Err(err) => err,
                    };
                    config.ssl_mode(Mode::Require);
                    open(&config, tls.clone()).await.map_err(|tls| {
                        ConnectionError::BadConnection(format!(
                            "{plain}; then with TLS (sslmode=allow): {tls}"
                        ))
                    })
                }
                SslMode::Prefer => {
                    config.ssl_mode(Mode::Prefer);
                    open(&config, tls.clone()).await
                }
                _ => {
                    config.ssl_mode(Mode::Require);
                    open(&config, tls.clone()).await
                }
            }
        }
    }
}

/// `config` split into one configuration per host, each a copy of `config`
/// with every setting but the host list kept: the host, its `hostaddr`
/// and its port (a single port serves every host, as in tokio-postgres).
/// A configuration with one host (or none) is kept whole.
fn one_per_host(config: &tokio_postgres::Config) -> Vec<HostConfig> {
    let hosts = config.get_hosts();
    let addrs = config.get_hostaddrs();
    let ports = config.get_ports();
    let count = hosts.len().max(addrs.len());
    let port_of = |i: usize| ports.get(i).or_else(|| ports.first()).copied();
    let label = |i: usize| {
        let host = match (hosts.get(i), addrs.get(i)) {
            (Some(tokio_postgres::config::Host::Tcp(host)), _) => host.clone(),
            #[cfg(unix)]
            (Some(tokio_postgres::config::Host::Unix(path)), _) => path.display().to_string(),
            (None, Some(addr)) => addr.to_string(),
            (None, None) => String::from("(no host)"),
        };
        format!("{host}:{}", port_of(i).unwrap_or(5432))
    };
    if count <= 1 {
        return vec![HostConfig {
            label: label(0),
            config: config.clone(),
        }];
    }
    (0..count)
        .map(|i| {
            let mut one = copy_without_hosts(config);
            match hosts.get(i) {
                Some(tokio_postgres::config::Host::Tcp(host)) => {
                    one.host(host);
                }
                #[cfg(unix)]
                Some(tokio_postgres::config::Host::Unix(path)) => {
                    one.host_path(path);
                }
                None => {}
            }
            if let Some(addr) = addrs.get(i) {
                one.hostaddr(*addr);
            }
            if let Some(port) = port_of(i) {
                one.port(port);
            }
            HostConfig {
                label: label(i),
                config: one,
            }
        })
        .collect()
}

/// Every setting of `config` but its hosts, `hostaddr`s and ports (the
/// fields of tokio-postgres 0.7's `Config`; the unit test
/// `a_single_host_copy_keeps_every_setting` compares a copy with the
/// original field by field through `PartialEq`).
fn copy_without_hosts(config: &tokio_postgres::Config) -> tokio_postgres::Config {
    let mut copy = tokio_postgres::Config::new();
    if let Some(user) = config.get_user() {
        copy.user(user);
    }
    if let Some(password) = config.get_password() {
        copy.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        copy.dbname(dbname);
    }
    if let Some(options) = config.get_options() {
        copy.options(options);
    }
    if let Some(name) = config.get_application_name() {
        copy.application_name(name);
    }
    copy.ssl_mode(config.get_ssl_mode())
        .ssl_negotiation(config.get_ssl_negotiation())
        .keepalives(config.get_keepalives())
        .keepalives_idle(config.get_keepalives_idle())
        .target_session_attrs(config.get_target_session_attrs())
        .channel_binding(config.get_channel_binding())
        .load_balance_hosts(config.get_load_balance_hosts());
    if let Some(timeout) = config.get_connect_timeout() {
        copy.connect_timeout(*timeout);
    }
    if let Some(timeout) = config.get_tcp_user_timeout() {
        copy.tcp_user_timeout(*timeout);
    }
    if let Some(interval) = config.get_keepalives_interval() {
        copy.keepalives_interval(interval);
    }
    if let Some(retries) = config.get_keepalives_retries() {
        copy.keepalives_retries(retries);
    }
    copy
}

/// `items` in a random order (`load_balance_hosts=random`), from the
/// standard library's randomly seeded hasher.
fn shuffle<T>(items: &mut [T]) {
    use std::hash::{BuildHasher as _, Hasher as _};
    let state = std::collections::hash_map::RandomState::new();
    for i in (1..items.len()).rev() {
        let mut hasher = state.build_hasher();
        hasher.write_usize(i);
        let pick = usize::try_from(hasher.finish() % (i as u64 + 1)).unwrap_or(0);
        items.swap(i, pick);
    }
}

async fn open<T>(config: &tokio_postgres::Config, tls: T) -> ConnectionResult<AsyncPgConnection>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: tokio_postgres::tls::TlsStream + Unpin + Send + 'static,
{
    let (client, connection) = config.connect(tls).await.map_err(|e| {
        // tokio-postgres's own text is only the kind ("db error"): add
        // every cause (the server's message, the certificate's fault).
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(cause) = source {
            text.push_str(": ");
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        ConnectionError::BadConnection(text)
    })?;
    AsyncPgConnection::try_from_client_and_connection(client, connection).await
}

/// tokio-postgres's text when the last host it tried is a standby (or read
/// only), `target_session_attrs=read-write` asked for writes.
const NO_WRITES: &str = "database does not allow writes";

/// A connection refused because no host takes writes, said so.
fn explain_read_only(text: String) -> String {
    if text.contains(NO_WRITES) {
        format!(
            "{text}: the database is read-only (a standby?): no host in the URL takes writes \
             (target_session_attrs=read-write); during a failover this lasts until a standby \
             is promoted, and connections then go to it"
        )
    } else {
        text
    }
}

/// Without the `postgres-tls` feature every connection is plaintext: refuse
/// a URL that asks for more, rather than connect unencrypted.
#[cfg_attr(feature = "postgres-tls", allow(dead_code))]
fn plaintext_only(target: &ConnString) -> std::result::Result<(), String> {
    const ENABLE: &str = "enable the `postgres-tls` feature of `outbox` (or `outbox-diesel`)";
    let mode = target.mode();
    if mode.requires_tls() {
        return Err(format!(
            "sslmode={mode} needs TLS, which this build lacks: {ENABLE}. Without it every \
             connection is plaintext, so this one is refused"
        ));
    }
    if target.root_cert.is_some() && mode != SslMode::Disable {
        return Err(format!(
            "sslrootcert is set, but this build cannot use TLS: {ENABLE}, or remove sslrootcert"
        ));
    }
    if target.ssl_mode.is_some_and(|mode| mode != SslMode::Disable) {
        static WARNED: std::sync::Once = std::sync::Once::new();
        WARNED.call_once(|| {
            tracing::warn!(
                sslmode = %mode,
                "PostgreSQL connections are plaintext: this build has no TLS ({ENABLE} to \
                 encrypt them)"
            );
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{
        NO_WRITES, copy_without_hosts, explain_read_only, one_per_host, params, plaintext_only,
    };

    fn config(text: &str) -> tokio_postgres::Config {
        params::parse(text).unwrap().rest.parse().unwrap()
    }

    /// Every field of tokio-postgres's `Config` set away from its default:
    /// a copy that lost one differs (`Config: PartialEq` compares them all).
    const EVERYTHING: &str = "user=u password=p dbname=d options=-cx application_name=a \
        sslmode=require sslnegotiation=direct connect_timeout=3 tcp_user_timeout=4 keepalives=0 \
        keepalives_idle=5 keepalives_interval=6 keepalives_retries=7 \
        target_session_attrs=read-write channel_binding=require load_balance_hosts=random";

    #[test]
    fn a_single_host_copy_keeps_every_setting() {
        let mut whole = config(&format!(
            "host=db hostaddr=127.0.0.1 port=5433 {EVERYTHING}"
        ));
        // `sslmode` is this crate's (taken out of the string): set it here.
        whole.ssl_mode(tokio_postgres::config::SslMode::Disable);
        let mut copy = copy_without_hosts(&whole);
        copy.host("db").hostaddr([127, 0, 0, 1].into()).port(5433);
        assert_eq!(copy, whole);
        assert_ne!(copy_without_hosts(&whole), whole);
    }

    #[test]
    fn a_multi_host_config_is_split_into_one_per_host() {
        let whole = config(&format!("host=pg1,pg2 port=5432,5433 {EVERYTHING}"));
        let hosts = one_per_host(&whole);
        let labels: Vec<&str> = hosts.iter().map(|h| h.label.as_str()).collect();
        assert_eq!(labels, ["pg1:5432", "pg2:5433"]);
        assert_eq!(
            hosts[0].config,
            config(&format!("host=pg1 port=5432 {EVERYTHING}"))
        );
        assert_eq!(
            hosts[1].config,
            config(&format!("host=pg2 port=5433 {EVERYTHING}"))
        );
        // One port for every host; none: the default.
        let hosts = one_per_host(&config("host=pg1,pg2 port=6000"));
        assert_eq!(hosts[0].config.get_ports(), [6000]);
        assert_eq!(hosts[1].label, "pg2:6000");
        let hosts = one_per_host(&config("host=pg1,pg2"));
        assert_eq!(hosts[1].label, "pg2:5432");
        assert!(hosts[1].config.get_ports().is_empty());
        // One host: the configuration as it is.
        let one = config("postgres://u@pg1:5433/d");
        assert_eq!(one_per_host(&one)[0].config, one);
    }

    #[test]
    fn a_refusal_for_want_of_a_primary_says_so() {
        let text = explain_read_only(format!("error connecting to server: {NO_WRITES}"));
        assert!(
            text.contains("the database is read-only (a standby?)"),
            "{text}"
        );
        assert!(text.contains("target_session_attrs=read-write"), "{text}");
        let other = "error connecting to server: Connection refused (os error 111)";
        assert_eq!(explain_read_only(other.to_owned()), other);
    }

    fn check(url: &str) -> Result<(), String> {
        plaintext_only(&params::parse(url).unwrap())
    }

    #[test]
    fn without_tls_a_url_asking_for_it_is_refused_naming_the_feature() {
        for mode in ["require", "verify-ca", "verify-full"] {
            let err = check(&format!("postgres://db/x?sslmode={mode}")).unwrap_err();
            assert!(err.contains(&format!("sslmode={mode}")), "{err}");
            assert!(err.contains("`postgres-tls`"), "{err}");
        }
        let err = check("host=db sslmode=prefer sslrootcert=/ca.pem").unwrap_err();
        assert!(err.contains("`postgres-tls`"), "{err}");
        for fine in [
            "postgres://db/x",
            "postgres://db/x?sslmode=disable",
            "postgres://db/x?sslmode=disable&sslrootcert=/ca.pem",
            "postgres://db/x?sslmode=prefer",
            "host=db sslmode=allow",
        ] {
            assert_eq!(check(fine), Ok(()), "{fine}");
        }
    }
}
