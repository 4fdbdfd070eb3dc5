//! HAProxy's DNS resolver against the DNS face over loopback: a backend
//! of `server-template` slots filled from the SRV records of a service
//! takes each server's weight from its SRV weight, and a draining
//! endpoint leaves the backend. HAProxy is read through its runtime API
//! (`show servers state`) on a Unix socket; no traffic goes through it.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::fast_client;
use common::protocols::start;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use waypost::testing::wait_limit;
use waypost::{Endpoint, Health, Registry};

/// HAProxy running with a config of our own, in a directory of its own.
struct HaProxy {
    _child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl HaProxy {
    /// A backend `be` of four slots resolved from the SRV records of
    /// `name` at `dns`, held for no longer than 100 ms.
    fn start(dns: std::net::SocketAddr, name: &str) -> Self {
        let found = std::process::Command::new("haproxy").arg("-v").output();
        assert!(
            found.is_ok_and(|o| o.status.success()),
            "haproxy is not installed: install it with `apt-get install haproxy` (scripts/test does)"
        );
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("admin.sock");
        let front = dir.path().join("front.sock");
        let cfg = format!(
            "global\n\
             \x20   stats socket {socket} mode 600 level admin\n\
             defaults\n\
             \x20   mode tcp\n\
             \x20   timeout connect 1s\n\
             \x20   timeout client 5s\n\
             \x20   timeout server 5s\n\
             resolvers registrar\n\
             \x20   nameserver ns1 {dns}\n\
             \x20   accepted_payload_size 8192\n\
             \x20   resolve_retries 3\n\
             \x20   timeout resolve 100ms\n\
             \x20   timeout retry 100ms\n\
             \x20   hold valid 100ms\n\
             \x20   hold obsolete 100ms\n\
             \x20   hold nx 100ms\n\
             \x20   hold other 100ms\n\
             \x20   hold refused 100ms\n\
             \x20   hold timeout 100ms\n\
             frontend fe\n\
             \x20   bind unix@{front}\n\
             \x20   default_backend be\n\
             backend be\n\
             \x20   balance roundrobin\n\
             \x20   server-template srv 4 {name} resolvers registrar init-addr none\n",
            socket = socket.display(),
            front = front.display(),
        );
        let path = dir.path().join("haproxy.cfg");
        std::fs::write(&path, cfg).unwrap();
        let child = Command::new("haproxy")
            .args(["-db", "-f"])
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Self {
            _child: child,
            socket,
            _dir: dir,
        }
    }

    /// The servers of `be` that hold an SRV target and are not in
    /// maintenance, as `port → weight`, and the runtime API's whole
    /// answer; `None` until it answers.
    async fn servers(&self) -> Option<(BTreeMap<u16, u32>, String)> {
        let text = ask(&self.socket, "show servers state be\n").await?;
        let mut lines = text.lines().filter(|l| !l.trim().is_empty());
        let _version = lines.next()?;
        let header: Vec<&str> = lines.next()?.trim_start_matches("# ").split(' ').collect();
        let col = |name: &str| header.iter().position(|h| *h == name);
        let (fqdn, admin, weight, port) = (
            col("srv_fqdn")?,
            col("srv_admin_state")?,
            col("srv_uweight")?,
            col("srv_port")?,
        );
        let mut out = BTreeMap::new();
        for line in lines {
            let f: Vec<&str> = line.split(' ').collect();
            // Any administrative state but HMAINT (0x40: the name was
            // set by resolution) takes the server out of use.
            let admin: Option<u32> = f.get(admin).and_then(|a| a.parse().ok());
            let in_use =
                admin.is_some_and(|a| a & !0x40 == 0) && f.get(fqdn).is_some_and(|a| *a != "-");
            if in_use {
                out.insert(f.get(port)?.parse().ok()?, f.get(weight)?.parse().ok()?);
            }
        }
        Some((out, text))
    }

    /// Wait (bounded) until the servers in use satisfy `done`; they are
    /// returned. On time-out the runtime API's last answer is shown.
    async fn until(
        &self,
        what: &str,
        done: impl Fn(&BTreeMap<u16, u32>) -> bool,
    ) -> BTreeMap<u16, u32> {
        let deadline = tokio::time::Instant::now() + wait_limit();
        let mut last = String::new();
        loop {
            if let Some((servers, text)) = self.servers().await {
                if done(&servers) {
                    return servers;
                }
                last = text;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: HAProxy's servers never did; its last state:\n{last}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// One command on HAProxy's runtime API; its whole answer.
async fn ask(socket: &Path, command: &str) -> Option<String> {
    let mut s = tokio::net::UnixStream::connect(socket).await.ok()?;
    s.write_all(command.as_bytes()).await.ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    Some(out)
}

fn web(id: &str, port: u16, weight: u32) -> Endpoint {
    Endpoint::new("web", id, format!("127.0.0.{}", port - 8000), port)
        .with_node("node-1")
        .with_weight(weight)
}

/// HAProxy's weight for an SRV weight: it scales the record's 0–65535 to
/// its own 1–256, rounding up (`⌈weight / 256⌉`): weights that are
/// multiples of 256 keep their ratios.
fn haproxy_weight(srv: u32) -> u32 {
    srv.div_ceil(256).max(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_takes_server_weights_from_srv_weights_and_drops_a_draining_endpoint() {
    let stack = start().await;
    let agent = fast_client(&stack.url(), "test", "node-1");
    let weights = [(8001, 256), (8002, 768), (8003, 2560)];
    for (port, w) in weights {
        agent
            .register(web(&format!("w{port}"), port, w))
            .await
            .unwrap();
    }
    let haproxy = HaProxy::start(stack.dns, "_web._tcp.service.registry");
    let want: BTreeMap<u16, u32> = weights
        .iter()
        .map(|(p, w)| (*p, haproxy_weight(*w)))
        .collect();
    let got = haproxy
        .until("three servers from the SRV records", |s| s.len() == 3)
        .await;
    assert_eq!(got, want, "HAProxy's weights by port");
    assert_eq!(got.values().copied().collect::<Vec<_>>(), [1, 3, 10]);

    // A new weight is taken up, rounded up to HAProxy's scale.
    agent.register(web("w8001", 8001, 300)).await.unwrap();
    haproxy
        .until("the new weight taken up", |s| s.get(&8001) == Some(&2))
        .await;

    // Draining: the endpoint leaves the SRV answer, and HAProxy's backend.
    agent
        .register(web("w8002", 8002, 768).with_health(Health::Draining))
        .await
        .unwrap();
    let left = haproxy
        .until("the draining server out of the backend", |s| {
            !s.contains_key(&8002)
        })
        .await;
    assert_eq!(left.keys().copied().collect::<Vec<_>>(), [8001, 8003]);
}
