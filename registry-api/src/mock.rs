//! `mockall` mocks of the four traits, for users' unit tests (feature
//! `mock`).
//!
//! - [`MockRegistry`]: [`Registry`] only.
//! - [`MockWatch`]: [`Watch`] only.
//! - [`MockBatch`]: [`Registry`] and [`Batch`] (`Batch` needs `Registry`).
//! - [`MockHeartbeat`]: [`Heartbeat`] only.
//! - [`MockBackend`]: all four, to stand in for a backend under the
//!   combinators (`CachedRegistry` needs `Registry + Watch`, `Coalescing`
//!   needs `Batch`).
//!
//! Each mock shows as `Mock` in `Display`, so a chain reads
//! `Cached(Mock)`. Set expectations with `expect_<method>()`, as with any
//! mockall mock; async methods return their value directly:
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use waypost::mock::MockRegistry;
//! use waypost::{Endpoint, Error, ErrorKind, Registry};
//!
//! /// Code under test: takes any registry.
//! async fn first_address(reg: &dyn Registry, service: &str) -> waypost::Result<String> {
//!     let eps = reg.list(service).await?;
//!     let ep = eps.first().ok_or_else(|| Error::unavailable(format!("no {service}")))?;
//!     Ok(format!("{}:{}", ep.address, ep.port))
//! }
//!
//! let mut reg = MockRegistry::new();
//! reg.expect_list()
//!     .withf(|service| service == "payments")
//!     .times(1)
//!     .returning(|_| Ok(vec![Endpoint::new("payments", "a", "10.0.0.7", 8080)]));
//! reg.expect_list()
//!     .returning(|_| Err(Error::unavailable("registry down")));
//!
//! assert_eq!(first_address(&reg, "payments").await?, "10.0.0.7:8080");
//! let err = first_address(&reg, "payments").await.unwrap_err();
//! assert_eq!(err.kind(), ErrorKind::Unavailable);
//! # Ok::<(), waypost::Error>(()) });
//! ```
//!
//! A watch hands out a stream; build one from a vector of events:
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use futures::{stream, StreamExt};
//! use waypost::mock::MockWatch;
//! use waypost::{Endpoint, Event, Snapshot, Version, Watch};
//!
//! let mut watch = MockWatch::new();
//! watch.expect_watch().returning(|_from| {
//!     let snap = Snapshot::from_endpoints(Version(1), [Endpoint::new("api", "a", "h", 80)]);
//!     stream::iter(vec![Ok(Event::Snapshot(snap))]).boxed()
//! });
//! let mut events = watch.watch(None);
//! assert!(matches!(events.next().await, Some(Ok(Event::Snapshot(_)))));
//! # });
//! ```

use std::fmt;

use async_trait::async_trait;

use crate::capabilities::Capabilities;
use crate::error::Result;
use crate::model::{Endpoint, EndpointKey, Op, Version};
use crate::snapshot::Snapshot;
use crate::traits::{Batch, EventStream, Heartbeat, Registry, Watch};

mockall::mock! {
    /// A mock [`Registry`].
    pub Registry {}

    #[async_trait]
    impl Registry for Registry {
        async fn register(&self, endpoint: Endpoint) -> Result<()>;
        async fn deregister(&self, key: &EndpointKey) -> Result<()>;
        async fn list(&self, service: &str) -> Result<Vec<Endpoint>>;
        async fn snapshot(&self) -> Result<Snapshot>;
        fn capabilities(&self) -> Capabilities;
        async fn probe(&self) -> Result<()>;
    }
}

mockall::mock! {
    /// A mock [`Watch`].
    pub Watch {}

    impl Watch for Watch {
        fn watch(&self, from: Option<Version>) -> EventStream;
    }
}

mockall::mock! {
    /// A mock [`Registry`] + [`Batch`].
    pub Batch {}

    #[async_trait]
    impl Registry for Batch {
        async fn register(&self, endpoint: Endpoint) -> Result<()>;
        async fn deregister(&self, key: &EndpointKey) -> Result<()>;
        async fn list(&self, service: &str) -> Result<Vec<Endpoint>>;
        async fn snapshot(&self) -> Result<Snapshot>;
        fn capabilities(&self) -> Capabilities;
        async fn probe(&self) -> Result<()>;
    }

    #[async_trait]
    impl Batch for Batch {
        async fn apply(&self, ops: Vec<Op>) -> Result<()>;
        fn max_batch(&self) -> usize;
    }
}

