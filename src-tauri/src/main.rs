//! The `waymark-app` binary; everything lives in the library so mobile targets share it.
#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

fn main() {
    waymark_app::run();
}
