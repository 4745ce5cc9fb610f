//! Who a rule acts for: the caller a request authenticated as (admin, worker or device), whose
//! tasks it sees, and the secrets its credentials are. No HTTP here: `auth` reads a caller
//! from a request's headers, the rules take it as a value.

use base64::Engine;
use rand::RngCore;
use waymark_proto::{ErrorCode, digest::sha256_hex};

use crate::error::ApiError;

/// The kind of credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallerKind {
    /// Whoever runs the host: sees and resolves everything.
    Admin,
    /// An agent or adapter, acting for its user.
    Worker,
    /// A paired device with a read session: reads its user's tasks; steers only with signed
    /// commands.
    Device,
}

/// An authenticated caller.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Admin or worker.
    pub kind: CallerKind,
    /// The credential's name (the worker's name).
    pub name: String,
    /// The user it acts for; tasks it creates belong to this user.
    pub user_id: String,
    /// The credential, as limits count it: `token:<id>` or `device:<id>`.
    pub credential: String,
    /// Whose tasks it sees: its user first, then (a device) the owners who delegated their
    /// decisions to that user and whose delegation that user accepted, as the store said when
    /// the request was authenticated.
    pub owners: Vec<String>,
    /// When a device's read session ends (unix ms); `None` for tokens. A stream it opened ends
    /// then too.
    pub session_expires_at: Option<i64>,
    /// A runner's token: the machine it speaks for. It reaches only that machine's tasks (the
    /// ones it creates are that machine's), and the runner routes of that machine.
    pub machine: Option<String>,
}

impl Caller {
    /// The credential its streams count against (`None`: the admin, counted only in all).
    pub fn stream_credential(&self) -> Option<&str> {
        (self.kind != CallerKind::Admin).then_some(&*self.credential)
    }

    /// `None` for the admin (sees every owner), else the users whose tasks are visible: its
    /// own, and for a device those delegated to its user.
    pub fn owner_filter(&self) -> Option<&[String]> {
        match self.kind {
            CallerKind::Admin => None,
            CallerKind::Worker | CallerKind::Device => Some(&self.owners),
        }
    }

    /// Whether this caller may see a task of `owner_id`. Only a device sees others' tasks
    /// (delegated to it), and a device writes only through signed commands, which check the
    /// delegation's limits themselves; a worker sees and writes its own user's.
    pub fn may_access(&self, owner_id: &str) -> bool {
        self.kind == CallerKind::Admin || self.owners.iter().any(|o| o == owner_id)
    }

    /// Whether this caller may see `task`: its owner's, and for a runner only its machine's.
    pub fn may_access_task(&self, task: &waymark_store::TaskRow) -> bool {
        self.may_access(&task.owner_id)
            && self
                .machine
                .as_ref()
                .is_none_or(|m| task.machine_id.as_ref() == Some(m))
    }

    /// Refuses a runner's token where it would read beyond its machine's tasks (the event
    /// stream and blobs span every task of its user).
    pub fn not_a_runner(&self, what: &str) -> Result<(), ApiError> {
        match &self.machine {
            Some(_) => Err(ApiError::new(
                ErrorCode::Forbidden,
                format!(
                    "a runner's token reaches only its machine's tasks, not {what}; the runner reads its work at `/v1/runner/work`"
                ),
            )),
            None => Ok(()),
        }
    }

    /// How the audit log names this caller.
    pub fn actor(&self) -> String {
        match self.kind {
            CallerKind::Admin => "admin".to_owned(),
            CallerKind::Worker => format!("worker:{}", self.name),
            CallerKind::Device => format!("device:{}", self.name),
        }
    }
}

/// A fresh secret with a readable prefix (`wmk_a_…` admin, `wmk_w_…` worker).
pub fn new_secret(kind: CallerKind) -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let tag = match kind {
        CallerKind::Admin => "a",
        CallerKind::Worker => "w",
        CallerKind::Device => "s",
    };
    format!(
        "wmk_{tag}_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// What the store keeps of a secret.
pub fn secret_hash(secret: &str) -> String {
    sha256_hex(secret.as_bytes())
}

/// A user's own id, then the owners who delegated their decisions to them — delegations they
/// accepted only: an offer not yet answered shows them nothing.
pub async fn visible_owners(
    tx: &mut dyn waymark_store::StoreTx,
    user_id: &str,
) -> Result<Vec<String>, waymark_store::StoreError> {
    let mut owners = vec![user_id.to_owned()];
    owners.extend(
        tx.delegations(None, Some(user_id))
            .await?
            .into_iter()
            .filter(waymark_store::DelegationRow::accepted)
            .map(|d| d.owner_id),
    );
    Ok(owners)
}
