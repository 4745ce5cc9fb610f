//! Identifiers: a short type prefix and a UUIDv7, so ids sort by creation time and say what
//! they name when they show up in a log.

use uuid::Uuid;

fn new(prefix: &str) -> String {
    format!("{prefix}_{}", Uuid::now_v7().simple())
}

macro_rules! id_fns {
    ($($name:ident => $prefix:literal),* $(,)?) => {
        $(
            #[doc = concat!("A fresh `", $prefix, "_…` id.")]
            pub fn $name() -> String { new($prefix) }
        )*
    };
}

id_fns! {
    task => "task",
    attempt => "att",
    session => "ses",
    effect => "eff",
    decision => "dec",
    artifact => "art",
    receipt => "rcpt",
    user => "usr",
    token => "tok",
    followup => "fup",
    push => "push",
    device => "dev",
    machine => "mch",
    work => "wrk",
    rule => "rul",
}

/// A fresh UUIDv7 in its hyphenated form, as command ids use.
pub fn command() -> String {
    Uuid::now_v7().to_string()
}
