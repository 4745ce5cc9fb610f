//! Tauri's build step: reads `tauri.conf.json`, embeds the capability files and checks that
//! `frontendDist` (`ui/dist`, built by `scripts/build-ui`) exists.
fn main() {
    tauri_build::build()
}
