//! Opening MariaDB connections: every connection the back end opens
//! ([`connect`](super::connect), [`pool`](super::pool),
//! [`migrate_url`](super::migrate_url)) goes through [`Connector`], which
//! reads the URL's TLS parameters once (see the module docs, "TLS").

use diesel::ConnectionResult;
use diesel_async::AsyncMysqlConnection;

use crate::error::redact_url;
use crate::{Error, Result};

/// The parameter of this crate (not mysql_async's) naming a PEM file of CA
/// certificates to trust; removed from the URL before mysql_async reads it.
const SSL_CA: &str = "ssl_ca";

/// mysql_async's own TLS parameters.
const DRIVER_TLS_KEYS: [&str; 4] = [
    "require_ssl",
    "verify_ca",
    "verify_identity",
    "built_in_roots",
];

/// How to open connections to one URL, worked out once.
pub(super) struct Connector {
    /// The URL without [`SSL_CA`].
    #[cfg(not(feature = "mysql-tls"))]
    url: String,
    /// mysql_async's options, TLS included.
    #[cfg(feature = "mysql-tls")]
    opts: mysql_async::Opts,
    /// Whether connections are encrypted.
    #[cfg(feature = "mysql-tls")]
    tls: bool,
}

/// The TLS parameters found in a URL's query.
#[derive(Debug, Default)]
#[cfg_attr(not(feature = "mysql-tls"), allow(dead_code))]
struct TlsParams {
    /// The URL without [`SSL_CA`] (with `require_ssl=true` when
    /// [`SSL_CA`] implies it).
    url: String,
    /// `require_ssl`'s value as written.
    require_ssl: Option<String>,
    /// [`SSL_CA`]'s value, percent-decoded.
    ssl_ca: Option<String>,
    /// `built_in_roots`'s value as written.
    built_in_roots: Option<String>,
    /// The TLS keys present (mysql_async's, ours, any other `ssl…`).
    keys: Vec<String>,
}

impl TlsParams {
    fn parse(url: &str) -> TlsParams {
        let (base, fragment) = match url.split_once('#') {
            Some((base, fragment)) => (base, Some(fragment)),
            None => (url, None),
        };
        let (head, query) = base.split_once('?').unwrap_or((base, ""));
        let mut params = TlsParams::default();
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|pair| !pair.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let lower = key.to_ascii_lowercase();
            if lower.starts_with("ssl") || DRIVER_TLS_KEYS.contains(&lower.as_str()) {
                params.keys.push(key.to_owned());
            }
            match key {
                SSL_CA => params.ssl_ca = Some(percent_decode(value)),
                "require_ssl" => params.require_ssl = Some(value.to_owned()),
                "built_in_roots" => params.built_in_roots = Some(value.to_owned()),
                _ => {}
            }
            if key != SSL_CA {
                kept.push(pair);
            }
        }
        if params.ssl_ca.is_some() && params.require_ssl.is_none() {
            // ssl_ca implies TLS (mysql_async reads verify_ca and the others
            // only with require_ssl=true).
            kept.push("require_ssl=true");
        }
        params.url = head.to_owned();
        if !kept.is_empty() {
            params.url.push('?');
            params.url.push_str(&kept.join("&"));
        }
        if let Some(fragment) = fragment {
            params.url.push('#');
            params.url.push_str(fragment);
        }
        params
    }

    /// Whether the URL asks for TLS: any TLS parameter, unless
    /// `require_ssl=false` says plaintext.
    #[cfg(any(test, not(feature = "mysql-tls")))]
    fn asks_for_tls(&self) -> bool {
        self.require_ssl.as_deref() != Some("false") && !self.keys.is_empty()
    }
}

