//! `etcd` on loopback: in a container, or as a process with its own data
//! directory.

use std::net::SocketAddr;
use std::time::Duration;

use crate::containers::{ContainerSpec, ServerContainer};
use crate::{free_port, FixtureError, Provision, ServerProcess};

/// The image used when `REGISTRY_TEST_ETCD_IMAGE` is not set.
pub const DEFAULT_ETCD_IMAGE: &str = "quay.io/coreos/etcd:v3.5.17";

/// How long etcd may take to answer after a start.
const START_LIMIT: Duration = Duration::from_secs(30);

/// A running single-member etcd. Use a unique key prefix per test.
///
/// [`EtcdServer::start`] picks, in order: the endpoint in
/// `REGISTRY_TEST_ETCD_ENDPOINT`; a container (image
/// `REGISTRY_TEST_ETCD_IMAGE`, default `DEFAULT_ETCD_IMAGE`) when a
/// Docker-compatible engine answers (see [`crate::containers`]); a local
/// `etcd` process.
pub struct EtcdServer {
    endpoint: String,
    inner: Inner,
    /// While killed: its client port, bound and not listening, so that
    /// clients are refused as by a dead server and no other test's
    /// server takes the port meanwhile.
    hold: Option<crate::PortHold>,
}

enum Inner {
    External,
    Container(ServerContainer),
    Process {
        process: Option<ServerProcess>,
        data: tempfile::TempDir,
        client_port: u16,
        peer_port: u16,
    },
}

fn spec() -> ContainerSpec {
    let env = [
        ("ETCD_NAME", "fixture"),
        ("ETCD_DATA_DIR", "/etcd-data"),
        ("ETCD_LISTEN_CLIENT_URLS", "http://0.0.0.0:2379"),
        ("ETCD_ADVERTISE_CLIENT_URLS", "http://127.0.0.1:2379"),
        ("ETCD_LISTEN_PEER_URLS", "http://127.0.0.1:2380"),
        ("ETCD_INITIAL_ADVERTISE_PEER_URLS", "http://127.0.0.1:2380"),
        ("ETCD_INITIAL_CLUSTER", "fixture=http://127.0.0.1:2380"),
        ("ETCD_LOG_LEVEL", "error"),
    ];
    ContainerSpec {
        kind: "etcd",
        image: std::env::var("REGISTRY_TEST_ETCD_IMAGE")
            .ok()
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| DEFAULT_ETCD_IMAGE.to_string()),
        port: 2379,
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        cmd: Vec::new(),
        ready_path: "/health",
        limit: START_LIMIT,
    }
}

impl EtcdServer {
    crate::fixture_starts!("etcd");

    /// Start etcd as a local process on two free loopback ports (fresh
    /// ones when another socket takes one before etcd binds it).
    pub fn start_process() -> Result<Self, FixtureError> {
        crate::on_fresh_ports(Self::start_process_once)
    }

    fn start_process_once() -> Result<Self, FixtureError> {
        let data = tempfile::Builder::new()
            .prefix("etcd-data-")
            .tempdir()
            .map_err(|source| FixtureError::Io {
                what: "creating etcd's data dir".into(),
                source,
            })?;
        let client_port = free_port()?;
        let mut s = Self {
            endpoint: format!("http://127.0.0.1:{client_port}"),
            hold: None,
            inner: Inner::Process {
                process: None,
                data,
                client_port,
                peer_port: free_port()?,
            },
        };
        s.restart()?;
        Ok(s)
    }

    /// The client URL, e.g. `http://127.0.0.1:40123`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// How this server is provided.
    pub fn provision(&self) -> Provision {
        match self.inner {
            Inner::External => Provision::External,
            Inner::Container(_) => Provision::Container,
            Inner::Process { .. } => Provision::Process,
        }
    }

    /// The process id, when etcd runs as a local process
    /// ([`EtcdServer::start_process`]) that is up.
    pub fn pid(&self) -> Option<u32> {
        match &self.inner {
            Inner::Process { process, .. } => process.as_ref().map(ServerProcess::pid),
            _ => None,
        }
    }

