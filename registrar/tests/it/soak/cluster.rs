//! What the soak runs and breaks: two `registrar serve` replicas (on fixed
//! loopback ports, so a restarted one comes back where its proxy points),
//! the backend they share, and a direct reader of that backend.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use waypost::{Registry, Snapshot};

use waypost_fixtures::proxy::CutProxy;

/// The backend under the replicas.
pub enum Backend {
    Sqlite(PathBuf),
    #[cfg(feature = "etcd")]
    Etcd(waypost_fixtures::EtcdServer),
    #[cfg(feature = "dynamodb")]
    DynamoDb(waypost_fixtures::MotoServer, String),
}

impl Backend {
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite(_) => "sqlite",
            #[cfg(feature = "etcd")]
            Backend::Etcd(_) => "etcd",
            #[cfg(feature = "dynamodb")]
            Backend::DynamoDb(..) => "dynamodb",
        }
    }

    /// `serve`'s flags for this backend.
    fn args(&self) -> Vec<String> {
        match self {
            Backend::Sqlite(path) => vec![format!("--sqlite-path={}", path.display())],
            #[cfg(feature = "etcd")]
            Backend::Etcd(etcd) => vec![format!("--etcd-endpoints={}", etcd.endpoint())],
            #[cfg(feature = "dynamodb")]
            Backend::DynamoDb(moto, table) => vec![
                format!("--dynamodb-table={table}"),
                "--dynamodb-create-table".into(),
                format!("--aws-endpoint-url={}", moto.url()),
                "--aws-region=us-east-1".into(),
            ],
        }
    }

    fn env(&self) -> Vec<(&'static str, &'static str)> {
        match self {
            #[cfg(feature = "dynamodb")]
            Backend::DynamoDb(..) => vec![
                ("AWS_ACCESS_KEY_ID", "test"),
                ("AWS_SECRET_ACCESS_KEY", "test"),
            ],
            _ => Vec::new(),
        }
    }

    /// The backend's process, when it runs as one the soak may pause.
    pub fn pid(&self) -> Option<u32> {
        match self {
            Backend::Sqlite(_) => None,
            #[cfg(feature = "etcd")]
            Backend::Etcd(etcd) => etcd.pid(),
            #[cfg(feature = "dynamodb")]
            Backend::DynamoDb(moto, _) => moto.pid(),
        }
    }

    /// Whether the backend survives a kill (its data on disk).
    pub fn can_restart(&self) -> bool {
        match self {
            #[cfg(feature = "etcd")]
            Backend::Etcd(etcd) => etcd.pid().is_some(),
            _ => false,
        }
    }

    /// SIGKILL the backend (etcd only).
    pub fn kill(&mut self) {
        #[cfg(feature = "etcd")]
        if let Backend::Etcd(etcd) = self {
            etcd.kill();
        }
    }

    /// Start it again on the same port with the same data (etcd only).
    pub fn restart(&mut self) {
        #[cfg(feature = "etcd")]
        if let Backend::Etcd(etcd) = self {
            etcd.restart().expect("etcd did not come back");
        }
    }

    /// Every endpoint the backend holds, read directly; `None` when the
    /// backend does not answer within 30 s (a loaded emulator), to be
    /// asked again.
    pub async fn snapshot(&self) -> Option<Snapshot> {
        tokio::time::timeout(Duration::from_secs(30), self.read())
            .await
            .ok()
            .flatten()
    }

    async fn read(&self) -> Option<Snapshot> {
        let reader: Arc<dyn Registry> = match self {
            Backend::Sqlite(path) => {
                Arc::new(waypost_sqlite::SqliteRegistry::open_path(path).await.ok()?)
            }
            #[cfg(feature = "etcd")]
            Backend::Etcd(etcd) => Arc::new(
                waypost_etcd::EtcdRegistry::connect(waypost_etcd::EtcdConfig::new(vec![etcd
                    .endpoint()
                    .to_string()]))
                .await
                .ok()?,
            ),
            #[cfg(feature = "dynamodb")]
            Backend::DynamoDb(moto, table) => Arc::new(
                waypost_dynamodb::DynamoDbRegistry::connect(
                    waypost_dynamodb::DynamoDbConfig::new(table.clone())
                        .with_region("us-east-1")
                        .with_endpoint_url(moto.url())
                        .with_static_credentials("test", "test"),
                )
                .await
                .ok()?,
            ),
        };
        reader.snapshot().await.ok()
    }
}

/// Send `signal` (`KILL`, `STOP`, `CONT`, `TERM`) to `pid`.
pub fn signal(pid: u32, signal: &str) {
    let _ = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status();
}

/// A free loopback port below the kernel's ephemeral range (32768 and
/// up): a replica restarts on its ports, and a port from the ephemeral
/// range could meanwhile be handed to a connection or a `:0` listener of
/// another test.
fn free_addr() -> SocketAddr {
    use rand::RngExt;
    let mut rng = rand::rng();
    loop {
        let port = rng.random_range(20_000..32_000);
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return l.local_addr().unwrap();
        }
    }
}

/// The last lines of a replica's log, for a failure message.
fn tail(log: &std::path::Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(20).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// One `registrar serve` replica, with the proxy agents reach it through.
pub struct Replica {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub health: SocketAddr,
    pub proxy: CutProxy,
    child: Option<Child>,
    log: PathBuf,
    /// `serve` flags beside the soak's own.
    extra: Vec<String>,
}

impl Replica {
    /// Start a replica on `backend`, logging to `log`, with `extra`
    /// `serve` flags beside the soak's own.
    pub async fn start_with(backend: &Backend, log: PathBuf, extra: Vec<String>) -> Replica {
        let grpc = free_addr();
        let mut r = Replica {
            grpc,
            http: free_addr(),
            health: free_addr(),
            proxy: CutProxy::start(grpc).await.expect("proxy"),
            child: None,
            log,
            extra,
        };
        r.spawn(backend).await;
        r
    }

    /// Start the process on this replica's ports and wait for its
    /// `registrar listening` line.
    pub async fn spawn(&mut self, backend: &Backend) {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_registrar"))
            .arg("serve")
            .arg(format!("--grpc-addr={}", self.grpc))
            .arg(format!("--health-addr={}", self.health))
            .arg(format!("--http-api-addr={}", self.http))
            .arg("--cluster-name=soak")
            .arg("--drain-timeout=5s")
            .args(backend.args())
            .args(&self.extra)
            .envs(backend.env())
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("a replica did not start:\n{}", tail(&self.log)))
            .unwrap();
        assert!(
            line.is_some_and(|l| l.starts_with("registrar listening")),
            "a replica exited at start:\n{}",
            tail(&self.log)
        );
        self.child = Some(child);
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// SIGKILL, and reap it.
    pub async fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            let _ = c.wait().await;
        }
    }

    /// SIGTERM (a drain), reaped within the drain timeout; whether it
    /// exited 0.
    pub async fn terminate(&mut self) -> bool {
        let Some(mut c) = self.child.take() else {
            return true;
        };
        if let Some(pid) = c.id() {
            signal(pid, "TERM");
        }
        match tokio::time::timeout(Duration::from_secs(30), c.wait()).await {
            Ok(Ok(status)) => status.success(),
            _ => {
                let _ = c.start_kill();
                false
            }
        }
    }

    pub fn pause(&mut self) {
        if let Some(pid) = self.pid() {
            signal(pid, "STOP");
        }
    }

    pub fn resume(&mut self) {
        if let Some(pid) = self.pid() {
            signal(pid, "CONT");
        }
    }

    pub fn url(&self) -> String {
        self.proxy.url()
    }
}
