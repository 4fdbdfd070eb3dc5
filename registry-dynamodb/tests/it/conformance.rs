//! The waypost conformance suite against moto, the only place it runs
//! for this backend: once on tables with a stream (native watch) and once
//! on tables without (`Polling` every 50 ms, as `waypost::stack::stack`
//! wraps such a registry), and once in change log mode
//! (`WatchMode::ChangeLog`), with one head and with eight: the ways this
//! backend is watched. Each check
//! gets a table of its own on one shared moto server.

use crate::common;

use common::Harness;
use waypost::polling::Polling;
use waypost::testing::{overflow_history, Guarded};
use waypost::{Registry, Watch};
use waypost_dynamodb::DynamoDbRegistry;

/// More changes than the watch history (64) holds, seen by a watch.
async fn lose_history<R: Registry + Watch>(reg: &R) {
    overflow_history(reg, 70).await;
}

mod with_stream {
    use super::*;
    async fn make() -> Guarded<DynamoDbRegistry> {
        Harness::new(true).await.guarded()
    }
    waypost::conformance_tests!(make, super::lose_history);
}

mod polling {
    use super::*;
    async fn make() -> Guarded<Polling<DynamoDbRegistry>> {
        Harness::new(false).await.polled()
    }
    waypost::conformance_tests!(make, super::lose_history);
}

mod changelog {
    use super::*;
    async fn make() -> Guarded<DynamoDbRegistry> {
        let h = Harness::changelog().await;
        assert!(h.reg.uses_changelog());
        h.guarded()
    }
    waypost::conformance_tests!(make, super::lose_history);
}

mod changelog_heads {
    use super::*;
    async fn make() -> Guarded<DynamoDbRegistry> {
        let h = Harness::with_config(false, |c| {
            c.with_watch(waypost_dynamodb::WatchMode::ChangeLog)
                .with_changelog_heads(8)
        })
        .await;
        assert!(h.reg.uses_changelog());
        h.guarded()
    }
    waypost::conformance_tests!(make, super::lose_history);
}