    /// The container, when etcd runs in one.
    pub fn container(&self) -> Option<&ServerContainer> {
        match &self.inner {
            Inner::Container(c) => Some(c),
            _ => None,
        }
    }

    /// Kill etcd (a fault: SIGKILL to the process, or `docker stop -t 0`
    /// for a container). Its data survives for [`EtcdServer::restart`].
    /// Does nothing for an external server.
    pub fn kill(&mut self) {
        match &mut self.inner {
            Inner::External => {}
            Inner::Container(c) => {
                if let Err(e) = c.kill() {
                    tracing::warn!("killing the etcd container: {e}");
                }
            }
            Inner::Process { process, .. } => {
                if let Some(p) = process.as_mut() {
                    p.kill();
                }
            }
        }
        if !matches!(self.inner, Inner::External) {
            self.hold = crate::PortHold::take(&self.endpoint);
        }
    }

    /// Start etcd again on the same port with the same data (after
    /// [`EtcdServer::kill`], or killing it first). Does nothing for an
    /// external server.
    pub fn restart(&mut self) -> Result<(), FixtureError> {
        self.hold = None;
        match &mut self.inner {
            Inner::External => Ok(()),
            Inner::Container(c) => c.restart(),
            Inner::Process {
                process,
                data,
                client_port,
                peer_port,
            } => {
                if let Some(p) = process.as_mut() {
                    p.kill();
                }
                let dir = data.path().to_path_buf();
                let (client, peer) = (*client_port, *peer_port);
                *process = Some(ServerProcess::spawn(
                    "etcd",
                    "apt-get install etcd-server (scripts/test does this)",
                    |_| {
                        let client_url = format!("http://127.0.0.1:{client}");
                        let peer_url = format!("http://127.0.0.1:{peer}");
                        vec![
                            "--name=fixture".into(),
                            format!("--data-dir={}", dir.display()),
                            format!("--listen-client-urls={client_url}"),
                            format!("--advertise-client-urls={client_url}"),
                            format!("--listen-peer-urls={peer_url}"),
                            format!("--initial-advertise-peer-urls={peer_url}"),
                            format!("--initial-cluster=fixture={peer_url}"),
                            "--log-level=error".into(),
                        ]
                    },
                    SocketAddr::from(([127, 0, 0, 1], client)),
                    START_LIMIT,
                )?);
                // The port answers before the member has elected itself
                // leader; wait for that too, so that the first request
                // after a (re)start does not fail.
                wait_healthy(SocketAddr::from(([127, 0, 0, 1], client)), START_LIMIT)
            }
        }
    }
}

impl crate::Fixture for EtcdServer {
    const KIND: &'static str = "etcd";
    fn spec() -> ContainerSpec {
        spec()
    }
    fn external() -> Option<Self> {
        let endpoint = std::env::var("REGISTRY_TEST_ETCD_ENDPOINT").ok()?;
        Some(Self {
            endpoint,
            inner: Inner::External,
            hold: None,
        })
    }
    fn in_container(c: ServerContainer) -> Self {
        Self {
            endpoint: format!("http://{}", c.addr()),
            inner: Inner::Container(c),
            hold: None,
        }
    }
    fn start_process() -> Result<Self, FixtureError> {
        Self::start_process()
    }
}

/// Wait until etcd's `/health` on `addr` says `"health":"true"` (it has a
/// leader), at most `limit`.
fn wait_healthy(addr: SocketAddr, limit: Duration) -> Result<(), FixtureError> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if healthy(addr) {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(FixtureError::NotReady {
                program: "etcd".into(),
                addr,
                detail: format!("/health did not say true within {limit:?}"),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `/health` on `addr` answers `"health":"true"`.
fn healthy(addr: SocketAddr) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let req = format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.contains("\"health\":\"true\"")
}
