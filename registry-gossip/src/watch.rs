//! The watch: the replica's visible changes as versioned registry events.
//!
//! Every [`Change`] the machine reports becomes an `Added`, `Updated` or
//! `Removed` event numbered by a [`Version`] counter local to this node
//! (monotonic for the node's lifetime, not comparable across nodes), and
//! is published to the node's [`Hub`], which keeps the current snapshot,
//! fans the events out to subscribers and resumes them from a version
//! still in its history.

use waypost::{backend::Hub, Event, Version};

use crate::crdt::Change;

/// Number `changes` after `version` and publish them to `hub`; `version`
/// ends at the last event's. Nothing happens for no changes.
pub(crate) fn publish(hub: &Hub, version: &mut Version, changes: Vec<Change>) {
    if changes.is_empty() {
        return;
    }
    let events = to_events(version, changes);
    hub.publish(events);
}

/// `changes` as events numbered after `version`, which moves along. A
/// change with nothing before and nothing after is no event.
fn to_events(version: &mut Version, changes: Vec<Change>) -> Vec<Event> {
    changes
        .into_iter()
        .filter_map(|c| {
            let next = version.next();
            let ev = match (c.before, c.after) {
                (None, Some(endpoint)) => Event::Added {
                    version: next,
                    endpoint,
                },
                (Some(_), Some(endpoint)) => Event::Updated {
                    version: next,
                    endpoint,
                },
                (Some(_), None) => Event::Removed {
                    version: next,
                    key: c.key,
                },
                (None, None) => return None,
            };
            *version = next;
            Some(ev)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use waypost::{Endpoint, EndpointKey};

    #[test]
    fn changes_become_numbered_events() {
        let ep = Endpoint::new("s", "a", "10.0.0.1", 1);
        let key: EndpointKey = ep.key();
        let change = |before: Option<&Endpoint>, after: Option<&Endpoint>| Change {
            key: key.clone(),
            before: before.cloned(),
            after: after.cloned(),
        };
        let mut version = Version::ZERO;
        let events = to_events(
            &mut version,
            vec![
                change(None, Some(&ep)),
                change(None, None),
                change(Some(&ep), Some(&ep)),
                change(Some(&ep), None),
            ],
        );
        let v1 = Version::ZERO.next();
        let v2 = v1.next();
        let v3 = v2.next();
        assert_eq!(
            events,
            vec![
                Event::Added {
                    version: v1,
                    endpoint: ep.clone(),
                },
                Event::Updated {
                    version: v2,
                    endpoint: ep.clone(),
                },
                Event::Removed {
                    version: v3,
                    key: key.clone(),
                },
            ]
        );
        assert_eq!(version, v3);
    }
}
