//! Test fixtures: a real `etcd` as a local process on free loopback ports,
//! a TCP proxy that can cut connections, and a registry that owns its etcd.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use registry_etcd::etcd_client::{Client, CompactionOptions, PutOptions};
use registry_etcd::{EtcdConfig, EtcdRegistry};

/// How long etcd may take to answer after a start.
const START_LIMIT: Duration = Duration::from_secs(30);

/// One etcd server on loopback with its own data directory. Killed on
/// drop; also killed when the test process dies, however it dies: etcd runs
/// under a small shell that kills it when its standard input (a pipe from
/// this process) closes.
pub struct Etcd {
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    child: Option<(Child, ChildStdin)>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
}

impl Etcd {
    /// Start a fresh etcd and wait until it answers.
    pub async fn start() -> Etcd {
        let dir = tempfile::tempdir().expect("temp dir for etcd");
        let mut etcd = Etcd {
            dir,
            client_port: free_port(),
            peer_port: free_port(),
            child: None,
        };
        etcd.spawn().await;
        etcd
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// The client address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    async fn spawn(&mut self) {
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let data = self.dir.path().join("data");
        let args = [
            "--name".to_string(),
            "test".to_string(),
            "--data-dir".to_string(),
            data.display().to_string(),
            "--listen-client-urls".to_string(),
            self.url(),
            "--advertise-client-urls".to_string(),
            self.url(),
            "--listen-peer-urls".to_string(),
            peer.clone(),
            "--initial-advertise-peer-urls".to_string(),
            peer.clone(),
            "--initial-cluster".to_string(),
            format!("test={peer}"),
            "--logger".to_string(),
            "zap".to_string(),
            "--log-level".to_string(),
            "warn".to_string(),
        ];
        let script = r#"log="$1"; shift
etcd "$@" >>"$log" 2>&1 &
pid=$!
read _ignored
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
exit 0"#;
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("etcd-wrapper")
            .arg(self.log_path())
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start etcd (is the `etcd` binary on PATH? Debian: etcd-server)");
        let stdin = child.stdin.take().expect("piped stdin");
        self.child = Some((child, stdin));
        self.wait_ready().await;
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if self.healthy() {
                return;
            }
            if let Some((child, _)) = &mut self.child {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("etcd exited with {status}: {}", self.log());
                }
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not answer within {START_LIMIT:?}: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether `/health` answers `true` (etcd has a leader).
    fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect_timeout(&self.addr(), Duration::from_millis(200)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let req = format!(
            "GET /health HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
            self.client_port
        );
        if s.write_all(req.as_bytes()).is_err() {
            return false;
        }
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body.contains("\"health\":\"true\"")
    }

    /// The last lines etcd logged.
    pub fn log(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Kill etcd with SIGKILL and wait until it is gone.
    pub fn kill(&mut self) {
        if let Some((mut child, stdin)) = self.child.take() {
            drop(stdin); // the wrapper kills etcd with SIGKILL and waits for it
            let _ = child.wait();
        }
    }

    /// Start etcd again on the same data directory and ports.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    /// A raw etcd client, for doing things behind the registry's back.
    pub async fn client(&self) -> Client {
        Client::connect([self.url()], None)
            .await
            .expect("raw etcd client")
    }

    /// Compact etcd's history at its current revision, after one write
    /// outside every test prefix so that the compaction revision is past
    /// every change made so far.
    pub async fn compact(&self) {
        let mut c = self.client().await;
        let resp = c
            .put("/filler", "x", None::<PutOptions>)
            .await
            .expect("filler write");
        let rev = resp.header().expect("header").revision();
        c.compact(rev, Some(CompactionOptions::new().with_physical()))
            .await
            .expect("compact");
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A config for `url` under a prefix of its own.
pub fn config(url: &str) -> EtcdConfig {
    EtcdConfig::new([url.to_string()])
        .with_prefix(format!("/{}", registry_api::testing::unique("test")))
        .with_request_timeout(Duration::from_secs(5))
        .with_connect_timeout(Duration::from_secs(2))
}

/// A TCP proxy in front of etcd whose connections can be cut.
pub struct Proxy {
    pub port: u16,
    up: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Forward `127.0.0.1:<port>` to `target`.
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("proxy bind");
        let port = listener.local_addr().expect("proxy addr").port();
        let up = Arc::new(AtomicBool::new(true));
        let conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let (up2, conns2) = (up.clone(), conns.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !up2.load(Ordering::SeqCst) {
                    continue; // dropped: the connection is refused
                }
                let task = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                conns2.lock().expect("conns").push(task);
            }
        });
        Proxy {
            port,
            up,
            conns,
            accept,
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Drop every connection and refuse new ones.
    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for task in self.conns.lock().expect("conns").drain(..) {
            task.abort();
        }
    }

    /// Accept connections again.
    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// A registry with an etcd of its own (for the conformance suite, whose
/// history check compacts the whole server).
pub struct Harness {
    pub reg: EtcdRegistry,
    pub etcd: Etcd,
}

impl Harness {
    pub async fn start() -> Harness {
        let etcd = Etcd::start().await;
        let reg = EtcdRegistry::connect(config(&etcd.url()))
            .await
            .expect("connect to the test etcd");
        Harness { reg, etcd }
    }
}

/// The next item of `w` within [`registry_api::testing::wait_limit`]:
/// `Ok(event)` or the failure the watch reported. Panics on timeout or on
/// the end of the stream.
pub async fn next_item(
    w: &mut registry_api::EventStream,
    what: &str,
) -> registry_api::Result<registry_api::Event> {
    use futures::StreamExt;
    let limit = registry_api::testing::wait_limit();
    match tokio::time::timeout(limit, w.next()).await {
        Ok(Some(item)) => item,
        Ok(None) => panic!("watch ended while waiting for {what}"),
        Err(_) => panic!("timed out after {limit:?} waiting for {what}"),
    }
}

/// The next event of `w` that concerns `service` (a snapshot always does),
/// counting the failures reported on the way in `errors`.
pub async fn next_ok_for(
    w: &mut registry_api::EventStream,
    service: &str,
    errors: &mut usize,
    what: &str,
) -> registry_api::Event {
    loop {
        match next_item(w, what).await {
            Err(_) => *errors += 1,
            Ok(ev @ registry_api::Event::Snapshot(_)) => return ev,
            Ok(ev) if ev.key().is_some_and(|k| k.service == service) => return ev,
            Ok(_) => {}
        }
    }
}
