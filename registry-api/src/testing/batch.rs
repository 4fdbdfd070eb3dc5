//! The checks of [`Batch`]: order, the batch rule (an invalid op or more
//! than `max_batch` ops: refused, nothing written), `atomic_writes` and
//! `isolated_reads`.

use std::sync::atomic::{AtomicBool, Ordering};

use futures::future;

use super::checks::endpoint_of_size;
use super::support::{ep, expect_invalid, first_snapshot, follow_until, skip, unique};
use super::watch::summary;
use crate::capabilities::Capabilities;
use crate::limits::{encoded_len, MAX_ENCODED_LEN, MAX_LABELS};
use crate::model::{Endpoint, EndpointKey, Op};
use crate::traits::{Batch, Watch};

/// The most ops [`batch_over_max_is_refused`] sends to see a batch of
/// `max_batch + 1` refused: a backend that wrongly wrote them all would
/// take too long beyond this.
pub const MAX_OVERSIZE_TRY: usize = 1_000_000;

/// The largest `max_batch` for which [`batch_over_max_is_refused`] also
/// writes a batch of exactly `max_batch` ops (a backend like Cloud Map
/// writes each op with its own API call).
pub const MAX_AT_LIMIT_TRY: usize = 1_000;

/// A batch applies every op in order; a later op on the same key wins.
pub async fn batch_applies_in_order<R: Batch + ?Sized>(reg: &R) {
    let svc = unique("batch");
    let a = ep(&svc, "a", 1);
    reg.register(a.clone()).await.expect("register a");
    let b2 = ep(&svc, "b", 3);
    let ops = vec![
        Op::Register(ep(&svc, "b", 2)),
        Op::Register(ep(&svc, "c", 2)),
        Op::Deregister(a.key()),
        Op::Register(b2.clone()),
        Op::Deregister(ep(&svc, "c", 2).key()),
        Op::Register(ep(&svc, "d", 4)),
        Op::Deregister(ep(&svc, "d", 4).key()),
        Op::Register(ep(&svc, "d", 5)),
        Op::Deregister(EndpointKey::new(&svc, "never")),
    ];
    reg.apply(ops).await.expect("apply");
    assert_eq!(
        reg.list(&svc).await.expect("list"),
        vec![b2, ep(&svc, "d", 5)]
    );
    reg.apply(Vec::new()).await.expect("empty batch");
}

/// An invalid op anywhere in a batch fails the whole call, names
/// `ops[i].field`, and writes nothing.
pub async fn batch_invalid_op_writes_nothing<R: Batch + ?Sized>(reg: &R) {
    let svc = unique("batch-invalid");
    let keep = ep(&svc, "keep", 1);
    reg.register(keep.clone()).await.expect("register");
    let ops = vec![
        Op::Register(ep(&svc, "new", 2)),
        Op::Deregister(keep.key()),
        Op::Register(ep(&svc, "bad", 0)),
    ];
    expect_invalid(reg.apply(ops).await, "ops[2].port", "batch with port 0");
    assert_eq!(reg.list(&svc).await.expect("list"), vec![keep]);
}

/// A batch of `max_batch + 1` ops is refused with `InvalidInput` naming
/// `ops`, and nothing of it is written (not split, not applied whole); a
/// batch of exactly `max_batch` ops is applied. `max_batch()` agrees with
/// `capabilities().max_batch`.
pub async fn batch_over_max_is_refused<R: Batch + ?Sized>(reg: &R) {
    const CHECK: &str = "batch_over_max_is_refused";
    let max = reg.max_batch();
    assert_eq!(
        max,
        reg.capabilities().max_batch,
        "max_batch() and capabilities().max_batch disagree"
    );
    let svc = unique("batch-over");
    let keep = ep(&svc, "keep", 1);
    reg.register(keep.clone()).await.expect("register");
    let batch = |n: usize| -> Vec<Op> {
        // The first op removes `keep`, so a batch applied even in part
        // shows.
        std::iter::once(Op::Deregister(keep.key()))
            .chain((1..n).map(|i| Op::Register(ep(&svc, &format!("e{i:07}"), 2))))
            .collect()
    };
    if max >= MAX_OVERSIZE_TRY {
        skip(
            CHECK,
            &reg,
            &format!(
                "the oversize batch, because capabilities say max_batch = {max}: \
                 {} ops take too long to build and send",
                max.saturating_add(1)
            ),
        );
    } else {
        expect_invalid(
            reg.apply(batch(max + 1)).await,
            "ops",
            &format!("a batch of max_batch + 1 = {} ops", max + 1),
        );
        assert_eq!(
            reg.list(&svc).await.expect("list"),
            vec![keep.clone()],
            "a refused batch wrote something"
        );
    }
    if max > MAX_AT_LIMIT_TRY {
        skip(
            CHECK,
            &reg,
            &format!(
                "a batch of exactly max_batch ops, because capabilities say max_batch = {max} \
                 (more than {MAX_AT_LIMIT_TRY}); batch_applies_in_order writes a smaller one"
            ),
        );
        return;
    }
    reg.apply(batch(max))
        .await
        .expect("a batch of exactly max_batch ops");
    let got = reg.list(&svc).await.expect("list");
    assert_eq!(
        got.len(),
        max - 1,
        "a batch of max_batch ops was not applied whole"
    );
    assert!(!got.contains(&keep), "the batch's first op was not applied");
}

