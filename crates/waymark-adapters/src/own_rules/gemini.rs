//! Gemini CLI's own rules (filled in below).

use std::path::PathBuf;

use waymark_proto::RuntimeRule;

use super::Places;

pub(super) fn read(_places: &Places, _projects: &[PathBuf], _out: &mut Vec<RuntimeRule>) {}
