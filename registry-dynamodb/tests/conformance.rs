//! The registry-api conformance suite against moto: once on tables with a
//! stream (native watch) and once on tables without (`Polling` every 50 ms,
//! as `registry_api::stack::stack` wraps such a registry).
//! Each check gets a table of its own on one shared moto server.

#![allow(clippy::unwrap_used)]

mod common;

use common::Harness;
use registry_api::testing::{ep, follow_until, next_event, unique};
use registry_api::{Batch, Endpoint, Event, Op, Watch};

/// Push more changes than the watch history holds, and wait until the
/// watch has seen them: the older versions can no longer be resumed.
async fn lose_history(h: &Harness) {
    let svc = unique("filler");
    let eps: Vec<Endpoint> = (0..70u16).map(|i| ep(&svc, &format!("f{i}"), 1)).collect();
    h.reg
        .apply(eps.iter().cloned().map(Op::Register).collect())
        .await
        .unwrap();
    let mut w = h.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "snapshot").await else {
        panic!("watch(None) did not start with a snapshot");
    };
    follow_until(&mut w, &mut state, &svc, &eps).await;
}

mod with_stream {
    use super::*;
    async fn make() -> Harness {
        let mut h = Harness::new(true).await;
        h.conformance = true;
        h
    }
    registry_api::conformance_tests!(make, super::lose_history);
}

mod polling {
    use super::*;
    async fn make() -> Harness {
        let mut h = Harness::new(false).await;
        h.conformance = true;
        h
    }
    registry_api::conformance_tests!(make, super::lose_history);
}
