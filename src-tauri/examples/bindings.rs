//! Generates or checks what the UI takes from the Rust code: `ui/src/bindings.ts` (the app's
//! commands, events and views, by tauri-specta), `ui/src/web/proto.ts` (the web companion's
//! wire types) and `ui/src/web/fixtures/views.json` (the views `views.rs` makes of the recorded
//! mirror answers, which the web companion's `views.ts` must make too). A developer's tool, so
//! an example and not a flag of the shipped app: the TypeScript exporter stays out of the app's
//! binary.
//!
//! `cargo run -p waymark-app --example bindings -- write|check [BINDINGS [WIRE]]` (the paths
//! default to the two files above; `scripts/test-app` runs `check`).

use std::path::{Path, PathBuf};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).map(String::as_str).unwrap_or("check");
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = |i: usize, default: &str| {
        args.get(i)
            .map_or_else(|| here.join(default), PathBuf::from)
    };
    let mut failed = false;
    for done in [
        waymark_app::bindings(mode, &path(2, waymark_app::BINDINGS_PATH)),
        waymark_app::wire_types(mode, &path(3, waymark_app::wire::WIRE_PATH)),
        waymark_app::view_cases(
            mode,
            &here.join(waymark_app::view_cases::QUERIES_PATH),
            &here.join(waymark_app::view_cases::VIEW_CASES_PATH),
        ),
    ] {
        match done {
            Ok(msg) => println!("{msg}"),
            Err(msg) => {
                eprintln!("error: {msg}");
                failed = true;
            }
        }
    }
    if failed {
        std::process::exit(1);
    }
}
