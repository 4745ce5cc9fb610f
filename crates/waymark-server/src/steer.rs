//! The host's pairing and device operations (the CLI's `admin` and the tests call them): make a
//! pairing code, list and revoke devices, and the code's normal form, hash and key. Their HTTP
//! routes are `http::devices` and `http::commands`.

pub use crate::admin::{create_pairing, list_devices, revoke_device};
pub use crate::domain::devices::{code_hash, normalize_code, pairing_key};
