//! The tray icon: how many decisions wait (in the title and tooltip, and in the first menu
//! entry, because some tray hosts show neither), and a menu — open the inbox, mute
//! notifications for an hour, quit. Desktop only; on mobile these are no-ops.

use tauri::AppHandle;

#[cfg(desktop)]
mod desktop {
    use tauri::menu::{Menu, MenuItem, PredefinedMenuItem};
    use tauri::tray::TrayIconBuilder;
    use tauri::{AppHandle, Manager, Wry};

    use crate::state::AppState;

    const TRAY: &str = "waymark";

    /// The entries whose text changes.
    pub(super) struct Items {
        pub(super) open: MenuItem<Wry>,
        pub(super) mute: MenuItem<Wry>,
    }

    pub(super) fn build(app: &AppHandle) -> tauri::Result<()> {
        let open = MenuItem::with_id(app, "open_inbox", "Open inbox", true, None::<&str>)?;
        let mute = MenuItem::with_id(
            app,
            "mute",
            "Mute notifications for an hour",
            true,
            None::<&str>,
        )?;
        let quit = MenuItem::with_id(app, "quit", "Quit Waymark", true, None::<&str>)?;
        let sep = PredefinedMenuItem::separator(app)?;
        let menu = Menu::with_items(app, &[&open, &mute, &sep, &quit])?;
        let mut tray = TrayIconBuilder::with_id(TRAY)
            .menu(&menu)
            .tooltip("Waymark")
            .on_menu_event(|app, ev| match ev.id.as_ref() {
                "open_inbox" => crate::events::navigate(app, "/inbox", None),
                "mute" => {
                    let shared = app.state::<AppState>();
                    shared.mute_for(if shared.muted() { 0 } else { 60 });
                    crate::events::nudge(app);
                    let shared = shared.inner().clone();
                    let app = app.clone();
                    tauri::async_runtime::spawn(async move {
                        let n = shared
                            .companion
                            .mirror()
                            .inbox()
                            .await
                            .map(|i| i.len())
                            .unwrap_or(0);
                        super::update(&app, n, shared.muted());
                    });
                }
                "quit" => app.exit(0),
                _ => {}
            });
        if let Some(icon) = app.default_window_icon() {
            tray = tray.icon(icon.clone());
        }
        tray.build(app)?;
        app.manage(Items { open, mute });
        Ok(())
    }

    pub(super) fn update(app: &AppHandle, pending: usize, muted: bool) {
        if let Some(tray) = app.tray_by_id(TRAY) {
            let label = (pending > 0).then(|| pending.to_string());
            let _ = tray.set_title(label.as_deref());
            let _ = tray.set_tooltip(Some(match pending {
                0 => "Waymark — nothing waits for you".to_owned(),
                1 => "Waymark — 1 decision waits".to_owned(),
                n => format!("Waymark — {n} decisions wait"),
            }));
        }
        if let Some(items) = app.try_state::<Items>() {
            let _ = items.open.set_text(match pending {
                0 => "Open inbox".to_owned(),
                n => format!("Open inbox ({n} waiting)"),
            });
            let _ = items.mute.set_text(if muted {
                "Unmute notifications"
            } else {
                "Mute notifications for an hour"
            });
        }
    }
}

/// Builds the tray icon and its menu.
pub fn build(app: &AppHandle) -> tauri::Result<()> {
    #[cfg(desktop)]
    return desktop::build(app);
    #[cfg(not(desktop))]
    {
        let _ = app;
        Ok(())
    }
}

/// Shows the number of decisions waiting and the mute state.
pub fn update(app: &AppHandle, pending: usize, muted: bool) {
    #[cfg(desktop)]
    desktop::update(app, pending, muted);
    #[cfg(not(desktop))]
    let _ = (app, pending, muted);
}
