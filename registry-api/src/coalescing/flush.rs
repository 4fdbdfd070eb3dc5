//! The flusher: takes what is queued, merges it to its net effect per key,
//! and applies it in chunks, deciding per failure what to do with a chunk.
//!
//! | the backend answers | the chunk |
//! | --- | --- |
//! | ok | its tickets resolve `Ok` |
//! | transient (`Unavailable`, `Throttled`, `Overloaded`) | retried with backoff and jitter, without limit; after `split_after` failures in a row a chunk of several ops is split in two |
//! | `Conflict` | retried `conflict_retries` times, then handled as a refusal of the request |
//! | a refusal of the request (`InvalidInput`, `Conflict`) | split in two until the op at fault is alone; that op's tickets fail, the others go on |
//! | a refusal of the backend (`NotFound`, `Unauthorized`, `Internal`) | every op of the chunk fails with it (splitting cannot help) |
//!
//! Once a drain deadline is set and passed, nothing more is attempted:
//! what is left fails with `Unavailable` and is listed in the drain report.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use backon::BackoffBuilder;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Pending, Shared};
use crate::error::{Error, ErrorKind, Result};
use crate::model::{EndpointKey, Op};
use crate::traits::Batch;

type Tickets = Vec<oneshot::Sender<Result<()>>>;

/// One key's net op and the tickets waiting on it.
pub(super) type Item = (Op, Tickets);

/// Merge a flush to its net effect per key, keeping the position of each
/// key's first op; every ticket follows its key's final op.
pub(super) fn net_effect(batch: Vec<Pending>) -> Vec<Item> {
    let mut out: Vec<Item> = Vec::with_capacity(batch.len());
    let mut index: HashMap<EndpointKey, usize> = HashMap::with_capacity(batch.len());
    for p in batch {
        let key = p.op.key();
        match index.get(&key) {
            Some(&i) => {
                out[i].0 = p.op;
                out[i].1.extend(p.ticket);
            }
            None => {
                index.insert(key, out.len());
                out.push((p.op, p.ticket.into_iter().collect()));
            }
        }
    }
    out
}

pub(super) async fn flush_loop<B: Batch>(inner: Arc<B>, shared: Arc<Shared>) {
    let cfg = shared.cfg.clone();
    let mut ticker = tokio::time::interval(cfg.flush_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let (batch, closed) = {
            let mut q = shared.lock();
            // Woken by the interval, the op threshold, flush() or shutdown:
            // everything queued goes.
            q.flush_now = false;
            let batch: Vec<Pending> = q.pending.drain(..).collect();
            q.in_flight = batch.len();
            (batch, q.closed)
        };
        if batch.is_empty() {
            if closed {
                return;
            }
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shared.wake.notified() => {}
            }
            continue;
        }
        let last_seq = batch.last().map(|p| p.seq).unwrap_or(0);
        let max = inner.max_batch().max(1);
        let mut merged = net_effect(batch).into_iter().peekable();
        while merged.peek().is_some() {
            let chunk: Vec<Item> = merged.by_ref().take(max).collect();
            write_chunk(&*inner, &shared, chunk).await;
        }
        let depth = {
            let mut q = shared.lock();
            q.in_flight = 0;
            q.pending.len()
        };
        metrics::gauge!(shared.names.queue_depth.clone()).set(depth as f64);
        shared.done.send_replace(last_seq);
        if depth < cfg.flush_ops && !closed {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = shared.wake.notified() => {}
            }
        }
    }
}

/// What became of one backend call's ops.
enum Outcome {
    Applied,
    /// Try the halves separately.
    Split,
    Failed(Error),
}

