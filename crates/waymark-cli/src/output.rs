//! How the CLI ends: a failure carries its exit code (SPEC §10) and a message that says what
//! to do; `--json` turns it into `{"error": {...}}` on stdout.

use std::process::ExitCode;

/// Exit codes of SPEC §10.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// Refused or conflict.
    Refused = 1,
    /// Usage.
    Usage = 2,
    /// Cannot reach the server.
    Unreachable = 3,
}

/// A command that did not succeed.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) exit: Exit,
    pub(crate) code: &'static str,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(exit: Exit, code: &'static str, message: impl Into<String>) -> Self {
        Failure {
            exit,
            code,
            message: message.into(),
        }
    }

    pub(crate) fn report(self, json: bool) -> ExitCode {
        if json {
            println!(
                "{}",
                serde_json::json!({"error": {"code": self.code, "message": self.message}})
            );
        } else {
            eprintln!("error: {}", self.message);
        }
        ExitCode::from(self.exit as u8)
    }
}

pub(crate) type CliResult = Result<(), Failure>;

/// Prints a value as JSON (with `--json`) or as the given text.
pub(crate) fn emit(json: bool, value: &serde_json::Value, text: impl FnOnce() -> String) {
    if json {
        println!("{value}");
    } else {
        println!("{}", text());
    }
}
