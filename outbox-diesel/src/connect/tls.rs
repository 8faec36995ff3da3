//! The rustls client configuration for each `sslmode` (feature
//! `postgres-tls`).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::verify_server_cert_signed_by_trust_anchor;
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::params::SslMode;

/// The TLS connector for `mode`, trusting the PEM certificates in
/// `root_cert` (libpq's `sslrootcert`) when given:
///
/// | `mode` | no root | a root |
/// |---|---|---|
/// | `allow`, `prefer`, `require` | encrypted, certificate not checked | chain checked |
/// | `verify-ca` | refused | chain checked |
/// | `verify-full` | refused | chain and host name checked |
///
/// # Errors
/// A sentence saying what is wrong: `verify-*` without a root, a root file
/// that cannot be read or holds no certificate.
pub(crate) fn connector(
    mode: SslMode,
    root_cert: Option<&str>,
) -> Result<MakeRustlsConnect, String> {
    // ring, explicitly: never the process-wide default provider, which
    // another crate may have set (or left ambiguous).
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = root_cert.map(load_roots).transpose()?;
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot set up rustls: {e}"))?;
    let config = match (mode, roots) {
        (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
            return Err(format!(
                "sslmode={mode} needs sslrootcert=<path of a PEM file with the certificate of \
                 the CA that signed the server's certificate> in the URL (this crate does not \
                 read libpq's default ~/.postgresql/root.crt)"
            ));
        }
        (SslMode::VerifyFull, Some(roots)) => {
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        (_, Some(roots)) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ChainOnly { roots, provider }))
            .with_no_client_auth(),
        (_, None) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified { provider }))
            .with_no_client_auth(),
    };
    Ok(MakeRustlsConnect::new(config))
}

fn load_roots(path: &str) -> Result<RootCertStore, String> {
    if path == "system" {
        return Err(
            "sslrootcert=system (the operating system's roots) is not supported; give the path \
             of a PEM file with the CA certificate(s)"
                .into(),
        );
    }
    let pem = std::fs::read(path).map_err(|e| format!("cannot read sslrootcert {path:?}: {e}"))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| format!("sslrootcert {path:?} is not valid PEM: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("sslrootcert {path:?} holds an unusable certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!(
            "sslrootcert {path:?} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
        ));
    }
    Ok(roots)
}

/// `verify-ca` (and `require` or `prefer` with a root): the chain must lead
/// to a trusted root; the name in the certificate is not checked. The
/// handshake's signatures are checked as always.
#[derive(Debug)]
struct ChainOnly {
    roots: RootCertStore,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `require` (and `prefer`, `allow`) without a root, as libpq: encrypted,
/// but any certificate is accepted, so an active man in the middle is not
/// detected. The handshake's signatures are still checked.
#[derive(Debug)]
struct Unverified {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::{SslMode, connector};

    #[test]
    fn verify_modes_need_a_root() {
        for mode in [SslMode::VerifyCa, SslMode::VerifyFull] {
            let Err(err) = connector(mode, None) else {
                panic!("{mode} without a root must be refused");
            };
            assert!(err.contains("sslrootcert"), "{err}");
        }
        for mode in [SslMode::Allow, SslMode::Prefer, SslMode::Require] {
            assert!(connector(mode, None).is_ok(), "{mode}");
        }
    }

    #[test]
    fn unusable_roots_are_refused() {
        let missing = connector(SslMode::Require, Some("/nonexistent/ca.pem"))
            .err()
            .unwrap();
        assert!(missing.contains("cannot read sslrootcert"), "{missing}");
        let system = connector(SslMode::VerifyFull, Some("system"))
            .err()
            .unwrap();
        assert!(system.contains("not supported"), "{system}");
        let file = std::env::temp_dir().join(format!("outbox-empty-root-{}", std::process::id()));
        std::fs::write(&file, "not a certificate\n").unwrap();
        let empty = connector(SslMode::VerifyCa, file.to_str()).err().unwrap();
        std::fs::remove_file(&file).unwrap();
        assert!(empty.contains("holds no PEM certificate"), "{empty}");
    }
}