/// `%XX` sequences decoded (a path with spaces or `&` in a URL).
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Connector {
    /// Reads the TLS settings of `url`.
    ///
    /// # Errors
    /// [`Error::Tls`]: without the `mysql-tls` feature, a URL that asks for
    /// TLS; with it, an `ssl_ca` that cannot be read or holds no
    /// certificate, `verify_identity=false` (which mysql_async 0.36 cannot
    /// honour), or an `ssl…` parameter this crate does not know. [`Error::Config`]: with the
    /// feature, a URL mysql_async cannot read (without it, that is reported
    /// when connecting).
    pub(super) fn new(url: &str) -> Result<Connector> {
        let params = TlsParams::parse(url);
        let tls_error = |reason: String| Error::Tls {
            url: redact_url(url),
            reason,
        };
        #[cfg(not(feature = "mysql-tls"))]
        {
            if params.asks_for_tls() {
                return Err(tls_error(format!(
                    "{} ask(s) for TLS, which this build lacks: enable the `mysql-tls` feature \
                     of `outbox` (or `outbox-diesel`). Without it every connection is \
                     plaintext, so this one is refused (`require_ssl=false` asks for plaintext)",
                    params.keys.join(", ")
                )));
            }
            Ok(Connector { url: params.url })
        }
        #[cfg(feature = "mysql-tls")]
        {
            tls::connector(params).map_err(|e| match e {
                tls::Refused::Tls(reason) => tls_error(reason),
                tls::Refused::Url(reason) => Error::Config(format!(
                    "cannot read the MariaDB URL {}: {reason}",
                    redact_url(url)
                )),
            })
        }
    }

    /// Opens one connection.
    ///
    /// # Errors
    /// The driver's, as diesel's [`ConnectionError`](diesel::ConnectionError).
    pub(super) async fn connect(&self) -> ConnectionResult<AsyncMysqlConnection> {
        #[cfg(not(feature = "mysql-tls"))]
        {
            use diesel_async::AsyncConnection as _;
            AsyncMysqlConnection::establish(&self.url).await
        }
        #[cfg(feature = "mysql-tls")]
        {
            let conn = mysql_async::Conn::new(self.opts.clone())
                .await
                .map_err(|e| diesel::ConnectionError::BadConnection(tls::describe(&e, self.tls)))?;
            AsyncMysqlConnection::try_from(conn).await
        }
    }
}

#[cfg(feature = "mysql-tls")]
mod tls {
    //! mysql_async's options with TLS (feature `mysql-tls`).

    use mysql_async::{Opts, OptsBuilder};
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    use super::{Connector, SSL_CA, TlsParams};

    /// Why a URL is refused.
    pub(super) enum Refused {
        /// Its TLS settings: what is wrong and what to do.
        Tls(String),
        /// mysql_async cannot read it.
        Url(String),
    }

    /// The connector for a URL's `params`.
    pub(super) fn connector(params: TlsParams) -> Result<Connector, Refused> {
        if let Some(key) = params.keys.iter().find(|key| {
            let key = key.to_ascii_lowercase();
            key.starts_with("ssl") && key != SSL_CA
        }) {
            return Err(Refused::Tls(format!(
                "unknown TLS parameter `{key}`: MariaDB URLs take mysql_async's `require_ssl`, \
                 `verify_ca`, `verify_identity`, `built_in_roots` and this crate's \
                 `ssl_ca=<PEM file of CA certificates>` (client certificates are not supported)"
            )));
        }
        let opts = Opts::from_url(&params.url).map_err(|e| Refused::Url(e.to_string()))?;
        let mut ssl = opts.ssl_opts().cloned();
        // With require_ssl=false (plaintext) ssl_ca is not read, as libpq
        // ignores sslrootcert with sslmode=disable.
        if let Some(path) = params.ssl_ca.as_ref().filter(|_| ssl.is_some()) {
            let pem = read_ca(path).map_err(Refused::Tls)?;
            // A private CA replaces the built-in (public) roots, unless the
            // URL asks for both with built_in_roots=true.
            let built_in = params.built_in_roots.as_deref() == Some("true");
            ssl = ssl.map(|ssl| {
                ssl.with_root_certs(vec![pem.into()]) // mysql_async does not export `PathOrBuf`
                    .with_disable_built_in_roots(!built_in)
            });
        }
        if let Some(ssl) = &ssl
            && ssl.skip_domain_validation()
            && !ssl.accept_invalid_certs()
        {
            return Err(Refused::Tls(
                "verify_identity=false does not work with mysql_async 0.36, the driver under \
                 diesel-async 0.9: it checks the host name anyway (its rustls verifier no longer \
                 recognises rustls's name error, mysql_async issue #404). Connect by a name the \
                 server's certificate holds, with verify_identity=true"
                    .into(),
            ));
        }
        let tls = ssl.is_some();
        let mut builder = OptsBuilder::from_opts(opts)
            // As diesel-async's `establish`: it caches statements itself,
            // and counts matched rows, not changed ones.
            .stmt_cache_size(0)
            .client_found_rows(true);
        if let Some(ssl) = ssl {
            install_ring();
            // mysql_async would move a TLS connection to a local server onto
            // its Unix socket once logged in: keep it on TLS.
            builder = builder.ssl_opts(ssl).prefer_socket(false);
        }
        Ok(Connector {
            opts: builder.into(),
            tls,
        })
    }

