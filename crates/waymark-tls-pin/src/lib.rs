//! Certificate pinning: a server is trusted by the SHA-256 of its leaf certificate alone
//! (`sha256:<hex>`, the `fp=` of a pairing link; a self-signed LAN certificate needs no CA),
//! and any other certificate is refused before a byte of a request is sent. The handshake
//! signatures are still verified, so only the holder of the pinned certificate's private key
//! can complete a handshake.
//!
//! One verifier for every client of the control plane: the companion (pinned by its pairing
//! link) and the worker SDK (pinned by configuration) both build their TLS config here, and
//! the server computes the fingerprint it advertises with [`fingerprint`].

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};

/// The environment variable that pins the control plane's TLS certificate by its fingerprint
/// (`sha256:<hex>`, as `waymark serve` prints it): read by the worker SDK's
/// `ClientBuilder::pin_from_env` and by the `waymark` commands that run workers (`--server-fp`).
pub const SERVER_FP_ENV: &str = "WAYMARK_SERVER_FP";

/// Why a pin cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinError {
    /// Not `sha256:` and 64 hex digits.
    #[error("`{0}` is not a certificate fingerprint: expected `sha256:` and 64 hex digits")]
    NotAFingerprint(String),
    /// rustls refused the configuration.
    #[error("cannot set up TLS: {0}")]
    Tls(String),
}

/// Checks a pin's spelling and normalises it: `sha256:` and 64 hex digits, lower case.
pub fn parse_pin(pin: &str) -> Result<String, PinError> {
    let hex = pin.trim().strip_prefix("sha256:").unwrap_or("");
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(PinError::NotAFingerprint(pin.to_owned()));
    }
    Ok(format!("sha256:{}", hex.to_ascii_lowercase()))
}

/// `sha256:<hex>` of a certificate's DER bytes: what pins name.
pub fn fingerprint(der: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(der)))
}

/// The certificate a pinned server presented instead of the pinned one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The pin (`sha256:<hex>`).
    pub pinned: String,
    /// The fingerprint of the certificate presented.
    pub presented: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the server's certificate does not match the one pinned ({}); it presented {}",
            self.pinned, self.presented
        )
    }
}

impl std::error::Error for Mismatch {}

/// The first of an error's causes (reqwest → hyper → io → rustls) for which `f` says `Some`.
fn find_cause<'a, T>(
    e: &'a (dyn std::error::Error + 'static),
    f: &impl Fn(&'a (dyn std::error::Error + 'static)) -> Option<T>,
) -> Option<T> {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(t) = f(err) {
            return Some(t);
        }
        // `io::Error::source` skips the error it wraps; look inside.
        if let Some(inner) = err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            && let Some(t) = find_cause(inner, f)
        {
            return Some(t);
        }
        cur = err.source();
    }
    None
}

/// Finds a [`Mismatch`] anywhere in an error's causes (an HTTP client's connect error wraps
/// it several layers down).
pub fn find_mismatch<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Mismatch> {
    find_cause(e, &|err| {
        if let Some(m) = err.downcast_ref::<Mismatch>() {
            return Some(m);
        }
        match err.downcast_ref::<rustls::Error>() {
            Some(rustls::Error::InvalidCertificate(CertificateError::Other(other))) => {
                other.0.downcast_ref::<Mismatch>()
            }
            _ => None,
        }
    })
}

/// Whether the causes include a certificate that no public CA vouches for (a self-signed
/// server reached without a pin).
pub fn is_unknown_issuer(e: &(dyn std::error::Error + 'static)) -> bool {
    find_cause(e, &|err| {
        matches!(
            err.downcast_ref::<rustls::Error>(),
            Some(rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer
            ))
        )
        .then_some(())
    })
    .is_some()
}

#[derive(Debug)]
struct PinVerifier {
    pin: String,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for PinVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let presented = fingerprint(end_entity.as_ref());
        if presented == self.pin {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(CertificateError::Other(
                rustls::OtherError(Arc::new(Mismatch {
                    pinned: self.pin.clone(),
                    presented,
                })),
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
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
        rustls::crypto::verify_tls13_signature(
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

/// A TLS client config that trusts exactly the certificate with fingerprint `pin` (any
/// spelling [`parse_pin`] takes), for `reqwest::ClientBuilder::use_preconfigured_tls`.
pub fn client_config(pin: &str) -> Result<rustls::ClientConfig, PinError> {
    let pin = parse_pin(pin)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| PinError::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinVerifier { pin, provider }))
        .with_no_client_auth();
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_are_sha256_and_64_hex_digits() {
        let hex = "AB".repeat(32);
        assert_eq!(
            parse_pin(&format!("sha256:{hex}")).unwrap(),
            format!("sha256:{}", hex.to_lowercase())
        );
        for bad in [
            "",
            "sha256:",
            &format!("sha1:{hex}"),
            &format!("sha256:{}", &hex[1..]),
            &format!("sha256:{}zz", &hex[2..]),
        ] {
            assert_eq!(
                parse_pin(bad),
                Err(PinError::NotAFingerprint(bad.to_owned())),
                "{bad}"
            );
            assert!(client_config(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_fingerprint_is_the_sha256_of_the_der_bytes() {
        assert_eq!(
            fingerprint(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(parse_pin(&fingerprint(b"x")).unwrap(), fingerprint(b"x"));
    }

    /// The verifier itself: the pinned certificate passes, any other is refused with a
    /// [`Mismatch`] naming both.
    #[test]
    fn only_the_pinned_certificate_verifies() {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let a = CertificateDer::from(b"certificate a".to_vec());
        let b = CertificateDer::from(b"certificate b".to_vec());
        let v = PinVerifier {
            pin: fingerprint(a.as_ref()),
            provider,
        };
        let name = ServerName::try_from("localhost").unwrap();
        assert!(
            v.verify_server_cert(&a, &[], &name, &[], UnixTime::now())
                .is_ok()
        );
        let e = v
            .verify_server_cert(&b, &[], &name, &[], UnixTime::now())
            .unwrap_err();
        let m = find_mismatch(&e).expect("a mismatch");
        assert_eq!(m.pinned, fingerprint(a.as_ref()));
        assert_eq!(m.presented, fingerprint(b.as_ref()));
    }

    #[test]
    fn a_mismatch_is_found_through_the_io_error_that_wraps_it() {
        let m = Mismatch {
            pinned: "sha256:aa".into(),
            presented: "sha256:bb".into(),
        };
        let tls = rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(
            Arc::new(m),
        )));
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        let found = find_mismatch(&io).expect("found");
        assert_eq!(found.presented, "sha256:bb");
        let plain = std::io::Error::other("connection refused");
        assert!(find_mismatch(&plain).is_none());
        assert!(!is_unknown_issuer(&plain));
        let unknown = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
        );
        assert!(is_unknown_issuer(&unknown));
        assert!(find_mismatch(&unknown).is_none());
    }
}