mockall::mock! {
    /// A mock [`Heartbeat`].
    pub Heartbeat {}

    #[async_trait]
    impl Heartbeat for Heartbeat {
        async fn heartbeat(&self, node: &str) -> Result<()>;
    }
}

mockall::mock! {
    /// A mock of a whole backend: [`Registry`], [`Watch`], [`Batch`] and
    /// [`Heartbeat`].
    pub Backend {}

    #[async_trait]
    impl Registry for Backend {
        async fn register(&self, endpoint: Endpoint) -> Result<()>;
        async fn deregister(&self, key: &EndpointKey) -> Result<()>;
        async fn list(&self, service: &str) -> Result<Vec<Endpoint>>;
        async fn snapshot(&self) -> Result<Snapshot>;
        fn capabilities(&self) -> Capabilities;
        async fn probe(&self) -> Result<()>;
    }

    impl Watch for Backend {
        fn watch(&self, from: Option<Version>) -> EventStream;
    }

    #[async_trait]
    impl Batch for Backend {
        async fn apply(&self, ops: Vec<Op>) -> Result<()>;
        fn max_batch(&self) -> usize;
    }

    #[async_trait]
    impl Heartbeat for Backend {
        async fn heartbeat(&self, node: &str) -> Result<()>;
    }
}

macro_rules! display_as_mock {
    ($($mock:ident),*) => {$(
        impl fmt::Display for $mock {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("Mock")
            }
        }

        impl fmt::Debug for $mock {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(stringify!($mock))
            }
        }
    )*};
}

display_as_mock!(MockRegistry, MockBatch, MockBackend);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;
    use crate::cached::{CachedConfig, CachedRegistry};
    use crate::coalescing::{Coalescing, CoalescingConfig};
    use crate::Event;
    use futures::{stream, StreamExt};

    #[tokio::test]
    async fn backend_mock_under_cached_serves_reads_from_its_snapshot() {
        let mut backend = MockBackend::new();
        backend.expect_watch().times(1).returning(|_| {
            let snap =
                Snapshot::from_endpoints(Version(3), [Endpoint::new("api", "a", "127.0.0.1", 80)]);
            stream::iter(vec![Ok(Event::Snapshot(snap))])
                .chain(stream::pending())
                .boxed()
        });
        // No `expect_list`: a read reaching the backend would panic.
        let cached = CachedRegistry::with_config(
            backend,
            CachedConfig::default().with_write_wait(Duration::ZERO),
        )
        .unwrap();
        cached.wait_until_ready().await;
        assert_eq!(cached.list("api").await.unwrap().len(), 1);
        assert_eq!(cached.to_string(), "Cached(Mock)");
    }

    #[tokio::test]
    async fn batch_mock_under_coalescing_gets_one_apply() {
        let mut backend = MockBatch::new();
        backend.expect_max_batch().return_const(100usize);
        backend
            .expect_capabilities()
            .return_const(Capabilities::default().with_max_batch(100));
        backend
            .expect_apply()
            .withf(|ops| ops.len() == 3)
            .times(1)
            .returning(|_| Ok(()));
        let reg = Coalescing::with_config(
            backend,
            CoalescingConfig::default().with_flush_interval(Duration::from_secs(60)),
        )
        .unwrap();
        for id in ["a", "b", "c"] {
            reg.register(Endpoint::new("api", id, "127.0.0.1", 80))
                .await
                .unwrap();
        }
        reg.flush().await;
        assert_eq!(reg.to_string(), "Coalescing(Mock)");
    }

    #[tokio::test]
    async fn heartbeat_mock() {
        let mut hb = MockHeartbeat::new();
        hb.expect_heartbeat()
            .withf(|node| node == "node-1")
            .returning(|_| Ok(()));
        hb.heartbeat("node-1").await.unwrap();
    }
}
