//! Helpers for the checks and for backends' own tests: names, endpoints,
//! bounded waits on conditions and on watch streams, and the one way to
//! make a registry with a bounded history forget it.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use rand::RngExt;

use crate::error::{Error, ErrorKind, Result};
use crate::model::Endpoint;
use crate::snapshot::{Event, Snapshot};
use crate::traits::{EventStream, Registry, Watch};

/// How long a check waits for a condition before it fails. Override with
/// the environment variable `REGISTRY_TEST_TIMEOUT_SECS`.
pub fn wait_limit() -> Duration {
    std::env::var("REGISTRY_TEST_TIMEOUT_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(30))
}

/// A service name no other check uses: `prefix-` plus 12 random hex digits.
pub fn unique(prefix: &str) -> String {
    let n: u64 = rand::rng().random();
    format!("{prefix}-{:012x}", n & 0xffff_ffff_ffff)
}

/// A plain endpoint for tests: `127.0.0.1:port`.
pub fn ep(service: &str, id: &str, port: u16) -> Endpoint {
    Endpoint::new(service, id, "127.0.0.1", port)
}

/// Say on stderr (shown with the test's output) that `check` skipped part
/// of what it can check on `reg`, and why. Every skip in the suite goes
/// through here, so `cargo test -- --nocapture 2>&1 | grep skipped:` lists
/// them all.
pub fn skip(check: &str, reg: &dyn std::fmt::Display, why: &str) {
    eprintln!("skipped: {check} on {reg}: {why}");
}

/// Poll `check` until it returns `Some`, failing with `what` after
/// [`wait_limit`]. Waits 10 ms to 200 ms between tries.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + wait_limit();
    let mut pause = Duration::from_millis(10);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {:?} waiting for {what}",
            wait_limit()
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// The next item of `stream` within [`wait_limit`]: an event, or the
/// failure the watch reported (watches report failures as `Err` items and
/// go on). Panics on timeout or on the end of the stream.
pub async fn next_item(stream: &mut EventStream, what: &str) -> Result<Event> {
    match tokio::time::timeout(wait_limit(), stream.next()).await {
        Ok(Some(item)) => item,
        Ok(None) => panic!("watch ended while waiting for {what}"),
        Err(_) => panic!("timed out after {:?} waiting for {what}", wait_limit()),
    }
}

/// What a wait on a watch does with the `Err` items it meets.
#[derive(Debug, Default)]
pub enum OnErr {
    /// Fail the test: the watch was not expected to report a failure.
    #[default]
    Panic,
    /// Skip them, counting them (a test that causes failures on purpose).
    Count(usize),
}

impl OnErr {
    /// A counter starting at zero.
    pub fn count() -> Self {
        OnErr::Count(0)
    }

    /// How many `Err` items were skipped.
    pub fn errors(&self) -> usize {
        match self {
            OnErr::Panic => 0,
            OnErr::Count(n) => *n,
        }
    }

    fn meet(&mut self, e: Error, what: &str) {
        match self {
            OnErr::Panic => panic!("watch failed while waiting for {what}: {e}"),
            OnErr::Count(n) => *n += 1,
        }
    }
}

/// The next event of `stream` within [`wait_limit`]; panics on timeout, on
/// the end of the stream, or on an `Err` item ([`next_event_with`] can skip
/// those).
pub async fn next_event(stream: &mut EventStream, what: &str) -> Event {
    next_event_with(stream, &mut OnErr::Panic, what).await
}

/// [`next_event`], handling `Err` items as `on_err` says.
pub async fn next_event_with(stream: &mut EventStream, on_err: &mut OnErr, what: &str) -> Event {
    loop {
        match next_item(stream, what).await {
            Ok(ev) => return ev,
            Err(e) => on_err.meet(e, what),
        }
    }
}

/// The next event that concerns `service` (a snapshot always does).
pub async fn next_for(stream: &mut EventStream, service: &str, what: &str) -> Event {
    next_for_with(stream, service, &mut OnErr::Panic, what).await
}

/// [`next_for`], handling `Err` items as `on_err` says.
pub async fn next_for_with(
    stream: &mut EventStream,
    service: &str,
    on_err: &mut OnErr,
    what: &str,
) -> Event {
    loop {
        let ev = next_event_with(stream, on_err, what).await;
        match &ev {
            Event::Snapshot(_) => return ev,
            other if other.key().is_some_and(|k| k.service == service) => return ev,
            _ => {}
        }
    }
}

/// The snapshot a watch from `None` starts with; panics on anything else.
pub async fn first_snapshot(stream: &mut EventStream, what: &str) -> Snapshot {
    match next_event(stream, what).await {
        Event::Snapshot(s) => s,
        other => panic!("{what}: the watch started with {other:?}, not a snapshot"),
    }
}

/// The endpoints of `service` in `snap`, keyed by id.
pub fn service_state(snap: &Snapshot, service: &str) -> BTreeMap<String, Endpoint> {
    snap.service(service)
        .map(|e| (e.id.clone(), e.clone()))
        .collect()
}

/// Read `stream` until the endpoints of `service` equal `want`, applying
/// every event; returns the events seen for that service. Panics on an
/// `Err` item ([`follow_until_with`] can skip those).
pub async fn follow_until(
    stream: &mut EventStream,
    state: &mut Snapshot,
    service: &str,
    want: &[Endpoint],
) -> Vec<Event> {
    follow_until_with(stream, state, service, want, &mut OnErr::Panic).await
}

/// [`follow_until`], handling `Err` items as `on_err` says.
pub async fn follow_until_with(
    stream: &mut EventStream,
    state: &mut Snapshot,
    service: &str,
    want: &[Endpoint],
    on_err: &mut OnErr,
) -> Vec<Event> {
    let want: BTreeMap<String, Endpoint> = want.iter().map(|e| (e.id.clone(), e.clone())).collect();
    let mut seen = Vec::new();
    while service_state(state, service) != want {
        let what = format!("{service} to reach {want:?}");
        let ev = next_for_with(stream, service, on_err, &what).await;
        state.apply(&ev);
        seen.push(ev);
    }
    seen
}

/// Make a registry whose watch history is a window of the last changes
/// forget everything written so far: write `n` endpoints (more than the
/// window) in a service of their own, then wait until a new watch has seen
/// all of them, so that a poller has taken them into its history too.
/// The one "lose history" for backends without a compaction of their own
/// (memory, gossip, DynamoDB, the polling ones, the registrar client).
pub async fn overflow_history<R: Registry + Watch + ?Sized>(reg: &R, n: usize) {
    let svc = unique("filler");
    let fill: Vec<Endpoint> = (0..n)
        .map(|i| ep(&svc, &format!("f{i:04}"), 1 + (i % 60_000) as u16))
        .collect();
    for e in &fill {
        reg.register(e.clone()).await.expect("filler write");
    }
    let mut w = reg.watch(None);
    let mut state = first_snapshot(&mut w, "the filler's watch").await;
    follow_until(&mut w, &mut state, &svc, &fill).await;
}

/// Kinds of error a check may assert on, re-exported for backends' tests.
pub use crate::error::ErrorKind as Kind;

/// Assert that `res` failed with `kind`.
pub fn assert_kind<T: std::fmt::Debug>(res: Result<T>, kind: ErrorKind) -> Error {
    match res {
        Err(e) if e.kind() == kind => e,
        other => panic!("expected a {kind} error, got {other:?}"),
    }
}

/// Assert that `res` is `InvalidInput` naming exactly `field`, and that its
/// message names it too; `case` says what was tried.
pub fn expect_invalid<T: std::fmt::Debug>(res: Result<T>, field: &str, case: &str) {
    match res {
        Err(Error::InvalidInput {
            field: f, reason, ..
        }) => {
            assert_eq!(f, field, "{case}: wrong field named (reason: {reason})");
            let msg = Error::invalid(f.clone(), reason).to_string();
            assert!(
                msg.contains(field),
                "{case}: message {msg:?} does not name {field}"
            );
        }
        other => panic!("{case}: expected InvalidInput naming {field}, got {other:?}"),
    }
}
