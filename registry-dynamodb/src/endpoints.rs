//! [`Endpoints`]: the registry's endpoints in the table, read with
//! `Query` and `Scan` and written with `PutItem`, `DeleteItem` and
//! `TransactWriteItems` (through the change log when the table keeps one),
//! at versions of the registry's own clock.

use std::sync::Arc;

use futures::future::try_join_all;
use waypost::backend::VersionClock;
use waypost::{Endpoint, EndpointKey, Op, Result, Snapshot};

use crate::changelog::ChangeLog;
use crate::client::Client;
use crate::error::{map_sdk, map_transact};
use crate::layout::{self, Item};
use crate::transact::{failed_within, new_token, op_items, Guard};

/// The endpoints of one registry's table, shared by the registry, its
/// liveness and its watch tasks.
pub(crate) struct Endpoints {
    pub(crate) client: Arc<Client>,
    /// The change log, written with every batch when the table keeps one.
    pub(crate) log: ChangeLog,
    /// Versions of snapshots and watch events (DynamoDB has none of its
    /// own): they start at the current time in microseconds, so they grow
    /// across restarts.
    pub(crate) clock: VersionClock,
}

impl Endpoints {
    /// The endpoints of `client`'s table.
    pub(crate) fn new(client: Arc<Client>) -> Self {
        Self {
            log: ChangeLog::new(Arc::clone(&client)),
            client,
            clock: VersionClock::new(),
        }
    }
}

/// Reads.
impl Endpoints {
    /// The endpoints of `service`: a paginated `Query`, sorted by id.
    pub(crate) async fn query_service(&self, service: &str) -> Result<Vec<Endpoint>> {
        let mut out = Vec::new();
        let mut start: Option<Item> = None;
        let now = layout::now_secs();
        loop {
            let page = self
                .client
                .ddb
                .query()
                .table_name(&self.client.cfg.table)
                .key_condition_expression("#s = :s")
                .expression_attribute_names("#s", layout::SERVICE)
                .expression_attribute_values(
                    ":s",
                    aws_sdk_dynamodb::types::AttributeValue::S(service.to_string()),
                )
                .consistent_read(self.client.cfg.consistent_reads)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| map_sdk(e, self.client.ctx("Query")))?;
            out.extend(
                page.items()
                    .iter()
                    .filter_map(|i| self.client.endpoint_of(i, now)),
            );
            match page.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => break,
            }
        }
        // DynamoDB sorts by the bytes of the sort key, as `String` does; sort
        // anyway so the order never depends on that.
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// Every endpoint: a (parallel) paginated `Scan`, at a version taken
    /// before it started.
    pub(crate) async fn scan_all(&self) -> Result<Snapshot> {
        let version = self.clock.next();
        let total = self.client.cfg.scan_segments.max(1);
        let parts = try_join_all((0..total).map(|s| self.scan_segment(s, total))).await?;
        Ok(Snapshot::from_endpoints(
            version,
            parts.into_iter().flatten(),
        ))
    }

    /// One segment of a `Scan`, every page.
    async fn scan_segment(&self, segment: u32, total: u32) -> Result<Vec<Endpoint>> {
        let mut out = Vec::new();
        let mut start: Option<Item> = None;
        let now = layout::now_secs();
        loop {
            let mut req = self
                .client
                .ddb
                .scan()
                .table_name(&self.client.cfg.table)
                .consistent_read(self.client.cfg.consistent_reads)
                .set_exclusive_start_key(start.take());
            if total > 1 {
                req = req.segment(segment as i32).total_segments(total as i32);
            }
            let page = req
                .send()
                .await
                .map_err(|e| map_sdk(e, self.client.ctx("Scan")))?;
            out.extend(
                page.items()
                    .iter()
                    .filter_map(|i| self.client.endpoint_of(i, now)),
            );
            match page.last_evaluated_key {
                Some(k) if !k.is_empty() => start = Some(k),
                _ => return Ok(out),
            }
        }
    }
}

/// Writes.
impl Endpoints {
    /// `PutItem` of one endpoint (already validated).
    pub(crate) async fn put_endpoint(&self, endpoint: &Endpoint) -> Result<()> {
        if self.client.logged() {
            return self
                .log
                .commit(vec![Op::Register(endpoint.clone())], None)
                .await;
        }
        let key = endpoint.key();
        self.client
            .ddb
            .put_item()
            .table_name(&self.client.cfg.table)
            .set_item(Some(layout::encode(endpoint, self.client.ttl_write())))
            .send()
            .await
            .map_err(|e| map_sdk(e, self.client.ctx_key("PutItem", &key)))?;
        Ok(())
    }

    /// `DeleteItem` of one key.
    pub(crate) async fn delete_endpoint(&self, key: &EndpointKey) -> Result<()> {
        if self.client.logged() {
            return self
                .log
                .commit(vec![Op::Deregister(key.clone())], None)
                .await;
        }
        self.client
            .ddb
            .delete_item()
            .table_name(&self.client.cfg.table)
            .set_key(Some(layout::key_item(key)))
            .send()
            .await
            .map_err(|e| map_sdk(e, self.client.ctx_key("DeleteItem", key)))?;
        Ok(())
    }

    /// Ops already checked against the batch rule, merged to their net
    /// effect per key ([`Op::net`]: DynamoDB refuses two actions on one
    /// item), as one transaction with `token` (a fresh one when `None`).
    pub(crate) async fn apply_ops(&self, ops: Vec<Op>, token: Option<&str>) -> Result<()> {
        let ops = Op::net(ops);
        if ops.is_empty() {
            return Ok(());
        }
        if self.client.logged() {
            return self.log.commit(ops, token).await;
        }
        match token {
            Some(token) => self.transact(ops, token).await,
            None => self.transact(ops, &new_token()).await,
        }
    }

    /// Ops (net, one per key, already checked) and `guard` in one
    /// transaction, through the change log when the table keeps one:
    /// `false` when a condition failed (nothing was written).
    pub(crate) async fn commit_guarded(&self, ops: Vec<Op>, guard: Guard) -> Result<bool> {
        if self.client.logged() {
            return self.log.commit_guarded(ops, None, guard).await;
        }
        let mut keys: Vec<EndpointKey> = ops.iter().map(Op::key).collect();
        keys.extend(guard.keys);
        let mut items = op_items(&self.client, &ops, guard.existing)?;
        items.extend(guard.items);
        let n = items.len();
        match self
            .client
            .ddb
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(new_token())
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if failed_within(&e, 0..n) => Ok(false),
            Err(e) => Err(map_transact(
                e,
                self.client.ctx("TransactWriteItems"),
                &keys,
            )),
        }
    }

    /// One `TransactWriteItems` of `ops` (one action per key) with `token`.
    async fn transact(&self, ops: Vec<Op>, token: &str) -> Result<()> {
        let keys: Vec<EndpointKey> = ops.iter().map(Op::key).collect();
        let items = op_items(&self.client, &ops, false)?;
        tracing::debug!(table = %self.client.cfg.table, actions = items.len(), token, "TransactWriteItems");
        self.client
            .ddb
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(token)
            .send()
            .await
            .map_err(|e| map_transact(e, self.client.ctx("TransactWriteItems"), &keys))?;
        Ok(())
    }
}
