//! The requests on the registry's endpoint keys: `Txn` writes of ops
//! (granting a node's lease first, see [`crate::leases`]), reads of a
//! range at one revision, snapshots and the probe.

use std::collections::HashMap;
use std::sync::Arc;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use tracing::{debug, warn};
use waypost::{Endpoint, Error, Op, Result, Snapshot, Version};

use crate::error;
use crate::keyspace::Keyspace;
use crate::layout;
use crate::leases::ensure_lease;

/// An op with its etcd key and, for a registration, its encoded value:
/// ready to go into a `Txn`.
struct EncodedOp {
    op: Op,
    key: String,
    value: Option<Vec<u8>>,
}

impl EncodedOp {
    fn size(&self) -> usize {
        self.key.len() + self.value.as_ref().map_or(0, Vec::len) + 16
    }
}

impl Keyspace {
    fn encode(&self, op: Op) -> Result<EncodedOp> {
        let key = self.layout.key(&op.key());
        let value = match &op {
            Op::Register(ep) => Some(layout::encode(ep)?),
            Op::Deregister(_) => None,
        };
        Ok(EncodedOp { op, key, value })
    }

    /// Write already validated ops: their net effect per key
    /// ([`Op::net`]), in `Txn` chunks of at most `max_batch` ops and
    /// `max_txn_bytes`.
    pub(crate) async fn commit(self: &Arc<Self>, ops: Vec<Op>) -> Result<()> {
        let encoded = Op::net(ops)
            .into_iter()
            .map(|op| self.encode(op))
            .collect::<Result<Vec<_>>>()?;
        let max_ops = self.cfg.max_batch.max(1);
        let max_bytes = self.cfg.max_txn_bytes;
        let mut chunk: Vec<EncodedOp> = Vec::new();
        let mut bytes = 0;
        for p in encoded {
            if !chunk.is_empty() && (chunk.len() >= max_ops || bytes + p.size() > max_bytes) {
                self.commit_chunk(std::mem::take(&mut chunk)).await?;
                bytes = 0;
            }
            bytes += p.size();
            chunk.push(p);
        }
        if !chunk.is_empty() {
            self.commit_chunk(chunk).await?;
        }
        Ok(())
    }

    /// One `Txn`. Retries once when a lease turned out to be gone.
    async fn commit_chunk(self: &Arc<Self>, chunk: Vec<EncodedOp>) -> Result<()> {
        let what = describe(&chunk);
        // Forget deregistered keys first, so that a lease recovery running
        // at the same time does not write them again.
        {
            let mut nodes = self.nodes.lock().await;
            for p in &chunk {
                if let Op::Deregister(k) = &p.op {
                    nodes.forget(k);
                }
            }
        }
        let mut retried = false;
        loop {
            let mut leases: HashMap<String, i64> = HashMap::new();
            for p in &chunk {
                if let Op::Register(ep) = &p.op {
                    if !ep.node.is_empty() && !leases.contains_key(&ep.node) {
                        let id = ensure_lease(self, &ep.node).await?;
                        leases.insert(ep.node.clone(), id);
                    }
                }
            }
            let ops: Vec<TxnOp> = chunk
                .iter()
                .map(|p| match (&p.op, &p.value) {
                    (Op::Register(ep), Some(v)) => {
                        let lease = leases.get(&ep.node).copied().unwrap_or(0);
                        TxnOp::put(
                            p.key.clone(),
                            v.clone(),
                            Some(PutOptions::new().with_lease(lease)),
                        )
                    }
                    _ => TxnOp::delete(p.key.clone(), None),
                })
                .collect();
            let mut kv = self.client.kv_client();
            match self.timed(kv.txn(Txn::new().and_then(ops))).await {
                Ok(_) => break,
                Err(e) if error::is_lease_not_found(&e) && !retried => {
                    warn!(%what, "a node's lease is gone; granting a new one and retrying");
                    let mut nodes = self.nodes.lock().await;
                    for (node, id) in &leases {
                        nodes.lease_gone(node, *id);
                    }
                    retried = true;
                }
                Err(e) => return Err(error::map(e, what)),
            }
        }
        let mut nodes = self.nodes.lock().await;
        for p in chunk {
            if let Op::Register(ep) = p.op {
                nodes.remember(ep);
            }
        }
        Ok(())
    }

