//! The registrar binary killed with SIGKILL in the middle of a registration
//! burst and started again: agents re-assert, and the backend ends with
//! every endpoint the agents hold.

use crate::common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use waypost::testing::{ep, eventually};
use waypost::Registry;

/// The registrar as a child process, killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_registrar(db: &Path, grpc: u16, health: u16) -> Proc {
    let child = Command::new(env!("CARGO_BIN_EXE_registrar"))
        .args([
            "serve",
            "--registry-backend=sqlite",
            &format!("--sqlite-path={}", db.display()),
            "--cluster-name=crash-test",
            &format!("--grpc-addr=127.0.0.1:{grpc}"),
            &format!("--health-addr=127.0.0.1:{health}"),
            "--write-batch-interval=200ms",
        ])
        .args(common::PROTOCOL_ARGS)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    Proc(child)
}

async fn wait_listening(port: u16) {
    eventually("the registrar to listen", || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(drop)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrar_killed_mid_burst_loses_nothing_agents_hold() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("registry.db");
    let grpc = waypost_fixtures::free_port().unwrap();
    let health = waypost_fixtures::free_port().unwrap();
    let mut proc = spawn_registrar(&db, grpc, health);
    wait_listening(grpc).await;

    let url = format!("http://127.0.0.1:{grpc}");
    let agents: Vec<_> = (0..3)
        .map(|i| {
            Arc::new(common::fast_client(
                &url,
                "crash-test",
                &format!("node-{i}"),
            ))
        })
        .collect();
    let done = Arc::new(AtomicUsize::new(0));
    let per_agent = 100u16;
    let bursts: Vec<_> = agents
        .iter()
        .enumerate()
        .map(|(i, agent)| {
            let agent = Arc::clone(agent);
            let done = Arc::clone(&done);
            tokio::spawn(async move {
                for j in 0..per_agent {
                    let e =
                        ep("burst", &format!("n{i}-e{j}"), j + 1).with_node(format!("node-{i}"));
                    agent.register(e).await.unwrap();
                    done.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            })
        })
        .collect();

    // Kill it in the middle of the burst (SIGKILL: nothing is drained),
    // then start it again on the same file and port.
    eventually("the burst to be under way", || async {
        (done.load(Ordering::SeqCst) >= 60).then_some(())
    })
    .await;
    proc.0.kill().unwrap();
    proc.0.wait().unwrap();
    let killed_at = done.load(Ordering::SeqCst);
    assert!(
        killed_at < 3 * per_agent as usize,
        "the burst ended before the kill"
    );
    drop(proc);
    let _proc = spawn_registrar(&db, grpc, health);
    wait_listening(grpc).await;
    for b in bursts {
        b.await.unwrap();
    }

    // Every endpoint the agents hold ends up in the backend.
    let held: usize = agents.iter().map(|a| a.owned().len()).sum();
    assert_eq!(held, 3 * per_agent as usize);
    let backend = waypost_sqlite::SqliteRegistry::open_path(&db)
        .await
        .unwrap();
    eventually("every agent endpoint in the backend", || async {
        let got = backend.list("burst").await.ok()?;
        (got.len() == held).then_some(())
    })
    .await;
    for agent in &agents {
        for e in agent.owned() {
            assert!(
                backend.list("burst").await.unwrap().contains(&e),
                "{} missing",
                e.key()
            );
        }
        // And the agents see the whole burst again through the new registrar.
        eventually("the agent's cache to hold the whole burst", || async {
            (agent.list("burst").await.ok()?.len() == held).then_some(())
        })
        .await;
    }
}
