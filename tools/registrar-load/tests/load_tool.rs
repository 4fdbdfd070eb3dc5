//! `registrar-load`, the load tool behind the registrar's figures in
//! BENCHMARKS.md, on a tiny load: its phases run to the end and every
//! change reaches every agent, with `RpcClient` agents and with light ones
//! (bare HTTP/2 readers), and from both floors the registrar is measured
//! against; agents that outlive a restart or move to another replica come
//! back with less than a full snapshot. The timings it prints are not
//! checked here.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use tokio::process::Command;

/// The load tool.
const LOAD: &str = env!("CARGO_BIN_EXE_registrar-load");

/// Run `registrar-load` with `args` (bounded); what it printed, once it
/// exited successfully.
async fn run(args: &[&str]) -> String {
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        Command::new(LOAD).args(args).kill_on_drop(true).output(),
    )
    .await
    .expect("registrar-load did not finish within 120 s")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "registrar-load {args:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The fan-out phase's arguments for a tiny load with `encoding`: 4
/// agents, 20 changes in 1 s.
fn tiny_fanout(encoding: &str) -> Vec<&str> {
    vec![
        "--phases",
        "fanout",
        "--encoding",
        encoding,
        "--agents",
        "4",
        "--rate",
        "20",
        "--seconds",
        "1",
    ]
}

#[tokio::test]
async fn every_change_reaches_every_agent_of_either_kind() {
    for light in [false, true] {
        let mut args = tiny_fanout("shared");
        if light {
            args.push("--light-agents");
        }
        let out = run(&args).await;
        assert!(
            out.contains("(20 of 20 writes reached all agents)"),
            "light agents: {light}\n{out}"
        );
        assert!(out.contains("µs of it in the kernel"), "{out}");
    }
}

#[tokio::test]
async fn both_floors_reach_every_agent() {
    for floor in ["floor", "floor-h2"] {
        let out = run(&tiny_fanout(floor)).await;
        assert!(
            out.contains("floor: 20 of 20 changes reached all agents"),
            "{floor}:\n{out}"
        );
    }
}

/// The percentage the `name` phase printed for the bytes of content
/// resumes against full snapshots.
fn bytes_ratio(out: &str, name: &str) -> f64 {
    let prefix = format!("{name}: resumed by content / full snapshots: bytes ");
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {prefix:?} line:\n{out}"));
    line.split(' ').next().unwrap().parse().unwrap()
}

/// The restart and failover phases with `extra` flags: every agent comes
/// back in both runs of each, and the agents resumed by content (their
/// run's label `by_content`) are sent fewer bytes than full snapshots.
async fn come_back(extra: &[&str], by_content: &str) {
    let mut args = vec![
        "--phases",
        "restart,failover",
        "--agents",
        "3",
        "--endpoints",
        "200",
    ];
    args.extend_from_slice(extra);
    let out = run(&args).await;
    for name in ["restart", "failover"] {
        for label in ["full snapshots", by_content] {
            let line = format!(
                "{name}: 3 agents on 200 endpoints, 0% of the services changed, {label}: all back"
            );
            assert!(out.contains(&line), "no {line:?}:\n{out}");
        }
        let ratio = bytes_ratio(&out, name);
        assert!(ratio < 100.0, "{name}: {ratio} % of the bytes:\n{out}");
    }
}

#[tokio::test]
async fn agents_come_back_after_a_restart_and_a_failover_with_less_than_a_snapshot() {
    come_back(&[], "resumed by content").await;
}

#[tokio::test]
async fn light_agents_resume_by_content_with_less_than_a_snapshot() {
    come_back(&["--light-agents"], "resumed by content (light agents)").await;
}