/// Apply one chunk, splitting it where the table in the module docs says.
/// Parts are applied in order, so per-key order holds.
async fn write_chunk<B: Batch>(inner: &B, shared: &Shared, chunk: Vec<Item>) {
    let mut work: VecDeque<Vec<Item>> = VecDeque::from([chunk]);
    while let Some(mut part) = work.pop_front() {
        let ops: Vec<Op> = part.iter().map(|(op, _)| op.clone()).collect();
        metrics::histogram!(shared.names.batch_size.clone()).record(ops.len() as f64);
        match attempt(inner, shared, ops).await {
            Outcome::Applied => settle(part, &Ok(())),
            Outcome::Split => {
                let second = part.split_off(part.len() / 2);
                tracing::info!(
                    registry = %inner,
                    ops = part.len() + second.len(),
                    "splitting a write batch to isolate what fails"
                );
                work.push_front(second);
                work.push_front(part);
            }
            Outcome::Failed(e) => {
                if shared.past_deadline() {
                    shared.abandon(part.iter().map(|(op, _)| op.key()));
                } else {
                    for (op, _) in &part {
                        tracing::error!(registry = %inner, key = %op.key(), error = %e, "write failed for good");
                    }
                }
                settle(part, &Err(e));
            }
        }
    }
}

fn settle(part: Vec<Item>, result: &Result<()>) {
    for (_, tickets) in part {
        for t in tickets {
            let _ = t.send(result.clone());
        }
    }
}

/// Call the backend until the ops are applied, refused, or the chunk
/// should be split.
async fn attempt<B: Batch>(inner: &B, shared: &Shared, ops: Vec<Op>) -> Outcome {
    let cfg = &shared.cfg;
    let several = ops.len() > 1;
    let mut delays = backon::ExponentialBuilder::default()
        .with_min_delay(cfg.retry_min)
        .with_max_delay(cfg.retry_max)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build();
    let (mut transient, mut conflicts) = (0u32, 0u32);
    loop {
        let deadline = shared.deadline();
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Outcome::Failed(not_written(ops.len()));
        }
        let result = match deadline {
            None => inner.apply(ops.clone()).await,
            Some(d) => match tokio::time::timeout_at(d, inner.apply(ops.clone())).await {
                Ok(r) => r,
                Err(_) => {
                    return Outcome::Failed(Error::unavailable(format!(
                        "the drain deadline passed while the backend was applying {} ops; \
                         whether they were written is unknown",
                        ops.len()
                    )))
                }
            },
        };
        let e = match result {
            Ok(()) => {
                shared.record_success();
                return Outcome::Applied;
            }
            Err(e) => e,
        };
        metrics::counter!(shared.names.errors.clone(), "kind" => kind_label(e.kind())).increment(1);
        if e.kind() == ErrorKind::Conflict {
            conflicts += 1;
            if conflicts > cfg.conflict_retries {
                return refuse(e, several);
            }
        } else if e.is_retryable() {
            shared.record_failure(&e);
            transient += 1;
            if several && transient >= cfg.split_after {
                return Outcome::Split;
            }
        } else if e.is_request_fault() {
            return refuse(e, several);
        } else {
            // The backend refuses writes as such: splitting cannot help.
            shared.record_failure(&e);
            return Outcome::Failed(e);
        }
        let delay = delays.next().unwrap_or(cfg.retry_max);
        tracing::warn!(registry = %inner, error = %e, ?delay, ops = ops.len(), "write batch failed; will retry");
        match deadline {
            None => tokio::time::sleep(delay).await,
            Some(d) => tokio::time::sleep_until(d.min(Instant::now() + delay)).await,
        }
    }
}

fn refuse(e: Error, several: bool) -> Outcome {
    if several {
        Outcome::Split
    } else {
        Outcome::Failed(e)
    }
}

fn not_written(n: usize) -> Error {
    Error::unavailable(format!(
        "{n} queued ops were not written: the drain deadline passed"
    ))
}

/// The `kind` label of `registry_write_errors_total`.
pub(super) fn kind_label(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidInput => "invalid_input",
        ErrorKind::NotFound => "not_found",
        ErrorKind::Conflict => "conflict",
        ErrorKind::Unavailable => "unavailable",
        ErrorKind::Throttled => "throttled",
        ErrorKind::Overloaded => "overloaded",
        ErrorKind::Unauthorized => "unauthorized",
        _ => "internal",
    }
}

/// How long [`super::Coalescing::shutdown_within`] waits for the flusher
/// beyond the deadline before it stops it (a backend call that ignores
/// cancellation).
pub(super) const ABORT_GRACE: Duration = Duration::from_secs(1);
