//! [`diff`]: the events between two snapshots.

use crate::snapshot::{Event, Snapshot};

/// The events that turn `old` into `new`, each at `new`'s version, ordered
/// by key.
///
/// Both snapshots are persistent maps: where `new` was derived from `old`
/// (as in a cache), shared structure is skipped and the cost grows with the
/// change; two snapshots built independently are compared key by key.
///
/// ```
/// use registry_api::backend::diff;
/// use registry_api::{Endpoint, Snapshot, Version};
/// let a = Snapshot::from_endpoints(Version(1), [Endpoint::new("s", "a", "h", 1)]);
/// let b = Snapshot::from_endpoints(Version(2), [Endpoint::new("s", "b", "h", 1)]);
/// let events = diff(&a, &b);
/// assert_eq!(events.len(), 2); // a removed, b added
/// assert!(a.with_event(&events[0]).with_event(&events[1]).same_endpoints(&b));
/// ```
pub fn diff(old: &Snapshot, new: &Snapshot) -> Vec<Event> {
    use imbl::ordmap::DiffItem;
    let version = new.version();
    old.changes(new)
        .map(|item| match item {
            DiffItem::Add(_, e) => Event::Added {
                version,
                endpoint: e.clone(),
            },
            DiffItem::Update { new: (_, e), .. } => Event::Updated {
                version,
                endpoint: e.clone(),
            },
            DiffItem::Remove(k, _) => Event::Removed {
                version,
                key: k.clone(),
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Endpoint, Version};
    use proptest::prelude::*;

    fn arb_snapshot() -> impl Strategy<Value = Snapshot> {
        let ep = (0u8..4, 0u8..12, 1u16..4, any::<bool>()).prop_map(|(s, i, port, unhealthy)| {
            let mut e = Endpoint::new(format!("s{s}"), format!("i{i}"), "h", port);
            if unhealthy {
                e.health = crate::model::Health::Unhealthy;
            }
            e
        });
        (0u64..1000, proptest::collection::vec(ep, 0..40))
            .prop_map(|(v, eps)| Snapshot::from_endpoints(Version(v), eps))
    }

    proptest! {
        #[test]
        fn applying_the_diff_yields_the_target(a in arb_snapshot(), b in arb_snapshot()) {
            let mut got = a.clone();
            for ev in diff(&a, &b) {
                got.apply(&ev);
            }
            prop_assert!(got.same_endpoints(&b));
        }

        #[test]
        fn diff_of_equal_is_empty_and_derived_copies_diff_small(a in arb_snapshot()) {
            prop_assert!(diff(&a, &a.clone()).is_empty());
            let e = Endpoint::new("zz", "new", "h", 9);
            let b = a.with_endpoint(e.clone());
            let d = diff(&a, &b);
            prop_assert_eq!(d.len(), 1);
            let added = matches!(&d[0], Event::Added { endpoint, .. } if *endpoint == e);
            prop_assert!(added);
        }
    }
}
