//! Pairing: paste a `waymark://pair` link (or a server URL and a code), and the device list,
//! the escalation policy and the delegates (who else answers this user's decisions).

use tauri::{AppHandle, State};

use crate::error::{AppError, AppResult};
use crate::state::{AppState, Mode};
use crate::views::{DelegatesView, DeviceView, EscalationPolicyView, StatusView};

/// Pairs this app with a server; the device key goes to the OS keychain.
#[tauri::command]
#[specta::specta]
pub async fn pair_device(
    app: AppHandle,
    s: State<'_, AppState>,
    link: String,
    code: Option<String>,
    name: Option<String>,
) -> AppResult<StatusView> {
    let link = match code.filter(|c| !c.trim().is_empty()) {
        Some(code) => waymark_companion::PairingLink {
            server: link.trim().to_owned(),
            code: code.trim().to_owned(),
            pin: None,
        },
        None => waymark_companion::parse_pairing_link(&link)?,
    };
    let before = s.companion.identity().await?;
    let name = name
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| "Waymark app".into());
    let id = s.companion.pair_link(&link, &name).await?;
    // A mirror holds one server's threads: after pairing elsewhere, start it afresh (the
    // outbox and the blob cache stay).
    if before.is_some_and(|b| b.server != id.server) {
        s.companion.mirror().replace_all(0, &[]).await?;
    }
    s.companion.mirror().set_meta("app.mode", "remote").await?;
    s.set_mode(Mode::Remote);
    s.repaired.notify_one();
    crate::events::nudge(&app);
    Ok(s.status().await?)
}

/// Devices: every device of the embedded control plane, or this device when remote (a device
/// cannot list its server's devices; `waymark admin device list` on the host can).
#[tauri::command]
#[specta::specta]
pub async fn list_devices(s: State<'_, AppState>) -> AppResult<Vec<DeviceView>> {
    let me = s.companion.identity().await?;
    let this = me.as_ref().map(|i| i.device_id.clone()).unwrap_or_default();
    if s.mode() == Mode::Embedded
        && let Some(e) = s.embedded.lock().await.as_ref()
    {
        return Ok(e
            .devices()
            .await?
            .into_iter()
            .map(|d| DeviceView::of(d, &this))
            .collect());
    }
    let me = me.ok_or_else(|| AppError::from(waymark_companion::Error::NotPaired))?;
    // The server lists the user's devices with when each was last heard from; offline, this
    // one alone.
    match s.companion.devices().await {
        Ok(list) => return Ok(list.into_iter().map(|d| DeviceView::of(d, &this)).collect()),
        Err(e) => tracing::info!(error = %e, "listing the devices from the server"),
    }
    Ok(vec![DeviceView {
        id: me.device_id,
        user: me.user,
        name: "this app".into(),
        scopes: me.scopes,
        this_device: true,
        created_at: None,
        revoked_at: None,
        last_seen_at: None,
        stale: false,
    }])
}

/// This user's escalation policy (who is notified of a decision, in what order; quiet hours),
/// or none: every device is notified at once.
#[tauri::command]
#[specta::specta]
pub async fn get_escalation(s: State<'_, AppState>) -> AppResult<Option<EscalationPolicyView>> {
    Ok(s.companion.escalation().await?.map(Into::into))
}

/// Sets this user's escalation policy (the server checks its devices, waits and quiet hours);
/// none removes it.
#[tauri::command]
#[specta::specta]
pub async fn set_escalation(
    s: State<'_, AppState>,
    policy: Option<EscalationPolicyView>,
) -> AppResult<Option<EscalationPolicyView>> {
    let policy = policy.map(waymark_proto::EscalationPolicy::from);
    Ok(s.companion
        .set_escalation(policy.as_ref())
        .await?
        .map(Into::into))
}

/// Who may answer this user's decisions, and whose this user may answer.
#[tauri::command]
#[specta::specta]
pub async fn get_delegates(s: State<'_, AppState>) -> AppResult<DelegatesView> {
    Ok(s.companion.delegates().await?.into())
}

/// Offers `user` to read this user's tasks and answer their decisions once they accept
/// (`add`), or ends it.
#[tauri::command]
#[specta::specta]
pub async fn set_delegate(
    s: State<'_, AppState>,
    user: String,
    add: bool,
) -> AppResult<DelegatesView> {
    Ok(s.companion.set_delegate(user.trim(), add).await?.into())
}

/// This user (the delegate) accepts `owner`'s offer (`accept`: the mirror takes a fresh
/// snapshot with their tasks, and the UI is told), or declines it — or leaves a delegation
/// accepted before.
#[tauri::command]
#[specta::specta]
pub async fn answer_delegation(
    app: AppHandle,
    s: State<'_, AppState>,
    owner: String,
    accept: bool,
) -> AppResult<DelegatesView> {
    let owner = owner.trim();
    let d = match accept {
        true => s.companion.accept_delegation(owner).await?,
        false => s.companion.decline_delegation(owner).await?,
    };
    crate::events::nudge(&app);
    Ok(d.into())
}
