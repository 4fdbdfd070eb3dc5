//! What the fan-out phase's runs share: this tool started again as a
//! child (pinned to a CPU with `--pin`), the CPU time a process used, and
//! the figures a run reports.

use crate::Args;

/// The CPU the registrar runs on with `--pin`; the agents take the next.
pub(crate) const REGISTRAR_CPU: usize = 0;
/// Set in the registrar's process that `--pin` started on its CPU.
pub(crate) const PINNED: &str = "REGISTRAR_LOAD_PINNED";

/// The CPU time this process has used (user and system, all threads),
/// from /proc (Linux; 0 elsewhere). USER_HZ is 100 on Linux.
pub(crate) fn cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command name (which may hold spaces).
            let rest = s.rsplit_once(')')?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let utime: f64 = f.get(11)?.parse().ok()?;
            let stime: f64 = f.get(12)?.parse().ok()?;
            Some((utime + stime) / 100.0)
        })
        .unwrap_or(0.0)
}

/// What one run of the phase measured.
#[derive(Debug, Default, Clone)]
pub(crate) struct Figures {
    pub(crate) changes_per_s: f64,
    pub(crate) every_p50_ms: f64,
    pub(crate) every_p99_ms: f64,
    pub(crate) one_p99_ms: f64,
    pub(crate) server_cpu_per_s: f64,
    pub(crate) agents_cpu_per_s: f64,
    pub(crate) encoded: u64,
}

/// This tool again, as a child killed with its handle: `first`, then the
/// load's size (`--agents`, `--rate`, `--seconds`, `--open-loop`,
/// `--pin`) from `args`; its stdout piped. On `cpu` when given (with
/// `taskset`).
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
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
}
