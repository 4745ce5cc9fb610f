//! TLS for `waymark serve --tls-cert PEM --tls-key PEM`: the certificate chain and key loaded
//! into a rustls server config, and the fingerprint of the leaf certificate that pairing links
//! carry (`fp=sha256:<hex>`), so a device can pin a self-signed LAN certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

pub use waymark_domain::TlsFiles;

/// Why TLS could not be set up. Every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("cannot read the TLS {what} {path}: {reason}")]
    Read {
        /// `certificate` or `key`.
        what: &'static str,
        /// Which file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// No certificate in the file.
    #[error(
        "{0} holds no PEM certificate (`-----BEGIN CERTIFICATE-----`) — pass the server's certificate with `--tls-cert`"
    )]
    NoCertificate(PathBuf),
    /// No private key in the file.
    #[error(
        "{0} holds no PEM private key (`-----BEGIN PRIVATE KEY-----`, PKCS#1 or SEC1) — pass the certificate's key with `--tls-key`"
    )]
    NoKey(PathBuf),
    /// The PEM is damaged.
    #[error("{path} is not valid PEM: {reason}")]
    BadPem {
        /// Which file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The key is not the certificate's.
    #[error(
        "the key {key} does not belong to the certificate {cert} — pass the key that was made with that certificate"
    )]
    KeyMismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// rustls refused the pair otherwise (an unsupported key type, say).
    #[error("cannot serve TLS with {cert} and {key}: {reason}")]
    Unusable {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// Why.
        reason: String,
    },
}

/// `sha256:<hex>` of a certificate's DER bytes: what pairing links pin (and clients compare,
/// through the same function).
pub fn fingerprint(cert_der: &[u8]) -> String {
    waymark_tls_pin::fingerprint(cert_der)
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::Read {
        what,
        path: path.to_owned(),
        reason: e.to_string(),
    })
}

fn bad_pem(path: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::BadPem {
        path: path.to_owned(),
        reason: e.to_string(),
    }
}

/// The certificate chain in a PEM file, leaf first.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read("certificate", path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad_pem(path, e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.to_owned()));
    }
    Ok(certs)
}

/// The fingerprint of the leaf certificate in a PEM file (`waymark admin pair --tls-cert`).
pub fn cert_fingerprint(path: &Path) -> Result<String, TlsError> {
    Ok(fingerprint(load_certs(path)?[0].as_ref()))
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read("key", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::NoKey(path.to_owned()),
        other => bad_pem(path, other),
    })
}

/// A rustls server config over `files` (HTTP/1.1 by ALPN), and the leaf's fingerprint.
pub(crate) fn server_config(
    files: &TlsFiles,
) -> Result<(Arc<rustls::ServerConfig>, String), TlsError> {
    let certs = load_certs(&files.cert)?;
    let key = load_key(&files.key)?;
    let fp = fingerprint(certs[0].as_ref());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let unusable = |reason: String| TlsError::Unusable {
        cert: files.cert.clone(),
        key: files.key.clone(),
        reason,
    };
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| unusable(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
                TlsError::KeyMismatch {
                    cert: files.cert.clone(),
                    key: files.key.clone(),
                }
            }
            other => unusable(other.to_string()),
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((Arc::new(config), fp))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn each_bad_file_is_named_with_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let a = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let b = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let cert = write(dir.path(), "cert.pem", &a.cert.pem());
        let key = write(dir.path(), "key.pem", &a.signing_key.serialize_pem());
        let other_key = write(dir.path(), "other.pem", &b.signing_key.serialize_pem());
        let junk = write(dir.path(), "junk.pem", "not a pem file\n");
        let broken = write(
            dir.path(),
            "broken.pem",
            "-----BEGIN CERTIFICATE-----\n@@@@\n-----END CERTIFICATE-----\n",
        );
        let files = |cert: &Path, key: &Path| TlsFiles {
            cert: cert.to_owned(),
            key: key.to_owned(),
        };

        let (_, fp) = server_config(&files(&cert, &key)).unwrap();
        assert_eq!(fp, fingerprint(a.cert.der()));
        assert_eq!(cert_fingerprint(&cert).unwrap(), fp);
        assert!(fp.starts_with("sha256:") && fp.len() == 7 + 64, "{fp}");

        let missing = dir.path().join("missing.pem");
        let e = server_config(&files(&missing, &key)).unwrap_err();
        assert!(
            matches!(
                e,
                TlsError::Read {
                    what: "certificate",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("missing.pem"), "{e}");
        let e = server_config(&files(&junk, &key)).unwrap_err();
        assert!(matches!(e, TlsError::NoCertificate(_)), "{e}");
        assert!(e.to_string().contains("junk.pem"), "{e}");
        let e = server_config(&files(&broken, &key)).unwrap_err();
        assert!(matches!(e, TlsError::BadPem { .. }), "{e}");
        assert!(e.to_string().contains("broken.pem"), "{e}");
        let e = server_config(&files(&cert, &cert)).unwrap_err();
        assert!(matches!(e, TlsError::NoKey(_)), "{e}");
        assert!(e.to_string().contains("cert.pem"), "{e}");
        let e = server_config(&files(&cert, &other_key)).unwrap_err();
        assert!(matches!(e, TlsError::KeyMismatch { .. }), "{e}");
        assert!(
            e.to_string().contains("other.pem") && e.to_string().contains("cert.pem"),
            "{e}"
        );
    }
}
