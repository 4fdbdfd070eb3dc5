//! The counting model: writers racing for the change log's heads on a
//! simulated clock, with DynamoDB's per-item transaction rules and the
//! crate's own retry policy ([`changelog_retry_ceiling`], drawn with full
//! jitter, at most [`CHANGELOG_ATTEMPTS`] transactions a batch).
//!
//! The server, as DynamoDB documents transactions on items: a
//! `TransactWriteItems` that reaches a head while another transaction
//! holds it is cancelled at once (`TransactionConflict`); one whose
//! condition `v = V` on one of its heads no longer holds is cancelled at
//! once (`ConditionalCheckFailed`); otherwise it holds its heads for
//! `hold`, then commits. A cancelled transaction holds nothing. A strongly
//! consistent `GetItem` of a head sees the last commit.
//!
//! A writer, as `commit_logged` does: each batch writes the writer's two
//! keys (as the moto runs do), whose heads [`changelog_head_of`] names.
//! With one head it keeps the head it last wrote (and tries it first);
//! with several it reads its heads before the first attempt. After a lost
//! race it pauses, reads its heads, and tries again. One batch at a time per writer: the changes of ticks that
//! pass while a batch is in flight go in the next one, whose latency
//! counts from the first of those ticks.
//!
//! In front of each writer, as in a registrar, a `Coalescing` queue with
//! its default settings: a batch that ends in `Conflict` is tried again
//! (all of [`CHANGELOG_ATTEMPTS`] afresh) after Coalescing's retry delay,
//! `conflict_retries` times, before its writes are refused with
//! `Conflict`: only then does a caller of the registrar see it.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use waypost::coalescing::CoalescingConfig;
use waypost::EndpointKey;
use waypost_dynamodb::{changelog_head_of, changelog_retry_ceiling, CHANGELOG_ATTEMPTS};

use crate::rng::Rng;

/// Times on the simulated clock, in microseconds.
type Micros = u64;

/// What the network and the server take.
#[derive(Clone, Copy)]
pub struct Server {
    /// One way between a writer and the server.
    pub one_way: Micros,
    /// How long a committing transaction holds the head.
    pub hold: Micros,
    /// How long the server takes to cancel a transaction or answer a read.
    pub answer: Micros,
}

/// One run's settings.
pub struct Run {
    pub writers: usize,
    /// Heads of the log.
    pub heads: u32,
    pub interval: Micros,
    pub seconds: u64,
    pub server: Server,
    pub seed: u64,
}

/// What a run counted.
pub struct Counts {
    pub committed: u64,
    pub lost: u64,
    /// Batches that lost [`CHANGELOG_ATTEMPTS`] races: the registry's
    /// caller (the Coalescing queue) saw `Conflict`.
    pub conflicts: u64,
    /// Batches whose writes the Coalescing queue refused with `Conflict`
    /// after its `conflict_retries`: a caller of the registrar saw it.
    pub refused: u64,
    /// Commit latency of every committed batch, from its first tick.
    pub latencies: Vec<Micros>,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    /// A tick of the writer's batch interval.
    Tick,
    /// The writer's transaction reaches the server, expecting its heads
    /// at the given versions.
    Arrive(Vec<u64>),
    /// The answer to the writer's transaction: the versions it wrote, or
    /// `None` when it lost the race.
    Answer(Option<Vec<u64>>),
    /// The writer reads its heads (after its pause, or before a batch).
    Read,
    /// The heads read reach the writer.
    HeadIs(Vec<u64>),
}

/// A batch in flight.
struct Batch {
    /// The first tick whose changes it carries.
    first: Micros,
    /// Transactions sent so far.
    attempts: u32,
    /// When the last one was sent.
    sent: Micros,
    /// Times it ended in `Conflict` so far.
    conflicts: u32,
}

/// One writer's state.
struct Writer {
    /// The heads its batches write.
    heads: Vec<usize>,
    /// Their versions it will try next, as it last saw them.
    seen: Vec<u64>,
    batch: Option<Batch>,
    /// The first tick of changes waiting for the next batch.
    waiting: Option<Micros>,
}

/// Writer `w` of a log of `heads` heads: the heads of its two keys.
fn writer(w: usize, heads: u32) -> Writer {
    let mut mine: Vec<usize> = (0..2)
        .map(|k| {
            changelog_head_of(&EndpointKey::new("contention", format!("w{w}-{k}")), heads) as usize
        })
        .collect();
    mine.sort_unstable();
    mine.dedup();
    Writer {
        seen: vec![0; mine.len()],
        heads: mine,
        batch: None,
        waiting: None,
    }
}

/// Run the model.
pub fn run(r: &Run) -> Counts {
    let mut sim = Sim {
        end: r.seconds * 1_000_000,
        interval: r.interval,
        queue: BinaryHeap::new(),
        seq: 0,
        rng: Rng(r.seed | 1),
        server: r.server,
        version: vec![0; r.heads as usize],
        held_until: vec![0; r.heads as usize],
        cache: r.heads == 1,
        writers: (0..r.writers).map(|w| writer(w, r.heads)).collect(),
        queue_cfg: CoalescingConfig::default(),
        counts: Counts {
            committed: 0,
            lost: 0,
            conflicts: 0,
            refused: 0,
            latencies: Vec::new(),
        },
    };
    for w in 0..r.writers {
        // Each writer's ticks at a phase of its own.
        let phase = (r.interval as f64 * sim.rng.unit()) as Micros;
        sim.at(phase, w, Step::Tick);
    }
    while let Some(Reverse((t, _, w, step))) = sim.queue.pop() {
        sim.step(t, w, step);
    }
    sim.counts
}

