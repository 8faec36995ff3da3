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

use diesel::{ConnectionError, ConnectionResult};
use diesel_async::AsyncPgConnection;

use crate::error::redact_url;
use crate::{Error, Result};
use params::{ConnString, SslMode};

/// How to open connections to one URL, worked out once.
pub(crate) struct Connector {
    target: ConnString,
    #[cfg(feature = "postgres-tls")]
    config: tokio_postgres::Config,
    #[cfg(feature = "postgres-tls")]
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
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
        #[cfg(not(feature = "postgres-tls"))]
        {
            plaintext_only(&target).map_err(tls_error)?;
            Ok(Connector { target })
        }
        #[cfg(feature = "postgres-tls")]
        {
            let config = target.rest.parse::<tokio_postgres::Config>().map_err(|e| {
                Error::Config(format!(
                    "cannot read the PostgreSQL URL {}: {e}",
                    redact_url(url)
                ))
            })?;
            let tls = match target.mode() {
                SslMode::Disable => None,
                mode => Some(tls::connector(mode, target.root_cert.as_deref()).map_err(tls_error)?),
            };
            Ok(Connector {
                target,
                config,
                tls,
            })
        }
    }

    /// Opens one connection.
    ///
    /// # Errors
    /// The driver's, as diesel's [`ConnectionError`].
    pub(crate) async fn connect(&self) -> ConnectionResult<AsyncPgConnection> {
        #[cfg(not(feature = "postgres-tls"))]
        {
            // Read here, not in `new`: a URL tokio-postgres cannot read is
            // reported when connecting, as diesel-async reports it.
            let Ok(mut config) = self.target.rest.parse::<tokio_postgres::Config>() else {
                use diesel_async::AsyncConnection as _;
                return AsyncPgConnection::establish(&self.target.rest).await;
            };
            config.ssl_mode(tokio_postgres::config::SslMode::Disable);
            open(&config, tokio_postgres::NoTls).await
        }
        #[cfg(feature = "postgres-tls")]
        {
            use tokio_postgres::config::SslMode as Mode;
            let mode = self.target.mode();
            let Some(tls) = &self.tls else {
                let mut config = self.config.clone();
                config.ssl_mode(Mode::Disable);
                return open(&config, tokio_postgres::NoTls).await;
            };
            let mut config = self.config.clone();
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
        ConnectionError::BadConnection(explain_read_only(text))
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
    use super::{NO_WRITES, explain_read_only, params, plaintext_only};

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
