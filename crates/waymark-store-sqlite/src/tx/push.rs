//! `PushTx` on SQLite: push channels and where each one's delivery stands.

use async_trait::async_trait;
use waymark_store::*;
use waymark_store_sql as sql;

use super::SqliteTx;
use crate::rows::*;

#[async_trait]
impl PushTx for SqliteTx {
    async fn insert_push_channel(&mut self, c: &PushChannelRow) -> Result<()> {
        self.exec(sql::push::insert_push_channel(c)).map(drop)
    }

    async fn push_channels(&mut self, device_id: Option<&str>) -> Result<Vec<PushChannelRow>> {
        let q = match device_id {
            Some(d) => sql::push::push_channels_of_device(d),
            None => sql::push::live_push_channels(),
        };
        self.all(q, push_channel_row)
    }

    async fn update_push_channel(&mut self, c: &PushChannelRow) -> Result<()> {
        self.exec(sql::push::update_push_channel(c)).map(drop)
    }
}
