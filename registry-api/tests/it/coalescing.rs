//! `Coalescing`: net effect, chunking, retries through failures, a full
//! queue, draining.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use waypost::testing::{ep, next_event, Faulty};
use waypost::{
    coalescing::{Coalescing, CoalescingConfig},
    memory::MemoryRegistry,
    Batch, EndpointKey, Error, ErrorKind, Event, Op, Registry, Watch,
};

/// A config that never flushes by itself: only `flush()` moves ops.
fn manual() -> CoalescingConfig {
    CoalescingConfig::default()
        .with_flush_interval(Duration::from_secs(3600))
        .with_flush_ops(1_000_000)
        .with_retry(Duration::from_millis(1), Duration::from_millis(5))
}

fn faulty_memory(max_batch: usize) -> Faulty<MemoryRegistry> {
    Faulty::new(MemoryRegistry::new().with_max_batch(max_batch))
}

#[tokio::test]
async fn net_effect_per_key_within_a_flush() {
    let reg = Coalescing::with_config(faulty_memory(1000), manual()).unwrap();
    let kept = ep("s", "kept", 1);
    reg.get_ref()
        .get_ref()
        .register(kept.clone())
        .await
        .unwrap();
    let ops = vec![
        // register then deregister = deregister (nothing stored)
        Op::Register(ep("s", "a", 1)),
        Op::Deregister(EndpointKey::new("s", "a")),
        // deregister then register = register
        Op::Deregister(kept.key()),
        Op::Register(ep("s", "kept", 2)),
        // two registers = the later one
        Op::Register(ep("s", "b", 1)),
        Op::Register(ep("s", "b", 2)),
    ];
    reg.apply(ops).await.unwrap();
    assert_eq!(reg.queue_depth(), 6);
    reg.flush().await;
    assert_eq!(reg.queue_depth(), 0);
    let inner = reg.get_ref();
    assert_eq!(inner.batches(), vec![3], "three keys, one op each");
    assert_eq!(
        inner.get_ref().list("s").await.unwrap(),
        vec![ep("s", "b", 2), ep("s", "kept", 2)]
    );
}

#[tokio::test]
async fn chunks_at_max_batch() {
    let reg = Coalescing::with_config(faulty_memory(10), manual()).unwrap();
    let ops = (0..25)
        .map(|i| Op::Register(ep("s", &format!("e{i:02}"), 1)))
        .collect();
    reg.apply(ops).await.unwrap();
    reg.flush().await;
    assert_eq!(reg.get_ref().batches(), vec![10, 10, 5]);
    assert_eq!(reg.get_ref().get_ref().list("s").await.unwrap().len(), 25);
}

#[tokio::test]
async fn flushes_by_itself_at_the_op_threshold_and_on_the_interval() {
    let cfg = CoalescingConfig::default()
        .with_flush_ops(5)
        .with_flush_interval(Duration::from_secs(3600));
    let reg = Coalescing::with_config(faulty_memory(1000), cfg).unwrap();
    for i in 0..5 {
        reg.register(ep("s", &format!("e{i}"), 1)).await.unwrap();
    }
    waypost::testing::eventually("the threshold flush", || async {
        (reg.get_ref().get_ref().list("s").await.unwrap().len() == 5).then_some(())
    })
    .await;

    let cfg = CoalescingConfig::default().with_flush_interval(Duration::from_millis(20));
    let reg = Coalescing::with_config(faulty_memory(1000), cfg).unwrap();
    reg.register(ep("t", "one", 1)).await.unwrap();
    waypost::testing::eventually("the interval flush", || async {
        (reg.get_ref().get_ref().list("t").await.unwrap().len() == 1).then_some(())
    })
    .await;
}

