//! The checks of [`Watch`]: the first snapshot, order and exactly-once
//! delivery (native watches), resuming, lost history, two watchers.

use std::future::Future;

use super::support::{ep, follow_until, next_event, next_for, skip, unique};
use crate::model::{Endpoint, EndpointKey, Op, Version};
use crate::snapshot::Event;
use crate::traits::{Registry, Watch};

/// A watch from `None` starts with a snapshot holding what exists.
pub async fn watch_starts_with_snapshot<R: Registry + Watch + ?Sized>(reg: &R) {
    let svc = unique("watch-snap");
    let eps = vec![ep(&svc, "a", 1), ep(&svc, "b", 2)];
    for e in &eps {
        reg.register(e.clone()).await.expect("register");
    }
    let mut w = reg.watch(None);
    match next_event(&mut w, "the first event").await {
        Event::Snapshot(s) => {
            // A polling backend may take a cycle to see the writes; it must
            // still start with a snapshot, then converge.
            let mut state = s;
            follow_until(&mut w, &mut state, &svc, &eps).await;
        }
        other => panic!("watch(None) started with {other:?}, not a snapshot"),
    }
}

/// The changes a scenario makes, and what a native watch must report.
fn scenario(svc: &str) -> (Vec<Op>, Vec<(&'static str, String)>, Vec<Endpoint>) {
    let ops = vec![
        Op::Register(ep(svc, "a", 1)),
        Op::Register(ep(svc, "b", 2)),
        Op::Register(ep(svc, "a", 11)),
        Op::Deregister(EndpointKey::new(svc, "b")),
        Op::Register(ep(svc, "c", 3)),
    ];
    let expected = [
        ("added", "a"),
        ("added", "b"),
        ("updated", "a"),
        ("removed", "b"),
        ("added", "c"),
    ]
    .iter()
    .map(|(k, id)| (*k, id.to_string()))
    .collect();
    (ops, expected, vec![ep(svc, "a", 11), ep(svc, "c", 3)])
}

async fn run_ops<R: Registry + ?Sized>(reg: &R, ops: &[Op]) {
    for op in ops {
        match op {
            Op::Register(e) => reg.register(e.clone()).await.expect("register"),
            Op::Deregister(k) => reg.deregister(k).await.expect("deregister"),
        }
    }
}

pub(super) fn summary(events: &[Event]) -> Vec<(&'static str, String)> {
    events
        .iter()
        .filter_map(|e| e.key().map(|k| (e.type_name(), k.id)))
        .collect()
}

fn assert_in_order(events: &[Event], expected: &[(&'static str, String)], after: Version) {
    assert_eq!(
        summary(events),
        expected,
        "events out of order, missing, repeated or of the wrong kind"
    );
    let mut last = after;
    for e in events {
        assert!(
            e.version() > after && e.version() >= last,
            "version {} is not after {last}",
            e.version()
        );
        last = e.version();
    }
}

/// A watch delivers every change after its snapshot, in order, exactly once
/// (native watch); a polling watch converges on the final state.
pub async fn watch_delivers_changes_in_order_once<R: Registry + Watch + ?Sized>(reg: &R) {
    let svc = unique("watch-order");
    let mut w = reg.watch(None);
    let first = next_event(&mut w, "the first snapshot").await;
    let Event::Snapshot(mut state) = first else {
        panic!("watch(None) started with {first:?}");
    };
    let start = state.version();
    let (ops, expected, fin) = scenario(&svc);
    run_ops(reg, &ops).await;
    let seen = follow_until(&mut w, &mut state, &svc, &fin).await;
    if reg.capabilities().native_watch {
        assert_in_order(&seen, &expected, start);
        // Exactly once: the next event for this service is the marker, not
        // a repeat of something already delivered.
        let marker = ep(&svc, "marker", 9);
        reg.register(marker.clone()).await.expect("register marker");
        match next_for(&mut w, &svc, "the marker").await {
            Event::Added { endpoint, .. } => assert_eq!(endpoint, marker),
            other => panic!("expected the marker's Added, got {other:?}"),
        }
    } else {
        skip(
            "watch_delivers_changes_in_order_once",
            &reg,
            "every intermediate change in order, because capabilities say native_watch = false \
             (checked: the watch converges on the final state)",
        );
    }
}

/// A watch resumed from the last version it saw loses nothing and repeats
/// nothing; without resumable history it starts over with a snapshot.
pub async fn watch_resume_loses_nothing<R: Registry + Watch + ?Sized>(reg: &R) {
    let svc = unique("watch-resume");
    let first = ep(&svc, "first", 1);
    let mut w = reg.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "the first snapshot").await else {
        panic!("watch(None) did not start with a snapshot");
    };
    reg.register(first.clone()).await.expect("register");
    follow_until(&mut w, &mut state, &svc, std::slice::from_ref(&first)).await;
    let resume_at = state.version();
    drop(w);
    let missed = vec![ep(&svc, "m1", 2), ep(&svc, "m2", 3)];
    for e in &missed {
        reg.register(e.clone()).await.expect("register while away");
    }
    reg.deregister(&first.key())
        .await
        .expect("deregister while away");
    let mut w = reg.watch(Some(resume_at));
    let seen = follow_until(&mut w, &mut state, &svc, &missed).await;
    let caps = reg.capabilities();
    if caps.resumable_watch && caps.native_watch {
        assert_eq!(
            summary(&seen),
            vec![
                ("added", "m1".to_string()),
                ("added", "m2".to_string()),
                ("removed", "first".to_string())
            ],
            "resumed watch from {resume_at}"
        );
        assert!(
            seen.iter().all(|e| e.version() > resume_at),
            "resumed watch repeated an event at or before {resume_at}"
        );
    } else {
        skip(
            "watch_resume_loses_nothing",
            &reg,
            &format!(
                "exactly the missed changes, because capabilities say resumable_watch = {} and \
                 native_watch = {} (checked: the resumed watch converges)",
                caps.resumable_watch, caps.native_watch
            ),
        );
    }
}

/// When the history after `from` is gone (`lose_history` makes sure of
/// it), the watch starts with a fresh snapshot holding the current state.
pub async fn watch_fresh_snapshot_when_history_gone<R, F, Fut>(reg: &R, lose_history: F)
where
    R: Registry + Watch + ?Sized,
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let svc = unique("watch-gone");
    let mut w = reg.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "the first snapshot").await else {
        panic!("watch(None) did not start with a snapshot");
    };
    let a = ep(&svc, "a", 1);
    reg.register(a.clone()).await.expect("register a");
    follow_until(&mut w, &mut state, &svc, std::slice::from_ref(&a)).await;
    let old = state.version();
    drop(w);
    let b = ep(&svc, "b", 2);
    reg.register(b.clone()).await.expect("register b");
    lose_history().await;
    let mut w = reg.watch(Some(old));
    match next_event(&mut w, "a fresh snapshot").await {
        Event::Snapshot(mut s) => {
            assert!(s.version() >= old, "fresh snapshot is older than {old}");
            follow_until(&mut w, &mut s, &svc, &[a, b]).await;
        }
        other => panic!("history after {old} is gone, but the watch sent {other:?}"),
    }
}

/// Two watchers see the same changes.
pub async fn two_watchers_agree<R: Registry + Watch + ?Sized>(reg: &R) {
    let svc = unique("two-watchers");
    let mut w1 = reg.watch(None);
    let mut w2 = reg.watch(None);
    let mut s1 = match next_event(&mut w1, "snapshot 1").await {
        Event::Snapshot(s) => s,
        other => panic!("watcher 1 started with {other:?}"),
    };
    let mut s2 = match next_event(&mut w2, "snapshot 2").await {
        Event::Snapshot(s) => s,
        other => panic!("watcher 2 started with {other:?}"),
    };
    let (ops, _, fin) = scenario(&svc);
    run_ops(reg, &ops).await;
    let e1 = follow_until(&mut w1, &mut s1, &svc, &fin).await;
    let e2 = follow_until(&mut w2, &mut s2, &svc, &fin).await;
    if reg.capabilities().native_watch {
        assert_eq!(summary(&e1), summary(&e2), "the two watchers disagree");
    } else {
        skip(
            "two_watchers_agree",
            &reg,
            "the same sequence of changes, because capabilities say native_watch = false \
             (checked: both converge on the same state)",
        );
    }
}
