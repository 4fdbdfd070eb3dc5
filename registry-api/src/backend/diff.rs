//! [`diff`]: the events between two snapshots.

use crate::model::{Endpoint, EndpointKey, Version};
use crate::snapshot::{Event, Snapshot};

/// The events that turn `old` into `new`, each at `new`'s version, ordered
/// by key.
///
/// Where `new` was derived from `old` (as in a cache), the persistent maps
/// share structure and shared parts are skipped: the cost grows with the
/// change. Two snapshots built independently (a fresh read after a lost
/// watch) are compared service by service: each snapshot keeps, per
/// service, the XOR of its endpoints' fingerprints (seeded 128-bit XXH3 of
/// the whole endpoint, computed when it enters the snapshot) and their
/// count, so a service whose endpoints did not change is passed over
/// whole, and only the services that differ are walked endpoint by
/// endpoint. Two different endpoint sets would be taken as equal only on a
/// 128-bit hash collision, about 2^-128 per compared service.
///
/// ```
/// use waypost::backend::diff;
/// use waypost::{Endpoint, Snapshot, Version};
/// let a = Snapshot::from_endpoints(Version(1), [Endpoint::new("s", "a", "h", 1)]);
/// let b = Snapshot::from_endpoints(Version(2), [Endpoint::new("s", "b", "h", 1)]);
/// let events = diff(&a, &b);
/// assert_eq!(events.len(), 2); // a removed, b added
/// assert!(a.with_event(&events[0]).with_event(&events[1]).same_endpoints(&b));
/// ```
pub fn diff(old: &Snapshot, new: &Snapshot) -> Vec<Event> {
    if old.shares_structure_with(new) {
        derived(old, new)
    } else {
        independent(old, new)
    }
}

fn added(version: Version, endpoint: &Endpoint) -> Event {
    Event::Added {
        version,
        endpoint: endpoint.clone(),
    }
}

fn updated(version: Version, endpoint: &Endpoint) -> Event {
    Event::Updated {
        version,
        endpoint: endpoint.clone(),
    }
}

fn removed(version: Version, key: &EndpointKey) -> Event {
    Event::Removed {
        version,
        key: key.clone(),
    }
}

/// The map's own diff, which skips subtrees the two share.
fn derived(old: &Snapshot, new: &Snapshot) -> Vec<Event> {
    use imbl::ordmap::DiffItem;
    let version = new.version();
    old.changes(new)
        .map(|item| match item {
            DiffItem::Add(_, e) => added(version, &e.endpoint),
            DiffItem::Update { new: (_, e), .. } => updated(version, &e.endpoint),
            DiffItem::Remove(k, _) => removed(version, k),
        })
        .collect()
}

/// Service by service: where a service's fingerprint (the XOR of its
/// endpoints' fingerprints, and their count) agrees, it is skipped whole;
/// the others are merged endpoint by endpoint.
fn independent(old: &Snapshot, new: &Snapshot) -> Vec<Event> {
    let version = new.version();
    let mut events = Vec::new();
    merge(
        old.service_sums(),
        new.service_sums(),
        |(a, sa), (b, sb)| (a.cmp(b), sa == sb),
        |side| match side {
            Side::Old((name, _)) | Side::New((name, _)) | Side::Both((name, _), _) => {
                merge(
                    old.service_entries(name),
                    new.service_entries(name),
                    |(ka, ea), (kb, eb)| (ka.cmp(kb), ea.print == eb.print),
                    |change| {
                        events.push(match change {
                            Side::Old((key, _)) => removed(version, key),
                            Side::New((_, e)) => added(version, &e.endpoint),
                            Side::Both(_, (_, e)) => updated(version, &e.endpoint),
                        })
                    },
                );
            }
        },
    );
    events
}

/// Which of two merged sequences an item that differs comes from.
enum Side<T> {
    Old(T),
    New(T),
    Both(T, T),
}

/// Walk two sequences ordered by the same key; `cmp` orders two items and
/// tells whether they are equal; `differ` gets every item only one side
/// has, and every pair with the same key that is not equal.
fn merge<T: Copy>(
    old: impl Iterator<Item = T>,
    new: impl Iterator<Item = T>,
    cmp: impl Fn(T, T) -> (std::cmp::Ordering, bool),
    mut differ: impl FnMut(Side<T>),
) {
    use std::cmp::Ordering;
    let (mut a, mut b) = (old.peekable(), new.peekable());
    loop {
        match (a.peek().copied(), b.peek().copied()) {
            (Some(x), Some(y)) => match cmp(x, y) {
                (Ordering::Less, _) => {
                    differ(Side::Old(x));
                    a.next();
                }
                (Ordering::Greater, _) => {
                    differ(Side::New(y));
                    b.next();
                }
                (Ordering::Equal, same) => {
                    if !same {
                        differ(Side::Both(x, y));
                    }
                    a.next();
                    b.next();
                }
            },
            (Some(x), None) => {
                differ(Side::Old(x));
                a.next();
            }
            (None, Some(y)) => {
                differ(Side::New(y));
                b.next();
            }
            (None, None) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        fn both_walks_agree_on_derived_snapshots(
            a in arb_snapshot(),
            b in arb_snapshot(),
            cut in 0usize..40,
        ) {
            // `c` derives from `a` by part of the way to `b`.
            let mut c = a.clone();
            for ev in diff(&a, &b).into_iter().take(cut) {
                c.apply(&ev);
            }
            let rebuilt = Snapshot::from_endpoints(c.version(), c.iter().cloned());
            prop_assert_eq!(derived(&a, &c), independent(&a, &rebuilt));
            prop_assert_eq!(independent(&a, &c), derived(&a, &c));
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