    /// [`Registry::probe`]: one read and one write check, changing nothing.
    ///
    /// 1. `Range` of `<prefix>/services/` with `limit 1`, keys only: etcd
    ///    answers and the user may read the registry's keys.
    /// 2. A `Txn` whose compare can never hold (`create_revision` of
    ///    `<prefix>/services/` below 0) with a `put` of that key in its
    ///    success branch and nothing in its failure branch. etcd checks the
    ///    permissions of the compare keys and of both branches before it
    ///    evaluates the compare (`CheckTxnAuth` in etcd's server), so a user
    ///    without write permission is refused with `PermissionDenied`; the
    ///    compare fails, so nothing is written: no key, no new revision, no
    ///    watch event. The key is not an endpoint key either (reads and
    ///    watches skip it), should it ever exist.
    ///
    /// Costs one read of at most one key and one write request through
    /// etcd's raft log (a leader round trip and a WAL sync, like a write).
    pub(crate) async fn probe(&self) -> Result<()> {
        let root = self.layout.root().to_string();
        let mut kv = self.client.kv_client();
        self.timed(
            kv.get(
                root.clone(),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_keys_only()
                        .with_limit(1),
                ),
            ),
        )
        .await
        .map_err(|e| error::map(e, format!("probe: read {root}")))?;
        let txn = Txn::new()
            .when([Compare::create_revision(root.clone(), CompareOp::Less, 0)])
            .and_then([TxnOp::put(root.clone(), Vec::new(), None)]);
        let resp = self
            .timed(kv.txn(txn))
            .await
            .map_err(|e| error::map(e, format!("probe: write check on {root}")))?;
        if resp.succeeded() {
            // Cannot happen: no key has a negative create revision.
            return Err(Error::internal(format!(
                "probe: the impossible compare on {root} held; etcd wrote the probe key"
            )));
        }
        Ok(())
    }

    /// Every endpoint, read at one revision (the snapshot's version).
    pub(crate) async fn snapshot(&self) -> Result<Snapshot> {
        let (revision, eps) = self.read_range(self.layout.root()).await?;
        Ok(Snapshot::from_endpoints(
            Version(u64::try_from(revision).unwrap_or(0)),
            eps,
        ))
    }

    /// Every endpoint under `prefix`, read in pages at one revision.
    pub(crate) async fn read_range(&self, prefix: &str) -> Result<(i64, Vec<Endpoint>)> {
        let end = layout::range_end(prefix.as_bytes());
        let page = i64::try_from(self.cfg.page_size.max(1)).unwrap_or(i64::MAX);
        let mut attempt = 0;
        'read: loop {
            attempt += 1;
            let mut revision = 0;
            let mut from = prefix.as_bytes().to_vec();
            let mut out = Vec::new();
            loop {
                let mut opts = GetOptions::new().with_range(end.clone()).with_limit(page);
                if revision > 0 {
                    opts = opts.with_revision(revision);
                }
                let mut kv = self.client.kv_client();
                let mut resp = match self.timed(kv.get(from.clone(), Some(opts))).await {
                    Ok(r) => r,
                    Err(e) if error::is_compacted(&e) && attempt < 3 => {
                        debug!(
                            prefix,
                            revision, "revision compacted while paging; reading again"
                        );
                        continue 'read;
                    }
                    Err(e) => return Err(error::map(e, format!("read {prefix}"))),
                };
                if revision == 0 {
                    revision = resp.header().map_or(0, |h| h.revision());
                }
                let more = resp.more();
                let kvs = resp.take_kvs();
                let Some(last) = kvs.last() else { break };
                from = last.key().to_vec();
                from.push(0);
                for kv in &kvs {
                    match layout::decode(&self.layout, kv.key(), kv.value()) {
                        Ok(ep) => out.push(ep),
                        Err(e) => warn!(error = %e, "skipping a record that is not an endpoint"),
                    }
                }
                if !more {
                    break;
                }
            }
            return Ok((revision, out));
        }
    }
}

fn describe(chunk: &[EncodedOp]) -> String {
    match chunk {
        [one] => match &one.op {
            Op::Register(_) => format!("register {}", error::short(&one.key)),
            Op::Deregister(_) => format!("deregister {}", error::short(&one.key)),
        },
        [first, ..] => format!(
            "batch of {} ops starting at {}",
            chunk.len(),
            error::short(&first.key)
        ),
        [] => "empty batch".to_string(),
    }
}
