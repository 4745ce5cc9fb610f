//! Device keys in the OS keychain. The Ed25519 private key is generated on the device and kept
//! by the platform's credential store through the keyring project's crates (Secret Service on
//! Linux desktops, the kernel keyring where no Secret Service runs); it is never written to
//! disk in plain text unless the owner of a headless host opts in explicitly.

use std::path::PathBuf;
use std::sync::Arc;

use ed25519_dalek::SigningKey;
use keyring_core::{CredentialStore, Entry};

use crate::error::Error;

const SERVICE: &str = "waymark-device";

/// Which credential store holds the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The freedesktop Secret Service (gnome-keyring, KWallet, KeePassXC).
    SecretService,
    /// The Linux kernel keyring (session keyring).
    KernelKeyring,
    /// A 0600 file in the companion's home — only with `WAYMARK_KEYSTORE=file-insecure`.
    InsecureFile,
}

impl Backend {
    /// For people.
    pub fn describe(self) -> &'static str {
        match self {
            Backend::SecretService => "the Secret Service keychain",
            Backend::KernelKeyring => "the kernel keyring",
            Backend::InsecureFile => "a plain file (WAYMARK_KEYSTORE=file-insecure)",
        }
    }
}

/// Where device keys live.
pub struct Keystore {
    backend: Backend,
    store: Option<Arc<CredentialStore>>,
    dir: PathBuf,
}

fn usable(store: &Arc<CredentialStore>) -> Result<(), String> {
    let entry = Entry::new_in_store(store, SERVICE, "probe").map_err(|e| e.to_string())?;
    match entry.get_secret() {
        Ok(_) | Err(keyring_core::Error::NoEntry) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

fn secret_service() -> Result<Arc<CredentialStore>, String> {
    let store: Arc<CredentialStore> =
        zbus_secret_service_keyring_store::Store::new().map_err(|e| e.to_string())?;
    usable(&store)?;
    Ok(store)
}

fn kernel_keyring() -> Result<Arc<CredentialStore>, String> {
    let store: Arc<CredentialStore> =
        linux_keyutils_keyring_store::Store::new().map_err(|e| e.to_string())?;
    usable(&store)?;
    Ok(store)
}

impl Keystore {
    /// Picks the credential store: `WAYMARK_KEYSTORE` (`secret-service`, `keyutils`,
    /// `file-insecure`) or, by default, the Secret Service, then the kernel keyring.
    pub fn open(home: &std::path::Path) -> Result<Self, Error> {
        Self::open_with(home, &std::env::var("WAYMARK_KEYSTORE").unwrap_or_default())
    }

    /// Opens a named credential store (`secret-service`, `keyutils`, `file-insecure`, or `""`
    /// for the default order).
    pub fn open_with(home: &std::path::Path, choice: &str) -> Result<Self, Error> {
        let dir = home.to_path_buf();
        let pick = |backend, r: Result<Arc<CredentialStore>, String>| {
            r.map(|s| Keystore {
                backend,
                store: Some(s),
                dir: dir.clone(),
            })
        };
        match choice {
            "secret-service" => pick(Backend::SecretService, secret_service())
                .map_err(|e| Error::NoKeychain(format!("the Secret Service is not usable: {e}"))),
            "keyutils" => pick(Backend::KernelKeyring, kernel_keyring())
                .map_err(|e| Error::NoKeychain(format!("the kernel keyring is not usable: {e}"))),
            "file-insecure" => Ok(Keystore {
                backend: Backend::InsecureFile,
                store: None,
                dir,
            }),
            "" => {
                let ss = secret_service();
                if let Ok(s) = ss {
                    return Ok(Keystore {
                        backend: Backend::SecretService,
                        store: Some(s),
                        dir,
                    });
                }
                let kk = kernel_keyring();
                if let Ok(s) = kk {
                    return Ok(Keystore {
                        backend: Backend::KernelKeyring,
                        store: Some(s),
                        dir,
                    });
                }
                Err(Error::NoKeychain(format!(
                    "Secret Service: {}; kernel keyring: {}",
                    ss.err().unwrap_or_default(),
                    kk.err().unwrap_or_default()
                )))
            }
            other => Err(Error::NoKeychain(format!(
                "unknown WAYMARK_KEYSTORE `{other}`: use `secret-service`, `keyutils` or `file-insecure`"
            ))),
        }
    }

    /// The store in use.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    fn file(&self, device_id: &str) -> PathBuf {
        self.dir.join(format!("{device_id}.key"))
    }

    /// Keeps a device's private key.
    pub fn save(&self, device_id: &str, key: &SigningKey) -> Result<(), Error> {
        match &self.store {
            Some(store) => Entry::new_in_store(store, SERVICE, device_id)
                .and_then(|e| e.set_secret(&key.to_bytes()))
                .map_err(|e| {
                    Error::NoKeychain(format!(
                        "saving the device key in {}: {e}",
                        self.backend.describe()
                    ))
                }),
            None => write_private(&self.file(device_id), &key.to_bytes())
                .map_err(|e| Error::NoKeychain(format!("saving the device key file: {e}"))),
        }
    }

    /// A device's private key.
    pub fn load(&self, device_id: &str) -> Result<SigningKey, Error> {
        let bytes = match &self.store {
            Some(store) => Entry::new_in_store(store, SERVICE, device_id)
                .and_then(|e| e.get_secret())
                .map_err(|e| match e {
                    keyring_core::Error::NoEntry => {
                        Error::NoDeviceKey(self.backend.describe().into())
                    }
                    other => Error::NoKeychain(format!(
                        "reading the device key from {}: {other}",
                        self.backend.describe()
                    )),
                })?,
            None => std::fs::read(self.file(device_id))
                .map_err(|_| Error::NoDeviceKey(self.backend.describe().into()))?,
        };
        let seed: [u8; 32] = bytes
            .try_into()
            .map_err(|_| Error::NoKeychain("the stored device key is malformed".into()))?;
        Ok(SigningKey::from_bytes(&seed))
    }

    /// Forgets a device's private key.
    pub fn delete(&self, device_id: &str) -> Result<(), Error> {
        match &self.store {
            Some(store) => match Entry::new_in_store(store, SERVICE, device_id)
                .and_then(|e| e.delete_credential())
            {
                Ok(()) | Err(keyring_core::Error::NoEntry) => Ok(()),
                Err(e) => Err(Error::NoKeychain(e.to_string())),
            },
            None => match std::fs::remove_file(self.file(device_id)) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(Error::NoKeychain(e.to_string())),
            },
        }
    }
}

fn write_private(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}
