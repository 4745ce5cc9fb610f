//! Why a companion operation failed: one error for the mirror, the sync engine, the outbox and
//! the keychain, whose messages say what to do.

/// Why a companion operation failed. Messages say what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server cannot be reached (the operation may be queued).
    #[error("cannot reach the server — {0}")]
    Unreachable(String),
    /// The server presented a TLS certificate other than the one pinned when pairing.
    #[error(
        "the server's certificate does not match the one paired ({pinned}); it presented {presented} — nothing was sent. If the server's certificate was replaced on purpose, pair again with a new link from `waymark admin pair`"
    )]
    CertificateMismatch {
        /// The pinned fingerprint (`sha256:<hex>`).
        pinned: String,
        /// What the server presented.
        presented: String,
    },
    /// The server refused (a stable code and its reason).
    #[error("{detail} ({code})")]
    Refused {
        /// The stable code.
        code: String,
        /// Why.
        detail: String,
    },
    /// The server answered something this client does not understand.
    #[error("{0}")]
    Protocol(String),
    /// The event cursor is older than the server keeps; a new snapshot follows.
    #[error("the event cursor expired; re-snapshotting")]
    CursorExpired,
    /// This machine is not paired.
    #[error(
        "this machine is not paired with a server — run `waymark pair LINK` with a link from `waymark admin pair`"
    )]
    NotPaired,
    /// No usable OS keychain.
    #[error(
        "no usable OS keychain ({0}) — start a Secret Service (e.g. gnome-keyring) or use the kernel keyring (`keyctl session`); on a headless host where you accept a key file, set WAYMARK_KEYSTORE=file-insecure"
    )]
    NoKeychain(String),
    /// The device key is missing from the keychain.
    #[error("the device key is not in {0} — pair this machine again with `waymark pair`")]
    NoDeviceKey(String),
    /// The mirror database failed.
    #[error("the local mirror: {0}")]
    Mirror(String),
    /// Not in the mirror.
    #[error("{0}")]
    NotFound(String),
    /// Bad input from the person.
    #[error("{0}")]
    Invalid(String),
    /// A blob is not cached and the server is unreachable.
    #[error(
        "`{0}` is not in the offline cache and the server cannot be reached — it will be fetched when you are back online"
    )]
    BlobMissing(String),
}