    /// The PEM file's bytes, checked to hold certificates.
    fn read_ca(path: &str) -> Result<Vec<u8>, String> {
        let pem = std::fs::read(path).map_err(|e| format!("cannot read ssl_ca {path:?}: {e}"))?;
        let mut count = 0;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            cert.map_err(|e| format!("ssl_ca {path:?} is not valid PEM: {e}"))?;
            count += 1;
        }
        if count == 0 {
            return Err(format!(
                "ssl_ca {path:?} holds no certificate (a PEM file with `BEGIN CERTIFICATE` \
                 blocks is expected)"
            ));
        }
        Ok(pem)
    }

    /// mysql_async builds its rustls configuration with the process-wide
    /// default provider: install ring's, unless the process has one (with
    /// rustls's `aws-lc-rs` also compiled in, there would be none and rustls
    /// would panic).
    fn install_ring() {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Err: another thread installed one first, which is as good.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    }

    /// The error's text with its causes, and a hint when a plaintext login
    /// was refused (MariaDB answers "Access denied" to a plaintext login
    /// that must use TLS).
    pub(super) fn describe(error: &mysql_async::Error, tls: bool) -> String {
        let mut text = error.to_string();
        let mut source = std::error::Error::source(error);
        while let Some(cause) = source {
            let cause_text = cause.to_string();
            if !text.contains(&cause_text) {
                text.push_str(": ");
                text.push_str(&cause_text);
            }
            source = cause.source();
        }
        if let mysql_async::Error::Server(server) = error
            && !tls
            && matches!(server.code, 1045 | 3159)
        {
            text.push_str(
                " (this connection was plaintext: a server that requires TLS, with \
                 require_secure_transport or a user's REQUIRE SSL, refuses plaintext logins so; \
                 add require_ssl=true, and ssl_ca=<PEM file> for a private CA, to the URL)",
            );
        }
        text
    }

    #[cfg(test)]
    mod tests {
        use super::super::TlsParams;

        #[test]
        fn ssl_ca_is_removed_before_the_driver_reads_the_url() {
            let params = TlsParams::parse(
                "mysql://u:p@db:3306/x?require_ssl=true&ssl_ca=%2Fetc%2Fmy%20ca.pem&verify_identity=true#f",
            );
            assert_eq!(
                params.url,
                "mysql://u:p@db:3306/x?require_ssl=true&verify_identity=true#f"
            );
            assert_eq!(params.ssl_ca.as_deref(), Some("/etc/my ca.pem"));
            assert!(params.asks_for_tls());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::TlsParams;

    #[test]
    fn which_urls_ask_for_tls() {
        for url in [
            "mysql://db/x?require_ssl=true",
            "mysql://db/x?verify_identity=true",
            "mysql://db/x?ssl_ca=/ca.pem",
            "mysql://db/x?sslmode=REQUIRED",
        ] {
            assert!(TlsParams::parse(url).asks_for_tls(), "{url}");
        }
        for url in [
            "mysql://db/x",
            "mysql://db/x?prefer_socket=false",
            "mysql://db/x?require_ssl=false",
            "mysql://db/x?require_ssl=false&ssl_ca=/ca.pem",
        ] {
            assert!(!TlsParams::parse(url).asks_for_tls(), "{url}");
        }
        assert_eq!(
            TlsParams::parse("mysql://db/x?require_ssl=false&ssl_ca=/ca.pem").url,
            "mysql://db/x?require_ssl=false"
        );
        assert_eq!(
            TlsParams::parse("mysql://db/x?ssl_ca=/ca.pem&prefer_socket=false").url,
            "mysql://db/x?prefer_socket=false&require_ssl=true",
            "ssl_ca implies require_ssl=true"
        );
    }
}
