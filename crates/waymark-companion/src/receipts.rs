//! Proof of delivery from this device: it tells the server how far each decision has reached
//! it — fetched into the mirror, shown in a notification, opened by the person — so whoever
//! waits on a decision can tell "the phone has it and nobody looked" from "it never arrived".
//! Steps the mirror already shows recorded for this device are not sent again.

use waymark_proto::*;

use crate::api::Api;
use crate::{Companion, Error};

impl Companion {
    /// Tells the server that these decisions reached `step` (`fetched`, `shown`, `opened`) on
    /// this device; returns how many steps were new to the server.
    pub async fn report_receipts(
        &self,
        decision_ids: &[String],
        step: DeliveryStep,
    ) -> Result<usize, Error> {
        let (id, api) = self.require_identity().await?;
        let token = self.token(&id, &api).await?;
        self.post_receipts(&api, &token, &id.device_id, decision_ids, step)
            .await
    }

    /// This user's devices as the server knows them: when each was last heard from, and
    /// whether it is stale.
    pub async fn devices(&self) -> Result<Vec<Device>, Error> {
        let (id, api) = self.require_identity().await?;
        let token = self.token(&id, &api).await?;
        api.get(&token, "/v1/devices").await
    }

    /// After the mirror took new events: the pending decisions this device has not yet said it
    /// fetched.
    pub(crate) async fn report_fetched(&self, api: &Api, token: &str) -> Result<usize, Error> {
        let (id, _) = self.require_identity().await?;
        let ids: Vec<String> = self
            .mirror
            .inbox()
            .await?
            .into_iter()
            .map(|i| i.decision.id)
            .collect();
        self.post_receipts(api, token, &id.device_id, &ids, DeliveryStep::Fetched)
            .await
    }

    async fn post_receipts(
        &self,
        api: &Api,
        token: &str,
        device_id: &str,
        decision_ids: &[String],
        step: DeliveryStep,
    ) -> Result<usize, Error> {
        let mut receipts = Vec::new();
        for d in decision_ids {
            let Some(dec) = self.mirror.decision(d).await? else {
                continue;
            };
            let known = dec
                .deliveries
                .iter()
                .any(|x| x.device_id == device_id && x.step == step);
            if !known {
                receipts.push(DeviceReceipt {
                    decision_id: dec.id,
                    step,
                });
            }
        }
        let mut recorded = 0;
        for chunk in receipts.chunks(200) {
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
}
