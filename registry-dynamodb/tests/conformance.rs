//! The registry-api conformance suite against moto, the only place it runs
//! for this backend: once on tables with a stream (native watch) and once
//! on tables without (polling every 50 ms), the two ways this backend
//! watches. Each check gets a table of its own on one shared moto server.

#![allow(clippy::unwrap_used)]

mod common;

use common::Harness;
use registry_api::testing::{overflow_history, Guarded};
use registry_dynamodb::DynamoDbRegistry;

/// More changes than the watch history (64) holds, seen by a watch.
async fn lose_history(reg: &Guarded<DynamoDbRegistry>) {
    overflow_history(reg, 70).await;
}

mod with_stream {
    use super::*;
    async fn make() -> Guarded<DynamoDbRegistry> {
        Harness::new(true).await.guarded()
    }
    registry_api::conformance_tests!(make, super::lose_history);
}

mod polling {
    use super::*;
    async fn make() -> Guarded<DynamoDbRegistry> {
        Harness::new(false).await.guarded()
    }
    registry_api::conformance_tests!(make, super::lose_history);
}