struct Sim {
    end: Micros,
    interval: Micros,
    queue: BinaryHeap<Reverse<(Micros, u64, usize, Step)>>,
    seq: u64,
    rng: Rng,
    server: Server,
    /// Each head's version, and until when a transaction holds it.
    version: Vec<u64>,
    held_until: Vec<Micros>,
    /// Whether writers keep the head they wrote (one head) instead of
    /// reading their heads before a batch.
    cache: bool,
    writers: Vec<Writer>,
    /// The Coalescing queue's settings (the defaults).
    queue_cfg: CoalescingConfig,
    counts: Counts,
}

impl Sim {
    fn at(&mut self, t: Micros, w: usize, step: Step) {
        self.seq += 1;
        self.queue.push(Reverse((t, self.seq, w, step)));
    }

    /// Writer `w` sends its batch's transaction at `now`.
    fn send(&mut self, now: Micros, w: usize) {
        let wr = &mut self.writers[w];
        let head = wr.seen.clone();
        if let Some(b) = wr.batch.as_mut() {
            b.attempts += 1;
            b.sent = now;
        }
        self.at(now + self.server.one_way, w, Step::Arrive(head));
    }

    /// A new batch of writer `w` from the changes of tick `first` on.
    fn start(&mut self, now: Micros, w: usize, first: Micros) {
        self.writers[w].batch = Some(Batch {
            first,
            attempts: 0,
            sent: now,
            conflicts: 0,
        });
        if self.cache {
            self.send(now, w);
        } else {
            self.at(now, w, Step::Read);
        }
    }

    fn step(&mut self, now: Micros, w: usize, step: Step) {
        let s = self.server;
        match step {
            Step::Tick => {
                if now + self.interval < self.end {
                    self.at(now + self.interval, w, Step::Tick);
                }
                if self.writers[w].batch.is_some() {
                    self.writers[w].waiting.get_or_insert(now);
                } else {
                    self.start(now, w, now);
                }
            }
            Step::Arrive(expected) => {
                let heads = self.writers[w].heads.clone();
                let won = heads
                    .iter()
                    .zip(&expected)
                    .all(|(h, v)| now >= self.held_until[*h] && *v == self.version[*h]);
                let (done, answer) = if won {
                    for h in &heads {
                        self.held_until[*h] = now + s.hold;
                        self.version[*h] += 1;
                    }
                    (
                        now + s.hold,
                        Some(heads.iter().map(|h| self.version[*h]).collect()),
                    )
                } else {
                    (now + s.answer, None)
                };
                self.at(done + s.one_way, w, Step::Answer(answer));
            }
            Step::Answer(Some(versions)) => {
                let wr = &mut self.writers[w];
                wr.seen = versions;
                if let Some(b) = wr.batch.take() {
                    self.counts.committed += 1;
                    self.counts.latencies.push(now - b.first);
                }
                self.next_batch(now, w);
            }
            Step::Answer(None) => {
                self.counts.lost += 1;
                let Some(b) = self.writers[w].batch.as_mut() else {
                    return;
                };
                let (attempts, sent) = (b.attempts, b.sent);
                if attempts >= CHANGELOG_ATTEMPTS {
                    self.counts.conflicts += 1;
                    b.conflicts += 1;
                    if b.conflicts > self.queue_cfg.conflict_retries {
                        self.counts.refused += 1;
                        self.writers[w].batch = None;
                        self.next_batch(now, w);
                        return;
                    }
                    // The queue tries the batch again after its delay:
                    // exponential from retry_min, with jitter (up to as
                    // much again).
                    b.attempts = 0;
                    let base = self
                        .queue_cfg
                        .retry_min
                        .saturating_mul(1 << (b.conflicts - 1).min(16))
                        .min(self.queue_cfg.retry_max);
                    let delay = base.as_micros() as f64 * (1.0 + self.rng.unit());
                    self.at(now + delay as Micros, w, Step::Read);
                    return;
                }
                let ceiling = changelog_retry_ceiling(attempts, Duration::from_micros(now - sent));
                let pause = (ceiling.as_micros() as f64 * self.rng.unit()) as Micros;
                self.at(now + pause, w, Step::Read);
            }
            Step::Read => {
                // The server answers with the head as it is when the read
                // arrives.
                let versions = (0..self.writers[w].heads.len())
                    .map(|i| self.version_at(self.writers[w].heads[i], now + s.one_way))
                    .collect();
                self.at(now + 2 * s.one_way + s.answer, w, Step::HeadIs(versions));
            }
            Step::HeadIs(versions) => {
                self.writers[w].seen = versions;
                self.send(now, w);
            }
        }
    }

    /// Head `h`'s version a read arriving at `t` sees: the commit that
    /// holds the head until after `t` is not visible yet.
    fn version_at(&self, h: usize, t: Micros) -> u64 {
        if t < self.held_until[h] {
            self.version[h].saturating_sub(1)
        } else {
            self.version[h]
        }
    }

    /// After a batch ends, the next one starts at once if changes wait.
    fn next_batch(&mut self, now: Micros, w: usize) {
        if let Some(first) = self.writers[w].waiting.take() {
            self.start(now, w, first);
        }
    }
}
