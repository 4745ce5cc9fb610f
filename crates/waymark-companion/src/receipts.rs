//! Proof of delivery from this device: it tells the server how far each decision has reached
//! it — fetched into the mirror, shown in a notification, opened by the person — so whoever
//! waits on a decision can tell "the phone has it and nobody looked" from "it never arrived".
//! Steps the mirror already shows recorded for this device are not sent again. Also the
//! user's devices, escalation policy and delegates: who is notified of a decision, in what
//! order, and who else may answer it.

use waymark_proto::*;

use crate::api::Api;
use crate::companion::Companion;
use crate::error::Error;

impl Companion {
    /// Tells the server that these decisions reached `step` (`fetched`, `shown`, `opened`) on
    /// this device; returns how many steps were new to the server.
    pub async fn report_receipts(
        &self,
        decision_ids: &[String],
        step: DeliveryStep,
    ) -> Result<usize, Error> {
        let (id, api) = self.require_identity().await?;
        let mut decisions = Vec::with_capacity(decision_ids.len());
        for d in decision_ids {
            decisions.extend(self.mirror.decision(d).await?);
        }
        let token = self.token(&id, &api).await?;
        post_receipts(&api, &token, &id.device_id, &decisions, step).await
    }

    /// This user's devices as the server knows them: when each was last heard from, and
    /// whether it is stale.
    pub async fn devices(&self) -> Result<Vec<Device>, Error> {
        let (id, api) = self.require_identity().await?;
        let token = self.token(&id, &api).await?;
        api.get(&token, "/v1/devices").await
    }

    /// This user's machines with a runner: online or since when offline, their runtimes and
    /// the directories runs may use there.
    pub async fn machines(&self) -> Result<MachineList, Error> {
        let (id, api) = self.require_identity().await?;
        let token = self.token(&id, &api).await?;
        api.get(&token, "/v1/machines").await
    }

    /// This user's escalation policy, or `None` when there is none (every device is notified
    /// at once).
    pub async fn escalation(&self) -> Result<Option<EscalationPolicy>, Error> {
        let (id, api) = self.require_identity().await?;
        let token = self.token(&id, &api).await?;
        match api.get(&token, "/v1/escalation").await {
            Ok(p) => Ok(Some(p)),
            Err(Error::Refused { code, .. }) if code == "not_found" => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Sets this user's escalation policy (checked by the server: its devices, waits, quiet
    /// hours); `None` removes it.
    pub async fn set_escalation(
        &self,
        policy: Option<&EscalationPolicy>,
    ) -> Result<Option<EscalationPolicy>, Error> {
        let (id, api) = self.require_identity().await?;
        let token = self.token(&id, &api).await?;
        match policy {
            Some(p) => api.put(&token, "/v1/escalation", p).await.map(Some),
            None => match api.delete(&token, "/v1/escalation").await {
                Ok(()) => Ok(None),
                Err(Error::Refused { code, .. }) if code == "not_found" => Ok(None),
                Err(e) => Err(e),
            },
        }
    }

    /// Who may answer this user's decisions, and whose this user may answer.
    pub async fn delegates(&self) -> Result<Delegates, Error> {
        let (id, api) = self.require_identity().await?;
        let token = self.token(&id, &api).await?;
        api.get(&token, "/v1/delegates").await
    }

    /// Offers `user` to read this user's tasks and answer their decisions once they accept
    /// (`add`), or ends it (an offer not yet accepted is taken back).
    pub async fn set_delegate(&self, user: &str, add: bool) -> Result<Delegates, Error> {
        let (id, api) = self.require_identity().await?;
        let token = self.token(&id, &api).await?;
        let path = format!("/v1/delegates/{}", path_segment(user));
        if add {
            api.put(&token, &path, &serde_json::Value::Null).await
        } else {
            api.delete(&token, &path).await?;
            api.get(&token, "/v1/delegates").await
        }
    }

    /// Accepts `owner`'s offer: this user reads their tasks and answers their decisions from
    /// now on. The mirror then takes a fresh snapshot, since the owner's tasks made before are
    /// behind its cursor and the event stream brings only what happens next.
    pub async fn accept_delegation(&self, owner: &str) -> Result<Delegates, Error> {
        let (id, api) = self.require_identity().await?;
        let token = self.token(&id, &api).await?;
        let path = format!("/v1/delegations/{}/accept", path_segment(owner));
        let d = api.post(&token, &path, &serde_json::Value::Null).await?;
        self.resnapshot(&api, &token).await?;
        Ok(d)
    }

    /// Declines `owner`'s offer, or leaves a delegation this user accepted: none of their tasks
    /// come any more (what the mirror holds of theirs stays, as when the owner ends it).
    pub async fn decline_delegation(&self, owner: &str) -> Result<Delegates, Error> {
        let (id, api) = self.require_identity().await?;
        let token = self.token(&id, &api).await?;
        let path = format!("/v1/delegations/{}/decline", path_segment(owner));
        api.post(&token, &path, &serde_json::Value::Null).await
    }

    /// After the mirror took new events: the pending decisions this device has not yet said it
    /// fetched.
    pub(crate) async fn report_fetched(&self, api: &Api, token: &str) -> Result<usize, Error> {
        let (id, _) = self.require_identity().await?;
        let pending = self.mirror.pending_decisions().await?;
        post_receipts(api, token, &id.device_id, &pending, DeliveryStep::Fetched).await
    }
}

/// Posts `step` for each decision the mirror does not show at that step on this device.
async fn post_receipts(
    api: &Api,
    token: &str,
    device_id: &str,
    decisions: &[Decision],
    step: DeliveryStep,
) -> Result<usize, Error> {
    let receipts: Vec<DeviceReceipt> = decisions
        .iter()
        .filter(|d| {
            !d.deliveries
                .iter()
                .any(|x| x.device_id == device_id && x.step == step)
        })
        .map(|d| DeviceReceipt {
            decision_id: d.id.clone(),
            step,
        })
        .collect();
    let mut recorded = 0;
    for chunk in receipts.chunks(MAX_RECEIPTS) {
        let r: ReceiptsRecorded = api
            .post(
                token,
                &format!("/v1/devices/{device_id}/receipts"),
                &PostReceipts {
                    receipts: chunk.to_vec(),
                },
            )
            .await?;
        recorded += r.recorded;
    }
    Ok(recorded)
}

/// Receipts the server takes in one request.
const MAX_RECEIPTS: usize = 200;

/// A user name as one percent-encoded path segment (names may hold spaces or slashes).
fn path_segment(name: &str) -> String {
    let mut url = url::Url::parse("http://x/").expect("a constant URL");
    if let Ok(mut segments) = url.path_segments_mut() {
        segments.push(name);
    }
    url.path().trim_start_matches('/').to_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_name_is_one_path_segment() {
        assert_eq!(super::path_segment("bob"), "bob");
        assert_eq!(super::path_segment("a b/c?"), "a%20b%2Fc%3F");
    }
}
