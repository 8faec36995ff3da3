//! Throwaway certificates for TLS tests, made with the `openssl` command
//! (installed by `scripts/dev-services`): a test CA, a server certificate
//! it signed for `localhost` only (no IP address), and a second CA that
//! signed nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The certificate files, in a private directory removed on drop.
#[derive(Debug)]
pub struct TestPki {
    dir: PathBuf,
}

impl TestPki {
    /// Generates the files (EC P-256 keys, valid for two days).
    pub fn generate() -> TestPki {
        let dir = std::env::temp_dir().join(format!(
            "outbox-pki-{}-{}",
            std::process::id(),
            uuid::Uuid::now_v7().simple()
        ));
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let pki = TestPki { dir };
        for (name, subject) in [("ca", "outbox test CA"), ("other-ca", "outbox other CA")] {
            pki.openssl(&[
                "req",
                "-x509",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN={subject}"),
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.crt"),
            ]);
        }
        pki.openssl(&[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ]);
        std::fs::write(
            pki.dir.join("server.ext"),
            "basicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature\n\
             extendedKeyUsage=serverAuth\n\
             subjectAltName=DNS:localhost\n",
        )
        .unwrap_or_else(|e| panic!("cannot write server.ext: {e}"));
        pki.openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ]);
        pki
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run openssl ({e}); install it with scripts/dev-services")
            });
        assert!(
            out.status.success(),
            "openssl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The test CA's certificate (PEM): the right `sslrootcert`.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// A CA that signed nothing here: a wrong `sslrootcert`.
    pub fn other_ca(&self) -> PathBuf {
        self.dir.join("other-ca.crt")
    }

    /// The server's certificate, for `localhost`, signed by [`TestPki::ca`].
    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.crt")
    }

    /// The server's private key.
    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    /// The directory of the files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