/// The backend fails N times, then recovers: every op is applied exactly
/// once, in order.
#[tokio::test]
async fn failures_then_recovery_apply_everything_once_in_order() {
    // Never split here: this counts calls of whole chunks.
    let reg = Coalescing::with_config(faulty_memory(4), manual().with_split_after(100)).unwrap();
    let mut events = reg.get_ref().get_ref().watch(None);
    assert!(matches!(
        next_event(&mut events, "snapshot").await,
        Event::Snapshot(_)
    ));
    let mut expected = Vec::new();
    for round in 0..5u16 {
        reg.get_ref().fail_writes(3);
        for i in 0..6u16 {
            let e = ep("s", &format!("k{i}"), 100 * round + i + 1);
            expected.push((e.id.clone(), e.port));
            reg.register(e).await.unwrap();
        }
        reg.flush().await;
    }
    let mut seen = Vec::new();
    while seen.len() < expected.len() {
        match next_event(&mut events, "applied ops").await {
            Event::Added { endpoint, .. } | Event::Updated { endpoint, .. } => {
                seen.push((endpoint.id, endpoint.port))
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, expected, "ops applied out of order, twice, or lost");
    // 3 failures per round, 2 chunks of 4 and 2 per round.
    assert_eq!(reg.get_ref().write_calls(), 5 * (3 + 2));
    assert!(
        tokio::time::timeout(Duration::from_millis(50), events.next())
            .await
            .is_err(),
        "an op was applied more than once"
    );
}

#[tokio::test]
async fn full_queue_is_overloaded_and_loses_nothing() {
    let cfg = manual().with_capacity(10);
    let reg = Arc::new(Coalescing::with_config(faulty_memory(1000), cfg).unwrap());
    reg.get_ref().set_down(true);
    for i in 0..10 {
        reg.register(ep("s", &format!("e{i}"), 1)).await.unwrap();
    }
    // The flusher takes the ops and retries against the dead backend...
    let flushing = tokio::spawn({
        let reg = Arc::clone(&reg);
        async move { reg.flush().await }
    });
    waypost::testing::eventually("the flusher to retry", || async {
        (reg.get_ref().write_calls() >= 2).then_some(())
    })
    .await;
    // ...and in-flight ops still count against the bound.
    let err = reg.register(ep("s", "one-too-many", 1)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Overloaded);
    assert!(err.to_string().contains("10 of 10"), "{err}");
    let err = reg
        .apply(vec![Op::Register(ep("s", "x", 1))])
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Overloaded);
    assert_eq!(reg.queue_depth(), 10);
    reg.get_ref().set_down(false);
    flushing.await.unwrap();
    let got = reg.get_ref().get_ref().list("s").await.unwrap();
    assert_eq!(got.len(), 10, "queued ops were lost: {got:?}");
}

#[tokio::test]
async fn shutdown_drains_and_then_refuses() {
    let reg = Coalescing::with_config(faulty_memory(7), manual()).unwrap();
    for i in 0..100 {
        reg.register(ep("s", &format!("e{i}"), 1)).await.unwrap();
    }
    reg.shutdown().await;
    assert_eq!(reg.get_ref().get_ref().list("s").await.unwrap().len(), 100);
    let err = reg.register(ep("s", "late", 1)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
}

#[tokio::test]
async fn ticket_resolves_when_durable_and_invalid_ops_are_refused_up_front() {
    let reg = Coalescing::with_config(faulty_memory(100), manual()).unwrap();
    let ticket = reg.submit(vec![Op::Register(ep("s", "a", 1))]).unwrap();
    let waiting = tokio::spawn(ticket.durable());
    reg.flush().await;
    waiting.await.unwrap().unwrap();
    assert_eq!(reg.get_ref().get_ref().list("s").await.unwrap().len(), 1);

    let err = reg
        .apply(vec![
            Op::Register(ep("s", "b", 1)),
            Op::Register(ep("s", "", 1)),
        ])
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "invalid ops[1].id: must not be empty");
    assert_eq!(reg.queue_depth(), 0, "half of an invalid batch was queued");
}

#[tokio::test]
async fn display_shows_the_chain() {
    let reg = Coalescing::new(MemoryRegistry::new());
    assert_eq!(reg.to_string(), "Coalescing(Memory)");
    let cached = waypost::cached::CachedRegistry::new(reg);
    assert_eq!(cached.to_string(), "Cached(Coalescing(Memory))");
    assert!(!cached.capabilities().isolated_reads);
}

fn keys(n: usize) -> Vec<Op> {
    (0..n)
        .map(|i| Op::Register(ep("s", &format!("e{i:03}"), 1)))
        .collect()
}

/// One op the backend refuses in a batch of 100: the other 99 land, only
/// its ticket fails, and the queue goes on.
#[tokio::test]
async fn a_poison_op_fails_alone() {
    let reg = Coalescing::with_config(faulty_memory(100), manual()).unwrap();
    let poison = EndpointKey::new("s", "e042");
    reg.get_ref().poison(
        poison.clone(),
        Error::invalid("labels", "the backend cannot store this endpoint"),
    );
    let tickets: Vec<_> = keys(100)
        .into_iter()
        .map(|op| (op.key(), reg.submit(vec![op]).unwrap()))
        .collect();
    reg.flush().await;
    let mut failed = Vec::new();
    for (key, t) in tickets {
        if let Err(e) = t.durable().await {
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
            failed.push(key);
        }
    }
    assert_eq!(failed, vec![poison.clone()]);
    let stored = reg.get_ref().get_ref().list("s").await.unwrap();
    assert_eq!(stored.len(), 99);
    assert!(stored.iter().all(|e| e.key() != poison));
    // Not stalled: the next write lands.
    reg.register(ep("s", "after", 1)).await.unwrap();
    reg.flush().await;
    assert_eq!(reg.get_ref().get_ref().list("s").await.unwrap().len(), 100);
    // Isolated by halving: far fewer calls than one per op.
    assert!(
        reg.get_ref().write_calls() < 30,
        "{}",
        reg.get_ref().write_calls()
    );
}

/// `Conflict` is retried a bounded number of times, then refused.
#[tokio::test]
async fn conflict_is_not_retried_forever() {
    let reg =
        Coalescing::with_config(faulty_memory(10), manual().with_conflict_retries(2)).unwrap();
    let key = EndpointKey::new("s", "e000");
    reg.get_ref()
        .poison(key.clone(), Error::conflict("condition failed"));
    let t = reg.submit(vec![Op::Register(ep("s", "e000", 1))]).unwrap();
    reg.flush().await;
    assert_eq!(t.durable().await.unwrap_err().kind(), ErrorKind::Conflict);
    assert_eq!(reg.get_ref().write_calls(), 3, "one call and two retries");
}

/// A backend that refuses writes as such fails the whole chunk at once
/// (no splitting), shows in the status, and the queue works again once the
/// backend does.
#[tokio::test]
async fn a_refusing_backend_fails_the_chunk_and_shows_in_the_status() {
    let reg = Coalescing::with_config(faulty_memory(100), manual()).unwrap();
    let status = reg.status();
    assert!(status.borrow().failing_since.is_none());
    reg.get_ref().refuse_writes(Some(Error::unauthorized(
        "attempt to write a readonly database",
    )));
    let t = reg.submit(keys(20)).unwrap();
    reg.flush().await;
    assert_eq!(
        t.durable().await.unwrap_err().kind(),
        ErrorKind::Unauthorized
    );
    assert_eq!(
        reg.get_ref().write_calls(),
        1,
        "split although splitting cannot help"
    );
    let st = status.borrow().clone();
    assert!(st.failing_since.is_some());
    assert!(st.last_error.unwrap().to_string().contains("readonly"));
    reg.get_ref().refuse_writes(None);
    let t = reg.submit(keys(20)).unwrap();
    reg.flush().await;
    t.durable().await.unwrap();
    assert!(status.borrow().failing_since.is_none());
}

/// A chunk the backend cannot commit in time (every call of more than 8
/// ops times out) is split until it goes through.
#[tokio::test]
async fn a_chunk_that_keeps_timing_out_is_split() {
    let reg = Coalescing::with_config(faulty_memory(40), manual().with_split_after(2)).unwrap();
    reg.get_ref().fail_batches_over(Some(8));
    let t = reg.submit(keys(40)).unwrap();
    reg.flush().await;
    t.durable().await.unwrap();
    assert_eq!(reg.get_ref().get_ref().list("s").await.unwrap().len(), 40);
    assert!(reg.get_ref().batches().iter().all(|&n| n <= 8));
}

/// Shutting down during an outage gives up at the deadline and names what
/// it could not write; the tickets say so.
#[tokio::test]
async fn shutdown_within_gives_up_at_the_deadline_and_names_the_keys() {
    let reg = Coalescing::with_config(faulty_memory(100), manual()).unwrap();
    reg.get_ref().set_down(true);
    let t = reg.submit(keys(3)).unwrap();
    let started = std::time::Instant::now();
    let report = reg.shutdown_within(Duration::from_millis(300)).await;
    assert!(started.elapsed() < Duration::from_secs(5));
    let mut unwritten = report.unwritten;
    unwritten.sort();
    assert_eq!(unwritten, keys(3).iter().map(Op::key).collect::<Vec<_>>());
    let e = t.durable().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.to_string().contains("deadline"), "{e}");
}

#[tokio::test]
async fn bad_settings_are_refused_naming_the_setting() {
    let zero = CoalescingConfig::default().with_flush_interval(Duration::ZERO);
    let err = Coalescing::with_config(MemoryRegistry::new(), zero).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains("flush_interval"), "{err}");
    let err = CoalescingConfig::default()
        .with_capacity(0)
        .validate()
        .unwrap_err();
    assert!(err.to_string().contains("capacity"), "{err}");
    let err = CoalescingConfig::default()
        .with_retry(Duration::from_secs(2), Duration::from_secs(1))
        .validate()
        .unwrap_err();
    assert!(err.to_string().contains("retry_max"), "{err}");
}
