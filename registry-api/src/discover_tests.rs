//! Tests of [`super::Discovery`].

#![allow(clippy::unwrap_used)]

use super::*;
use crate::error::Error;
use crate::testing::ep;
use futures::stream;

fn added(v: u64, e: Endpoint) -> Result<Event> {
    Ok(Event::Added {
        version: Version(v),
        endpoint: e,
    })
}

fn updated(v: u64, e: Endpoint) -> Result<Event> {
    Ok(Event::Updated {
        version: Version(v),
        endpoint: e,
    })
}

fn removed(v: u64, e: &Endpoint) -> Result<Event> {
    Ok(Event::Removed {
        version: Version(v),
        key: e.key(),
    })
}

fn snap(v: u64, eps: impl IntoIterator<Item = Endpoint>) -> Result<Event> {
    Ok(Event::Snapshot(Snapshot::from_endpoints(Version(v), eps)))
}

/// The changes as `+id:port` / `-id`, the service being the port.
async fn run(d: Discovery<u16>) -> Vec<String> {
    d.map(|c| match c.unwrap() {
        Change::Insert(k, port) => format!("+{}:{port}", k.id),
        Change::Remove(k) => format!("-{}", k.id),
    })
    .collect()
    .await
}

fn from(events: Vec<Result<Event>>) -> Discovery<u16> {
    Discovery::from_stream(stream::iter(events), |e| e.port)
}

#[tokio::test]
async fn first_snapshot_inserts_then_deltas() {
    let a = ep("api", "a", 1);
    let d = from(vec![
        snap(1, [a.clone(), ep("api", "b", 2)]),
        added(2, ep("api", "c", 3)),
        removed(3, &a),
        removed(4, &ep("api", "never", 9)),
    ]);
    assert_eq!(run(d).await, ["+a:1", "+b:2", "+c:3", "-a"]);
}

#[tokio::test]
async fn resync_snapshot_yields_only_the_difference() {
    let d = from(vec![
        snap(1, [ep("api", "a", 1), ep("api", "b", 2), ep("api", "c", 3)]),
        // a unchanged, b gone, c moved to a new port, d new.
        snap(
            9,
            [ep("api", "a", 1), ep("api", "c", 30), ep("api", "d", 4)],
        ),
        // The same again: nothing.
        snap(
            10,
            [ep("api", "a", 1), ep("api", "c", 30), ep("api", "d", 4)],
        ),
    ]);
    assert_eq!(
        run(d).await,
        ["+a:1", "+b:2", "+c:3", "-b", "-c", "+c:30", "+d:4"]
    );
}

#[tokio::test]
async fn health_changes_remove_and_insert() {
    let a = ep("api", "a", 1);
    let sick = a.clone().with_health(Health::Unhealthy);
    let d = from(vec![
        snap(
            1,
            [a.clone(), ep("api", "b", 2).with_health(Health::Unhealthy)],
        ),
        updated(2, sick.clone()),
        updated(3, sick.clone()),
        updated(4, a.clone()),
        snap(5, [sick]),
    ]);
    assert_eq!(run(d).await, ["+a:1", "-a", "+a:1", "-a"]);
}

#[tokio::test]
async fn include_unhealthy_keeps_them() {
    let a = ep("api", "a", 1);
    let d = from(vec![
        snap(1, [a.clone().with_health(Health::Unhealthy)]),
        updated(2, a),
    ])
    .include_unhealthy();
    assert_eq!(run(d).await, ["+a:1"]);
}

#[tokio::test]
async fn updates_rebuild_only_on_address_changes() {
    let a = ep("api", "a", 1);
    let d = from(vec![
        added(1, a.clone()),
        updated(2, a.clone().with_label("weight", "5")),
        updated(3, a.clone().with_label("weight", "5")),
        updated(4, ep("api", "a", 11)),
        updated(5, Endpoint::new("api", "a", "127.0.0.2", 11)),
    ]);
    assert_eq!(run(d).await, ["+a:1", "-a", "+a:11", "-a", "+a:11"]);

    let d = from(vec![
        added(1, a.clone()),
        updated(2, a.clone().with_label("weight", "5")),
    ])
    .rebuild_if(|old, new| old != new);
    assert_eq!(run(d).await, ["+a:1", "-a", "+a:1"]);
}

#[tokio::test]
async fn service_and_filter() {
    let d = from(vec![
        snap(
            1,
            [
                ep("api", "a", 1).with_label("zone", "x"),
                ep("api", "b", 2).with_label("zone", "y"),
                ep("search", "s", 3).with_label("zone", "x"),
            ],
        ),
        added(2, ep("search", "t", 4).with_label("zone", "x")),
        // a leaves zone x: removed; b joins it: inserted.
        updated(3, ep("api", "a", 1).with_label("zone", "y")),
        updated(4, ep("api", "b", 2).with_label("zone", "x")),
    ])
    .service("api")
    .filter(|e| e.labels.get("zone").map(String::as_str) == Some("x"));
    assert_eq!(run(d).await, ["+a:1", "-a", "+b:2"]);
}

