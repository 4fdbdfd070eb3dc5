//! The conformance suite every backend runs against its real server
//! (feature `testing`), and the helpers its tests share.
//!
//! Each check is a public async function taking the registry under test. It
//! reads [`Capabilities`](crate::Capabilities) from the registry and decides
//! from them what to demand (exact event sequences from a native watch,
//! convergence from a polling one; isolation and atomicity only where
//! claimed; the backend's own label and size limits). Where it can't demand
//! something, it says so on stderr (`skipped: <check> on <registry>: …,
//! because capabilities say …`) and checks the weaker promise instead: no
//! check passes without asserting something that could fail. Every check
//! works in services of its own with random names, so checks may share one
//! registry and run concurrently.
//!
//! [`conformance_tests!`](crate::conformance_tests) turns the whole suite into
//! one `#[tokio::test]` per check; every backend runs it unmodified:
//!
//! ```ignore
//! async fn make() -> MyRegistry { MyRegistry::open_for_test().await }
//! async fn lose_history(reg: &MyRegistry) { reg.compact().await }
//! waypost::conformance_tests!(make, lose_history);
//! ```
//!
//! The parts: [`support`] (names, endpoints, bounded waits, watch helpers
//! that can skip `Err` items), the checks (`checks`, `batch`, `watch`,
//! `heartbeat`), the suite ([`run_all`], `conformance_tests!`), [`Faulty`]
//! (fault injection) and [`Guarded`] (a registry with its fixture).

mod batch;
mod checks;
mod faulty;
mod guarded;
mod heartbeat;
mod suite;
pub mod support;
mod watch;

pub use batch::{
    batch_applies_in_order, batch_failure_writes_nothing, batch_invalid_op_writes_nothing,
    batch_over_max_is_refused, batch_reads_are_isolated, MAX_AT_LIMIT_TRY, MAX_OVERSIZE_TRY,
};
pub use checks::{
    concurrent_writers_lose_nothing, deregister_removes, deregister_unknown_is_ok,
    draining_round_trips, invalid_input_names_field, limits_accepted_and_one_past_rejected,
    list_is_scoped_to_service, list_unknown_service_is_empty, register_is_upsert,
    roundtrip_preserves_all_fields, snapshot_has_everything_and_versions_grow,
};
pub use faulty::Faulty;
pub use guarded::Guarded;
pub use heartbeat::{heartbeat_of_an_owner_succeeds, heartbeat_unknown_node_is_not_found};
pub use suite::{probe, run_all};
pub use support::{
    assert_kind, ep, eventually, expect_invalid, first_snapshot, follow_until, follow_until_with,
    next_event, next_event_with, next_for, next_for_with, next_item, overflow_history,
    service_state, skip, unique, wait_limit, Kind, OnErr,
};
pub use watch::{
    two_watchers_agree, watch_delivers_changes_in_order_once,
    watch_fresh_snapshot_when_history_gone, watch_resume_loses_nothing, watch_starts_with_snapshot,
};
