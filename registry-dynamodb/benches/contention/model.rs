//! The counting model: writers racing for the change log's head on a
//! simulated clock, with DynamoDB's per-item transaction rules and the
//! crate's own retry policy ([`changelog_retry_ceiling`], drawn with full
//! jitter, at most [`CHANGELOG_ATTEMPTS`] transactions a batch).
//!
//! The server, as DynamoDB documents transactions on one item: a
//! `TransactWriteItems` that reaches the head while another transaction
//! holds it is cancelled at once (`TransactionConflict`); one whose
//! condition `v = V` no longer holds is cancelled at once
//! (`ConditionalCheckFailed`); otherwise it holds the head for `hold`,
//! then commits. A cancelled transaction holds nothing. A strongly
//! consistent `GetItem` of the head sees the last commit.
//!
//! A writer, as `commit_logged` does: it keeps the head it last wrote
//! (and tries it first), and after a lost race pauses, reads the head, and
//! tries again. One batch at a time per writer: the changes of ticks that
//! pass while a batch is in flight go in the next one, whose latency
//! counts from the first of those ticks.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use registry_dynamodb::{changelog_retry_ceiling, CHANGELOG_ATTEMPTS};

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
    pub interval: Micros,
    pub seconds: u64,
    pub server: Server,
    pub seed: u64,
}

/// What a run counted.
pub struct Counts {
    pub committed: u64,
    pub lost: u64,
    /// Batches that lost [`CHANGELOG_ATTEMPTS`] races: their callers saw
    /// `Conflict`.
    pub conflicts: u64,
    /// Commit latency of every committed batch, from its first tick.
    pub latencies: Vec<Micros>,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    /// A tick of the writer's batch interval.
    Tick,
    /// The writer's transaction reaches the server, expecting the head
    /// at the given version.
    Arrive(u64),
    /// The answer to the writer's transaction: the version it wrote, or
    /// `None` when it lost the race.
    Answer(Option<u64>),
    /// The writer reads the head (after its pause).
    Read,
    /// The head read reaches the writer.
    HeadIs(u64),
}

/// A batch in flight.
struct Batch {
    /// The first tick whose changes it carries.
    first: Micros,
    /// Transactions sent so far.
    attempts: u32,
    /// When the last one was sent.
    sent: Micros,
}

/// One writer's state.
#[derive(Default)]
struct Writer {
    /// The head it will try next, as it last saw it.
    head: u64,
    batch: Option<Batch>,
    /// The first tick of changes waiting for the next batch.
    waiting: Option<Micros>,
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
        version: 0,
        held_until: 0,
        writers: (0..r.writers).map(|_| Writer::default()).collect(),
        counts: Counts {
            committed: 0,
            lost: 0,
            conflicts: 0,
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
    /// The head's version, and until when a transaction holds it.
    version: u64,
    held_until: Micros,
    writers: Vec<Writer>,
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
        let head = wr.head;
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
        });
        self.send(now, w);
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
                let won = now >= self.held_until && expected == self.version;
                let (done, answer) = if won {
                    self.held_until = now + s.hold;
                    self.version += 1;
                    (now + s.hold, Some(self.version))
                } else {
                    (now + s.answer, None)
                };
                self.at(done + s.one_way, w, Step::Answer(answer));
            }
            Step::Answer(Some(version)) => {
                let wr = &mut self.writers[w];
                wr.head = version;
                if let Some(b) = wr.batch.take() {
                    self.counts.committed += 1;
                    self.counts.latencies.push(now - b.first);
                }
                self.next_batch(now, w);
            }
            Step::Answer(None) => {
                self.counts.lost += 1;
                let Some(b) = self.writers[w].batch.as_ref() else {
                    return;
                };
                let (attempts, sent) = (b.attempts, b.sent);
                if attempts >= CHANGELOG_ATTEMPTS {
                    self.counts.conflicts += 1;
                    self.writers[w].batch = None;
                    self.next_batch(now, w);
                    return;
                }
                let ceiling = changelog_retry_ceiling(attempts, Duration::from_micros(now - sent));
                let pause = (ceiling.as_micros() as f64 * self.rng.unit()) as Micros;
                self.at(now + pause, w, Step::Read);
            }
            Step::Read => {
                // The server answers with the head as it is when the read
                // arrives.
                let version = self.version_at(now + s.one_way);
                self.at(now + 2 * s.one_way + s.answer, w, Step::HeadIs(version));
            }
            Step::HeadIs(version) => {
                self.writers[w].head = version;
                self.send(now, w);
            }
        }
    }

    /// The head's version a read arriving at `t` sees: the commit that
    /// holds the head until after `t` is not visible yet.
    fn version_at(&self, t: Micros) -> u64 {
        if t < self.held_until {
            self.version.saturating_sub(1)
        } else {
            self.version
        }
    }

    /// After a batch ends, the next one starts at once if changes wait.
    fn next_batch(&mut self, now: Micros, w: usize) {
        if let Some(first) = self.writers[w].waiting.take() {
            self.start(now, w, first);
        }
    }
}
