//! `moto_server`: the AWS emulator (DynamoDB, Cloud Map, …) on loopback,
//! in a container or as a local process.

use std::net::SocketAddr;
use std::time::Duration;

use crate::containers::{ContainerSpec, ServerContainer};
use crate::{free_port, FixtureError, Provision, ServerProcess};

/// The image used when `REGISTRY_TEST_MOTO_IMAGE` is not set (its
/// entrypoint is `moto_server -H 0.0.0.0`, port 5000).
pub const DEFAULT_MOTO_IMAGE: &str = "motoserver/moto:latest";

/// How long moto may take to answer after a start.
const START_LIMIT: Duration = Duration::from_secs(60);

/// A running `moto_server`.
///
/// [`MotoServer::start`] picks, in order: the URL in
/// `REGISTRY_TEST_MOTO_URL`; a container (image `REGISTRY_TEST_MOTO_IMAGE`,
/// default `DEFAULT_MOTO_IMAGE`) when a Docker-compatible engine answers
/// (see [`crate::containers`]); a local `moto_server` process.
///
/// Each test should use its own table / namespace names: one server may be
/// shared. Credentials for the emulator are any non-empty strings; use
/// region `us-east-1`.
pub struct MotoServer {
    url: String,
    inner: Inner,
}

enum Inner {
    External,
    Container(ServerContainer),
    Process(ServerProcess),
}

fn spec() -> ContainerSpec {
    ContainerSpec {
        kind: "moto",
        image: std::env::var("REGISTRY_TEST_MOTO_IMAGE")
            .ok()
            .filter(|i| !i.is_empty())
            .unwrap_or_else(|| DEFAULT_MOTO_IMAGE.to_string()),
        port: 5000,
        env: Vec::new(),
        cmd: Vec::new(),
        ready_path: "/moto-api/",
        limit: START_LIMIT,
    }
}

impl MotoServer {
    crate::fixture_starts!("moto");

    /// Start `moto_server -H 127.0.0.1 -p <free port>` as a local process
    /// (on a fresh port when another socket takes it before moto binds it).
    pub fn start_process() -> Result<Self, FixtureError> {
        crate::on_fresh_ports(Self::start_process_once)
    }

    fn start_process_once() -> Result<Self, FixtureError> {
        let port = free_port()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let process = ServerProcess::spawn(
            "moto_server",
            "pip install 'moto[server]' (scripts/test does this)",
            |_| {
                vec![
                    "-H".into(),
                    "127.0.0.1".into(),
                    "-p".into(),
                    port.to_string(),
                ]
            },
            addr,
            START_LIMIT,
        )?;
        Ok(Self {
            url: format!("http://127.0.0.1:{port}"),
            inner: Inner::Process(process),
        })
    }

    /// The endpoint URL to give the AWS SDK, e.g. `http://127.0.0.1:40123`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// How this server is provided.
    pub fn provision(&self) -> Provision {
        match self.inner {
            Inner::External => Provision::External,
            Inner::Container(_) => Provision::Container,
            Inner::Process(_) => Provision::Process,
        }
    }

    /// The process id, when moto runs as a local process
    /// ([`MotoServer::start_process`]): to pause it with `SIGSTOP`, a
    /// fault it survives (unlike a kill, which loses its state).
    pub fn pid(&self) -> Option<u32> {
        match &self.inner {
            Inner::Process(p) => Some(p.pid()),
            _ => None,
        }
    }

    /// The container, when moto runs in one.
    pub fn container(&self) -> Option<&ServerContainer> {
        match &self.inner {
            Inner::Container(c) => Some(c),
            _ => None,
        }
    }

    /// Stop the server (a fault: SIGKILL to the process, `docker stop -t 0`
    /// for a container). Moto keeps its state in memory, so there is no
    /// restart: a later `start` gives a new, empty one. Does nothing for an
    /// external server.
    pub fn kill(&mut self) {
        match &mut self.inner {
            Inner::External => {}
            Inner::Container(c) => {
                if let Err(e) = c.kill() {
                    tracing::warn!("killing the moto container: {e}");
                }
            }
            Inner::Process(p) => p.kill(),
        }
    }
}

impl crate::Fixture for MotoServer {
    const KIND: &'static str = "moto";
    fn spec() -> ContainerSpec {
        spec()
    }
    fn external() -> Option<Self> {
        let url = std::env::var("REGISTRY_TEST_MOTO_URL").ok()?;
        Some(Self {
            url,
            inner: Inner::External,
        })
    }
    fn in_container(c: ServerContainer) -> Self {
        Self {
            url: format!("http://{}", c.addr()),
            inner: Inner::Container(c),
        }
    }
    fn start_process() -> Result<Self, FixtureError> {
        Self::start_process()
    }
}
