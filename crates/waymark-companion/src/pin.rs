//! Certificate pinning: a server paired with a link carrying `fp=sha256:<hex>` is trusted by
//! the SHA-256 of its leaf certificate alone (a self-signed LAN certificate needs no CA), and
//! any other certificate is refused. The handshake signatures are still verified, so only the
//! holder of the pinned certificate's private key can complete a handshake. Without a pin the
//! client verifies the chain and the name against the public CAs (WebPKI).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};

use crate::Error;

/// Checks a pin's spelling and normalises it: `sha256:` and 64 hex digits, lower case.
pub(crate) fn parse_pin(pin: &str) -> Result<String, Error> {
    let hex = pin.trim().strip_prefix("sha256:").unwrap_or("");
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::Invalid(format!(
            "`{pin}` is not a certificate fingerprint: expected `sha256:` and 64 hex digits"
        )));
    }
    Ok(format!("sha256:{}", hex.to_ascii_lowercase()))
}

/// `sha256:<hex>` of a certificate's DER bytes.
pub(crate) fn fingerprint(der: &[u8]) -> String {
    format!("sha256:{}", waymark_proto::digest::sha256_hex(der))
}

/// The certificate a pinned server presented instead of the pinned one.
#[derive(Debug)]
pub(crate) struct Mismatch {
    pub(crate) pinned: String,
    pub(crate) presented: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the server's certificate does not match the one paired ({}); it presented {}",
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

/// Finds a [`Mismatch`] anywhere in an error's causes.
pub(crate) fn find_mismatch<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a Mismatch> {
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

/// Whether the causes include a certificate that no public CA vouches for.
pub(crate) fn is_unknown_issuer(e: &(dyn std::error::Error + 'static)) -> bool {
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

/// A TLS client config that trusts exactly the certificate with fingerprint `pin`.
pub(crate) fn pinned_config(pin: &str) -> Result<rustls::ClientConfig, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Protocol(format!("cannot set up TLS: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(PinVerifier {
            pin: pin.to_owned(),
            provider,
        }))
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
            assert!(matches!(parse_pin(bad), Err(Error::Invalid(_))), "{bad}");
        }
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