#[tokio::test]
async fn errors_pass_through_from_a_plain_stream() {
    let mut d = from(vec![
        added(1, ep("api", "a", 1)),
        Err(Error::unavailable("backend down")),
        added(2, ep("api", "b", 2)),
    ]);
    assert!(matches!(d.next().await, Some(Ok(Change::Insert(..)))));
    assert!(d.next().await.unwrap().is_err());
    assert_eq!(d.len(), 1);
    assert!(d.next().await.is_none());
    assert!(d.next().await.is_none(), "stays ended");
}

#[tokio::test(start_paused = true)]
async fn discover_watches_again_after_an_error_and_diffs_the_snapshot() {
    use std::sync::Mutex;

    /// Streams still to hand out, and the `from` of each call.
    type Script = (Vec<Vec<Result<Event>>>, Vec<Option<Version>>);
    /// Hands out prepared streams, recording the `from` of each call.
    struct Scripted(Mutex<Script>);
    impl Watch for Scripted {
        fn watch(&self, from: Option<Version>) -> EventStream {
            let mut s = self.0.lock().unwrap();
            s.1.push(from);
            if s.0.is_empty() {
                return stream::pending().boxed();
            }
            // A prepared stream ends after its last item, as a watch
            // does after a failure it does not retry itself.
            stream::iter(s.0.remove(0)).boxed()
        }
    }
    let a = ep("api", "a", 1);
    let b = ep("api", "b", 2);
    let scripted = Arc::new(Scripted(Mutex::new((
        vec![
            vec![
                snap(1, [a.clone()]),
                added(2, b.clone()),
                Err(Error::unavailable("lost")),
            ],
            // The source lost history: a fresh snapshot without a.
            vec![snap(7, [b.clone()])],
        ],
        Vec::new(),
    ))));
    let mut d = discover(Arc::clone(&scripted), |e| e.port);
    let mut seen = Vec::new();
    for _ in 0..3 {
        match d.next().await.unwrap().unwrap() {
            Change::Insert(k, _) => seen.push(format!("+{}", k.id)),
            Change::Remove(k) => seen.push(format!("-{}", k.id)),
        }
    }
    assert_eq!(seen, ["+a", "+b", "-a"]);
    assert_eq!(d.version(), Some(Version(7)));
    assert_eq!(scripted.0.lock().unwrap().1, [None, Some(Version(2))]);
    assert_eq!(
        d.endpoints().map(|e| e.id.as_str()).collect::<Vec<_>>(),
        ["b"]
    );
}

#[tokio::test]
async fn draining_endpoints_are_removed_even_with_unhealthy_ones_included() {
    let a = ep("api", "a", 1);
    let d = from(vec![
        snap(
            1,
            [a.clone(), ep("api", "b", 2).with_health(Health::Draining)],
        ),
        updated(2, a.clone().with_health(Health::Draining)),
        updated(3, a.clone()),
    ])
    .include_unhealthy();
    assert_eq!(run(d).await, ["+a:1", "-a", "+a:1"]);
}

#[tokio::test]
async fn the_preferred_zone_takes_everything_while_it_holds_and_spreads_after() {
    use crate::traffic::ZonePreference;
    let z = |id: &str, port: u16, zone: &str| ep("api", id, port).with_zone(zone);
    let (a1, a2) = (z("a1", 1, "a"), z("a2", 2, "a"));
    let d = from(vec![
        snap(1, [a1.clone(), z("b1", 3, "b"), z("c1", 4, "c")]),
        added(2, a2.clone()),
        // a loses one of two: still holds.
        updated(3, a1.clone().with_health(Health::Unhealthy)),
        // ... and its last: spread over everything healthy.
        updated(4, a2.clone().with_health(Health::Draining)),
        // One is back: in the zone again.
        updated(5, a1.clone()),
        // A label-only change (weight) is no new service.
        updated(6, a1.clone().with_weight(4)),
    ])
    .prefer_zone(ZonePreference::new("a"));
    assert_eq!(
        run(d).await,
        ["+a1:1", "+a2:2", "-a1", "-a2", "+b1:3", "+c1:4", "-b1", "-c1", "+a1:1"]
    );

    // With a floor of two endpoints, one is not enough.
    let mut d = from(vec![snap(1, [a1.clone(), z("b1", 3, "b")]), added(2, a2)])
        .prefer_zone(ZonePreference::new("a").with_floor(2, 0.0));
    let mut seen = Vec::new();
    while let Some(c) = d.next().await {
        seen.push(match c.unwrap() {
            Change::Insert(k, _) => format!("+{}", k.id),
            Change::Remove(k) => format!("-{}", k.id),
        });
    }
    assert_eq!(seen, ["+a1", "+b1", "-b1", "+a2"]);
    assert_eq!(
        d.endpoints().map(|e| e.id.as_str()).collect::<Vec<_>>(),
        ["a1", "a2"]
    );
}

#[tokio::test]
async fn endpoints_show_label_only_changes() {
    let a = ep("api", "a", 1);
    let mut d = from(vec![
        added(1, a.clone()),
        updated(2, a.clone().with_weight(7)),
    ]);
    let mut n = 0;
    while let Some(c) = d.next().await {
        c.unwrap();
        n += 1;
    }
    assert_eq!(n, 1, "one insert, no rebuild");
    assert_eq!(d.endpoint(&a.key()).map(Endpoint::weight), Some(7));
}
