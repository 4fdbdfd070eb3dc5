//! The waypost conformance suite against Cloud Map on `moto`, through
//! `Polling` (50 ms), each check with an emulator and a namespace of its
//! own; the only place it runs for this backend. It runs unmodified: Cloud
//! Map's smaller limits (24 labels, 4,700 bytes) are in its capabilities,
//! and the checks read them from there.

use crate::common;

use common::{harness, Harness, HISTORY};
use waypost::testing::overflow_history;

async fn make() -> Harness {
    harness().await
}

/// Write more changes than the polling hub keeps, and wait until the hub
/// has seen them: the history after any earlier version is then gone.
async fn lose_history(h: &Harness) {
    overflow_history(h, HISTORY + 2).await;
}

waypost::conformance_tests!(make, lose_history);
