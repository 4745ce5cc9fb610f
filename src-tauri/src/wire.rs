//! The web companion's wire types: `waymark-proto`'s objects exactly as the control plane
//! serialises them, generated into `ui/src/web/proto.ts` (`ui/src/web/wire.ts` re-exports
//! them) beside `ui/src/bindings.ts` and checked with it (`examples/bindings.rs`).
//!
//! A file of its own because the two are read in different directions. The app's bindings
//! describe both directions of its IPC in one shape (tauri-specta's unified serde mode: a
//! `#[serde(default)]` field may be absent, a skipped `Option` may be `null`); the web
//! companion only ever reads what the server sent, or signs what the Rust companion would
//! send, and that is serde's *serialize* shape: a `#[serde(default)]` field is always there,
//! an `Option` skipped when `None` is absent, never `null`. So this file holds only those
//! shapes, each under the Rust type's name.

use std::borrow::Cow;
use std::collections::HashSet;

use specta::datatype::{DataType, Primitive};
use specta::{Format, FormatError, Type, Types};

/// The header of the generated file.
pub const WIRE_HEADER: &str = "// Generated from waymark-proto by src-tauri (`cargo run -p waymark-app --example bindings -- write`) — do not edit.\n// The control plane's wire objects as it serialises them; `scripts/test-app` fails when this file drifts.";

/// Where the web companion's wire types live, from the app crate's directory.
pub const WIRE_PATH: &str = "../ui/src/web/proto.ts";

/// What the web companion reads over HTTP (snapshots, thread details, events and the objects
/// they carry, command results and acknowledgements, devices and their sessions, receipts
/// recorded, the escalation policy, delegates, machines, rules, health, the VAPID key), what
/// it sends in the Rust companion's shape (the steer command it signs, receipts), and what a
/// rule reads of an intent (`ui/src/rules.ts`, the twin of `intent_facts`). The objects these
/// hold come with them.
fn wire_types() -> Types {
    use waymark_proto as p;
    Types::default()
        .register::<p::Snapshot>()
        .register::<p::TaskDetail>()
        .register::<p::Event>()
        .register::<p::EventKind>()
        .register::<p::CommandResult>()
        .register::<p::CommandAck>()
        .register::<p::DeviceDelivery>()
        .register::<p::Device>()
        .register::<p::DeviceSession>()
        .register::<p::PostReceipts>()
        .register::<p::ReceiptsRecorded>()
        .register::<p::EscalationPolicy>()
        .register::<p::Delegates>()
        .register::<p::MachineList>()
        .register::<p::RuleList>()
        .register::<p::Health>()
        .register::<p::VapidKey>()
        .register::<p::SteerCommand>()
        .register::<p::Signature>()
        .register::<p::CallFacts>()
}

/// The wire types as they would be written now.
pub fn render_wire() -> Result<String, String> {
    specta_typescript::Typescript::default()
        .header(WIRE_HEADER)
        .export(&wire_types(), Sent::new())
        .map_err(|e| format!("cannot generate the wire types: {e}"))
}

/// serde's serialize shapes under the Rust names, with 64-bit integers as `number` (as the
/// app's bindings have them: every sequence, fence and cursor stays below 2^53, SPEC §9).
struct Sent {
    numbers: specta_util::Remapper,
}

impl Sent {
    fn new() -> Self {
        let number = <specta_typescript::Number as Type>::definition(&mut Types::default());
        let numbers = [
            Primitive::usize,
            Primitive::isize,
            Primitive::u64,
            Primitive::i64,
        ]
        .into_iter()
        .fold(specta_util::Remapper::new(), |r, p| {
            r.rule(DataType::Primitive(p), number.clone())
        });
        Sent { numbers }
    }
}

impl Format for Sent {
    fn map_types(&'_ self, types: &Types) -> Result<Cow<'_, Types>, FormatError> {
        // The phases format splits every type whose two directions differ into
        // `X_Serialize` and `X_Deserialize` and makes `X` their union; keep the first,
        // named `X`, and leave the other two out (`ty: None` is not exported). Types that do
        // not differ keep their one shape.
        let phased = specta_serde::PhasesFormat.map_types(types)?.into_owned();
        let split: HashSet<String> = phased
            .into_unsorted_iter()
            .filter_map(|t| t.name.strip_suffix("_Serialize").map(str::to_owned))
            .collect();
        let sent = phased.map(|mut t| {
            if t.name.ends_with("_Deserialize") || split.contains(t.name.as_ref()) {
                t.ty = None;
            } else if let Some(name) = t.name.strip_suffix("_Serialize") {
                t.name = Cow::Owned(name.to_owned());
            }
            t
        });
        Ok(Cow::Owned(self.numbers.remap_types(sent)))
    }

    fn map_type(&'_ self, types: &Types, dt: &DataType) -> Result<Cow<'_, DataType>, FormatError> {
        let dt = specta_serde::PhasesFormat.map_type(types, dt)?;
        Ok(Cow::Owned(self.numbers.remap_dt(dt.into_owned())))
    }
}
