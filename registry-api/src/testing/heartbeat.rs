//! The checks of [`Heartbeat`], for registries that implement it (the
//! suite skips them, and says so, for those that don't).
//!
//! A heartbeat also revives the endpoints that liveness marked unhealthy.
//! The suite does not check that: liveness marks a node only once its
//! clock says the node has been silent long enough (SQLite's configured
//! clock, the `Liveness` combinator's timer, an etcd lease's TTL), and the
//! traits give no way to move that clock, so a generic check would have to
//! wait in real time. The backends' own tests check it on a clock they
//! control: `registry-api/tests/liveness.rs` (the `Liveness` combinator,
//! paused tokio time) and `registry-sqlite/tests/behaviour.rs` (a manual
//! clock).

use super::support::{assert_kind, ep, unique};
use crate::error::ErrorKind;
use crate::traits::{Heartbeat, Registry};

/// A heartbeat of a node that owns no endpoint here is `NotFound`, so that
/// its client registers again, and it admits nothing: a second one is
/// `NotFound` too.
pub async fn heartbeat_unknown_node_is_not_found<R: Registry + ?Sized>(
    reg: &R,
    hb: &dyn Heartbeat,
) {
    let node = unique("ghost-node");
    assert_kind(hb.heartbeat(&node).await, ErrorKind::NotFound);
    assert_kind(hb.heartbeat(&node).await, ErrorKind::NotFound);
    let owned = reg
        .snapshot()
        .await
        .expect("snapshot")
        .iter()
        .filter(|e| e.node == node)
        .count();
    assert_eq!(owned, 0, "a heartbeat of an unknown node wrote endpoints");
}

/// A heartbeat of a node that owns an endpoint succeeds and leaves the
/// healthy endpoint as it was.
pub async fn heartbeat_of_an_owner_succeeds<R: Registry + ?Sized>(reg: &R, hb: &dyn Heartbeat) {
    let svc = unique("heartbeat");
    let node = unique("node");
    let owned = ep(&svc, "a", 1).with_node(&node);
    let other = ep(&svc, "b", 2).with_node(unique("other-node"));
    reg.register(owned.clone()).await.expect("register");
    reg.register(other.clone()).await.expect("register");
    hb.heartbeat(&node)
        .await
        .expect("a heartbeat of a node that owns an endpoint");
    hb.heartbeat(&node).await.expect("a second heartbeat");
    assert_eq!(reg.list(&svc).await.expect("list"), vec![owned, other]);
}
