//! The whole suite: [`run_all`] and [`conformance_tests!`](crate::conformance_tests),
//! both expanded from the one list of checks in `conformance_tests!`, so
//! they can't drift apart.

use std::future::Future;

use crate::traits::{Batch, Heartbeat, Watch};

/// Run every check, one after the other, on one registry. `heartbeat` is
/// the registry as a [`Heartbeat`] where it implements it (`None` skips
/// the heartbeat checks, saying so); `lose_history` must make the registry
/// forget the changes made so far (see
/// [`overflow_history`](super::overflow_history)).
pub async fn run_all<R, F, Fut>(reg: &R, heartbeat: Option<&dyn Heartbeat>, lose_history: F)
where
    R: Batch + Watch + ?Sized,
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    crate::conformance_tests!(@list run_all [reg, heartbeat, lose_history]);
}

/// Whether a registry's type implements [`Heartbeat`], decided where the
/// type is known (in the expansion of
/// [`conformance_tests!`](crate::conformance_tests)): `(&HeartbeatOf(&reg)).get()`
/// with [`Implements`](probe::Implements) and [`Lacks`](probe::Lacks) in scope is `Some` exactly when it
/// does (method resolution tries `Implements` before the auto-referenced
/// `Lacks`).
#[doc(hidden)]
pub mod probe {
    use crate::traits::Heartbeat;

    /// A registry, asked whether it implements [`Heartbeat`].
    pub struct HeartbeatOf<'a, T>(pub &'a T);

    /// The answer when it does.
    pub trait Implements {
        /// The registry as a [`Heartbeat`].
        fn get(&self) -> Option<&dyn Heartbeat>;
    }

    impl<T: Heartbeat> Implements for HeartbeatOf<'_, T> {
        fn get(&self) -> Option<&dyn Heartbeat> {
            Some(self.0)
        }
    }

    /// The answer when it does not.
    pub trait Lacks {
        /// `None`.
        fn get(&self) -> Option<&dyn Heartbeat>;
    }

    impl<T> Lacks for &HeartbeatOf<'_, T> {
        fn get(&self) -> Option<&dyn Heartbeat> {
            None
        }
    }
}

/// One `#[tokio::test]` per conformance check: the whole suite, the same
/// for every backend. What differs between backends is in their
/// [`Capabilities`](crate::Capabilities); a check that can't demand
/// something of a backend says so on stderr (`skipped: <check> on
/// <registry>: <what>, because capabilities say …`) and checks what it
/// can instead.
///
/// `$make` is an `async fn() -> R` returning a fresh registry (or a shared
/// one: checks use services of their own), `R: Batch + Watch`; the
/// heartbeat checks run where `R` implements `Heartbeat` too.
/// `$lose_history` is an `async fn(&R)` that makes the registry forget its
/// change history. The calling crate needs `tokio` (with `macros` and
/// `rt-multi-thread`) as a dev-dependency.
#[macro_export]
macro_rules! conformance_tests {
    ($make:path, $lose_history:path) => {
        $crate::conformance_tests!(@list tests [$make, $lose_history]);
    };
    // The one list of checks.
    (@list $how:ident [$($args:tt)*]) => {
        $crate::conformance_tests!(@$how [$($args)*]
            plain: [
                register_is_upsert, deregister_removes, deregister_unknown_is_ok,
                list_unknown_service_is_empty, list_is_scoped_to_service,
                snapshot_has_everything_and_versions_grow, roundtrip_preserves_all_fields,
                draining_round_trips,
                batch_applies_in_order, batch_invalid_op_writes_nothing,
                batch_over_max_is_refused, batch_failure_writes_nothing,
                batch_reads_are_isolated, watch_starts_with_snapshot,
                watch_delivers_changes_in_order_once, watch_resume_loses_nothing,
                two_watchers_agree, concurrent_writers_lose_nothing,
                invalid_input_names_field, limits_accepted_and_one_past_rejected
            ]
            heartbeat: [heartbeat_unknown_node_is_not_found, heartbeat_of_an_owner_succeeds]
            history: [watch_fresh_snapshot_when_history_gone]);
    };
    (@tests [$make:path, $lose_history:path]
        plain: [$($check:ident),*]
        heartbeat: [$($hb:ident),*]
        history: [$history:ident]) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let reg = $make().await;
                $crate::testing::$check(&reg).await;
            }
        )*
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $hb() {
                #[allow(unused_imports)]
                use $crate::testing::probe::{Implements as _, Lacks as _};
                let reg = $make().await;
                match (&$crate::testing::probe::HeartbeatOf(&reg)).get() {
                    Some(hb) => $crate::testing::$hb(&reg, hb).await,
                    None => $crate::testing::skip(
                        stringify!($hb),
                        &reg,
                        "its type does not implement Heartbeat (a stack adds Liveness)",
                    ),
                }
            }
        )*
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $history() {
            let reg = $make().await;
            $crate::testing::$history(&reg, || $lose_history(&reg)).await;
        }
    };
    (@run_all [$reg:expr, $heartbeat:expr, $lose_history:expr]
        plain: [$($check:ident),*]
        heartbeat: [$($hb:ident),*]
        history: [$history:ident]) => {{
        $( $crate::testing::$check($reg).await; )*
        match $heartbeat {
            Some(hb) => { $( $crate::testing::$hb($reg, hb).await; )* }
            None => { $( $crate::testing::skip(stringify!($hb), &$reg, "no Heartbeat given"); )* }
        }
        $crate::testing::$history($reg, $lose_history).await;
    }};
}
