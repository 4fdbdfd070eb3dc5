//! What the fan-out phase's runs share: this tool started again as a
//! child (pinned to a CPU with `--pin`), the CPU time a process used, and
//! the figures a run reports.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::Args;

/// The CPU the registrar runs on with `--pin`; the agents take the next.
pub(crate) const REGISTRAR_CPU: usize = 0;
/// Set in the registrar's process that `--pin` started on its CPU.
pub(crate) const PINNED: &str = "REGISTRAR_LOAD_PINNED";

/// The CPU time this process has used (user and system, all threads),
/// from /proc (Linux; 0 elsewhere).
pub(crate) fn cpu_seconds() -> f64 {
    let (user, system) = cpu_times();
    user + system
}

/// The CPU time this process has used in user space and in the kernel
/// (all threads), from /proc (Linux; 0 elsewhere). USER_HZ is 100 on
/// Linux. On loopback the kernel's share includes the receiving side's
/// TCP work, which runs in the sender's system call.
pub(crate) fn cpu_times() -> (f64, f64) {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command name (which may hold spaces).
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = f.get(11)?.parse().ok()?;
            let stime: f64 = f.get(12)?.parse().ok()?;
            Some((utime / 100.0, stime / 100.0))
        })
        .unwrap_or((0.0, 0.0))
}

/// This process's CPU time at one moment, to tell what it used since.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuMark {
    user: f64,
    system: f64,
}

impl CpuMark {
    pub(crate) fn now() -> Self {
        let (user, system) = cpu_times();
        CpuMark { user, system }
    }

    /// CPU seconds per second of `wall` since this mark: in all, and the
    /// part spent in the kernel.
    pub(crate) fn per_second(&self, wall: std::time::Duration) -> (f64, f64) {
        let (user, system) = cpu_times();
        let wall = wall.as_secs_f64().max(1e-9);
        let kernel = system - self.system;
        ((user - self.user + kernel) / wall, kernel / wall)
    }
}

/// What one run of the phase measured.
#[derive(Debug, Default, Clone)]
pub(crate) struct Figures {
    pub(crate) changes_per_s: f64,
    pub(crate) every_p50_ms: f64,
    pub(crate) every_p99_ms: f64,
    pub(crate) one_p99_ms: f64,
    pub(crate) server_cpu_per_s: f64,
    /// The part of `server_cpu_per_s` spent in the kernel.
    pub(crate) server_kernel_per_s: f64,
    pub(crate) agents_cpu_per_s: f64,
    pub(crate) encoded: u64,
}

impl Figures {
    /// The server's CPU time per event delivered to each of `agents`, in
    /// microseconds: in all, and the part spent in the kernel.
    pub(crate) fn per_delivery_us(&self, agents: usize) -> (f64, f64) {
        let deliveries = (self.changes_per_s * agents as f64).max(1e-9);
        (
            self.server_cpu_per_s / deliveries * 1e6,
            self.server_kernel_per_s / deliveries * 1e6,
        )
    }
}

/// What the agents of a fan-out saw of each change: how many received it,
/// and when the last of them did (µs since the epoch).
#[derive(Debug)]
pub(crate) struct Deliveries {
    delivered: Vec<AtomicUsize>,
    slowest: Vec<AtomicU64>,
}

impl Deliveries {
    /// Nothing delivered yet of `changes` changes.
    pub(crate) fn new(changes: usize) -> Self {
        Self {
            delivered: (0..changes).map(|_| AtomicUsize::new(0)).collect(),
            slowest: (0..changes).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// How many changes there are.
    pub(crate) fn len(&self) -> usize {
        self.delivered.len()
    }

    /// Change `seq` reached one more agent, at `now`; a number out of
    /// range is ignored.
    pub(crate) fn record(&self, seq: usize, now: u64) {
        if let (Some(d), Some(s)) = (self.delivered.get(seq), self.slowest.get(seq)) {
            d.fetch_add(1, Ordering::Relaxed);
            s.fetch_max(now, Ordering::Relaxed);
        }
    }

    /// Write → delivered at every one of `agents`, for each change that
    /// reached them all, from its send time `sent(seq)`; and how many did.
    pub(crate) fn every(
        &self,
        agents: usize,
        sent: impl Fn(usize) -> u64,
    ) -> Result<(hdrhistogram::Histogram<u64>, usize), hdrhistogram::CreationError> {
        let mut every = hdrhistogram::Histogram::<u64>::new(3)?;
        let mut complete = 0;
        for (seq, d) in self.delivered.iter().enumerate() {
            if d.load(Ordering::Relaxed) == agents {
                complete += 1;
                let last = self.slowest[seq].load(Ordering::Relaxed);
                let _ = every.record(last.saturating_sub(sent(seq)).max(1));
            }
        }
        Ok((every, complete))
    }
}

/// Wait for the agents' `readers` until `limit` from now; whether they
/// all finished.
pub(crate) async fn join_within(
    readers: Vec<tokio::task::JoinHandle<()>>,
    limit: Duration,
) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    for r in readers {
        if tokio::time::timeout_at(deadline, r).await.is_err() {
            return false;
        }
    }
    true
}

/// This tool again, as a child killed with its handle: `first`, then the
/// load's size (`--agents`, `--rate`, `--seconds`, `--open-loop`,
/// `--pin`, `--light-agents`) from `args`; its stdout piped. On `cpu`
/// when given (with `taskset`).
pub(crate) fn spawn_self(
    args: &Args,
    first: &[&str],
    cpu: Option<usize>,
) -> std::io::Result<tokio::process::Child> {
    let exe = std::env::current_exe()?;
    let mut cmd = match cpu {
        Some(cpu) => {
            let mut c = tokio::process::Command::new("taskset");
            c.arg("-c").arg(cpu.to_string()).arg(exe);
            c
        }
        None => tokio::process::Command::new(exe),
    };
    if cpu == Some(REGISTRAR_CPU) {
        cmd.env(PINNED, "1");
    }
    cmd.args(first)
        .args(["--agents", &args.agents.to_string()])
        .args(["--rate", &args.rate.to_string()])
        .args(["--seconds", &args.seconds.to_string()])
        .args(args.open_loop.then_some("--open-loop"))
        .args(args.pin.then_some("--pin"))
        .args(args.light_agents.then_some("--light-agents"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
}
