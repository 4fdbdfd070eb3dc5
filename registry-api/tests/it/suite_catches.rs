//! The suite's new checks fail on a backend that breaks what they check:
//! no check passes without asserting something that could fail. Each case
//! wraps a `MemoryRegistry` in one flaw and expects the check to panic.

use std::panic::AssertUnwindSafe;

use async_trait::async_trait;
use futures::FutureExt;
use waypost::memory::MemoryRegistry;
use waypost::testing;
use waypost::{
    Batch, Capabilities, Endpoint, EndpointKey, EventStream, Heartbeat, Op, Registry, Result,
    Snapshot, Version, Watch,
};

/// What a [`Broken`] registry gets wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flaw {
    /// Writes a batch op by op (yielding between them), whatever its size,
    /// until an op fails; still claims atomic writes and isolated reads.
    OpByOp,
    /// Every heartbeat succeeds.
    AdmitsEveryNode,
    /// Refuses an endpoint at exactly its stated size limit.
    SizeLimitOffByOne,
}

#[derive(Debug)]
struct Broken {
    inner: MemoryRegistry,
    flaw: Flaw,
}

fn broken(flaw: Flaw) -> Broken {
    Broken {
        inner: MemoryRegistry::new().with_max_batch(10),
        flaw,
    }
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Broken({:?}, {})", self.flaw, self.inner)
    }
}

#[async_trait]
impl Registry for Broken {
    async fn register(&self, endpoint: Endpoint) -> Result<()> {
        if self.flaw == Flaw::SizeLimitOffByOne
            && waypost::limits::encoded_len(&endpoint) >= self.capabilities().max_encoded_len
        {
            return Err(waypost::Error::invalid("endpoint", "too large"));
        }
        self.inner.register(endpoint).await
    }
    async fn deregister(&self, key: &EndpointKey) -> Result<()> {
        self.inner.deregister(key).await
    }
    async fn list(&self, service: &str) -> Result<Vec<Endpoint>> {
        self.inner.list(service).await
    }
    async fn snapshot(&self) -> Result<Snapshot> {
        self.inner.snapshot().await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

#[async_trait]
impl Batch for Broken {
    async fn apply(&self, ops: Vec<Op>) -> Result<()> {
        if self.flaw != Flaw::OpByOp {
            return self.inner.apply(ops).await;
        }
        for (i, op) in ops.into_iter().enumerate() {
            let res = match op {
                Op::Register(e) => self.register(e).await,
                Op::Deregister(k) => self.deregister(&k).await,
            };
            res.map_err(|e| e.in_field(&format!("ops[{i}].")))?;
            tokio::task::yield_now().await;
        }
        Ok(())
    }
}

impl Watch for Broken {
    fn watch(&self, from: Option<Version>) -> EventStream {
        self.inner.watch(from)
    }
}

#[async_trait]
impl Heartbeat for Broken {
    async fn heartbeat(&self, node: &str) -> Result<()> {
        match self.flaw {
            Flaw::AdmitsEveryNode => Ok(()),
            _ => self.inner.heartbeat(node).await,
        }
    }
}

/// Run `check` and demand that it fails.
async fn fails(what: &str, check: impl std::future::Future<Output = ()>) {
    let res = AssertUnwindSafe(check).catch_unwind().await;
    assert!(res.is_err(), "{what}: the check passed on a broken backend");
}

#[tokio::test]
async fn each_check_catches_its_flaw() {
    let reg = broken(Flaw::OpByOp);
    fails(
        "a batch over max_batch written op by op",
        testing::batch_over_max_is_refused(&reg),
    )
    .await;
    fails(
        "a batch written until its failing op",
        testing::batch_failure_writes_nothing(&reg),
    )
    .await;
    fails(
        "a batch written until its invalid op",
        testing::batch_invalid_op_writes_nothing(&reg),
    )
    .await;
    fails(
        "readers seeing a batch in parts",
        testing::batch_reads_are_isolated(&reg),
    )
    .await;

    let reg = broken(Flaw::AdmitsEveryNode);
    fails(
        "a heartbeat of an unknown node accepted",
        testing::heartbeat_unknown_node_is_not_found(&reg, &reg),
    )
    .await;

    let reg = broken(Flaw::SizeLimitOffByOne);
    fails(
        "an endpoint at the size limit refused",
        testing::limits_accepted_and_one_past_rejected(&reg),
    )
    .await;
}

/// The same checks pass on the sound registry underneath.
#[tokio::test]
async fn the_sound_registry_passes_them() {
    let reg = MemoryRegistry::new().with_max_batch(10);
    testing::batch_over_max_is_refused(&reg).await;
    testing::batch_failure_writes_nothing(&reg).await;
    testing::batch_invalid_op_writes_nothing(&reg).await;
    testing::batch_reads_are_isolated(&reg).await;
    testing::heartbeat_unknown_node_is_not_found(&reg, &reg).await;
    testing::heartbeat_of_an_owner_succeeds(&reg, &reg).await;
    testing::limits_accepted_and_one_past_rejected(&reg).await;
}