/// The op that makes a batch fail, with the field its error names: one
/// this backend refuses although the API accepts it (more labels than
/// `max_labels`, a larger endpoint than `max_encoded_len`), else one the
/// API refuses (port 0).
fn failing_op(svc: &str, caps: &Capabilities) -> (Endpoint, &'static str) {
    let base = ep(svc, "failing", 3);
    if caps.max_labels < MAX_LABELS {
        let mut e = base;
        for i in 0..=caps.max_labels {
            e.labels.insert(format!("k{i:02}"), "v".into());
        }
        return (e, "ops[3].labels");
    }
    if caps.max_encoded_len < MAX_ENCODED_LEN {
        let e = endpoint_of_size(base.clone(), caps.max_encoded_len + 1, caps.max_labels);
        if encoded_len(&e) > caps.max_encoded_len {
            return (e, "ops[3].endpoint");
        }
    }
    (Endpoint { port: 0, ..base }, "ops[3].port")
}

/// A batch whose last op fails leaves nothing: the keys it would have
/// updated, removed and added keep their state, and a watch reports
/// nothing of it (the next change it reports is one written after).
///
/// The failing op is what this backend refuses (see the capabilities)
/// and the API would accept, where there is such an op (Cloud Map's label
/// count), else an op the API refuses. Failures during the write itself (a
/// lost connection, a full disk, a conflict) can't be caused through the
/// traits: the backends' own fault tests check those where
/// `atomic_writes` is claimed, and this check says so.
pub async fn batch_failure_writes_nothing<R: Batch + Watch + ?Sized>(reg: &R) {
    let caps = reg.capabilities();
    let svc = unique("batch-fails");
    let (a, b) = (ep(&svc, "a", 1), ep(&svc, "b", 2));
    reg.register(a.clone()).await.expect("register a");
    reg.register(b.clone()).await.expect("register b");
    let mut w = reg.watch(None);
    let mut state = first_snapshot(&mut w, "the first snapshot").await;
    follow_until(&mut w, &mut state, &svc, &[a.clone(), b.clone()]).await;

    let (bad, field) = failing_op(&svc, &caps);
    let ops = vec![
        Op::Register(ep(&svc, "a", 11).with_label("rev", "2")),
        Op::Deregister(b.key()),
        Op::Register(ep(&svc, "c", 3)),
        Op::Register(bad),
    ];
    expect_invalid(reg.apply(ops).await, field, "a batch whose last op fails");
    assert_eq!(
        reg.list(&svc).await.expect("list"),
        vec![a.clone(), b.clone()],
        "a failed batch changed stored data"
    );
    let marker = ep(&svc, "marker", 9);
    reg.register(marker.clone()).await.expect("register marker");
    let seen = follow_until(&mut w, &mut state, &svc, &[a, b, marker]).await;
    if caps.native_watch {
        assert_eq!(
            summary(&seen),
            vec![("added", "marker".to_string())],
            "a watch reported changes of a failed batch"
        );
    }
    let why = if caps.atomic_writes {
        "a failure during the write itself (I/O, a conflict), which the traits give no way \
         to cause; capabilities say atomic_writes = true, which the backend's own fault \
         tests check"
    } else {
        "a failure during the write (I/O, a conflict), because capabilities say \
         atomic_writes = false: part of such a batch may stay"
    };
    skip("batch_failure_writes_nothing", &reg, why);
}

/// Where the backend claims isolated reads, a concurrent reader sees all
/// of a batch or none of it. Without the claim, only that every batch is
/// there in the end.
pub async fn batch_reads_are_isolated<R: Batch + ?Sized>(reg: &R) {
    let caps = reg.capabilities();
    let isolated = caps.isolated_reads;
    if !isolated {
        skip(
            "batch_reads_are_isolated",
            &reg,
            "readers seeing a batch whole, because capabilities say isolated_reads = false \
             (checked: every batch is there in the end)",
        );
    }
    let svc = unique("isolated");
    let n = caps.max_batch.clamp(2, 20);
    let rounds = 10;
    let done = AtomicBool::new(false);
    let writer = async {
        for r in 0..rounds {
            let ops = (0..n)
                .map(|i| Op::Register(ep(&svc, &format!("r{r}-{i}"), 1000 + i as u16)))
                .collect();
            reg.apply(ops).await.expect("apply");
        }
        done.store(true, Ordering::SeqCst);
    };
    let reader = async {
        let mut reads = 0;
        while isolated && (!done.load(Ordering::SeqCst) || reads == 0) {
            let len = reg.list(&svc).await.expect("list").len();
            assert_eq!(len % n, 0, "list saw a partial batch: {len} endpoints");
            let len = reg
                .snapshot()
                .await
                .expect("snapshot")
                .service(&svc)
                .count();
            assert_eq!(len % n, 0, "snapshot saw a partial batch: {len} endpoints");
            reads += 1;
            tokio::task::yield_now().await;
        }
    };
    future::join(writer, reader).await;
    assert_eq!(reg.list(&svc).await.expect("list").len(), n * rounds);
}
