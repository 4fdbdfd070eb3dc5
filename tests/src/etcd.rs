//! `etcd` on loopback with its own data directory.

use std::net::SocketAddr;
use std::time::Duration;

use crate::{free_port, FixtureError, ServerProcess};

/// A running single-member etcd, or one named by
/// `REGISTRY_TEST_ETCD_ENDPOINT`. Use a unique key prefix per test.
pub struct EtcdServer {
    endpoint: String,
    process: Option<ServerProcess>,
    data: Option<tempfile::TempDir>,
    client_port: u16,
    peer_port: u16,
}

impl EtcdServer {
    /// Start `etcd` on two free loopback ports (or use
    /// `REGISTRY_TEST_ETCD_ENDPOINT` when set).
    pub fn start() -> Result<Self, FixtureError> {
        if let Ok(endpoint) = std::env::var("REGISTRY_TEST_ETCD_ENDPOINT") {
            return Ok(Self {
                endpoint,
                process: None,
                data: None,
                client_port: 0,
                peer_port: 0,
            });
        }
        let mut s = Self {
            endpoint: String::new(),
            process: None,
            data: Some(
                tempfile::Builder::new()
                    .prefix("etcd-data-")
                    .tempdir()
                    .map_err(|source| FixtureError::Io {
                        what: "creating etcd's data dir".into(),
                        source,
                    })?,
            ),
            client_port: free_port()?,
            peer_port: free_port()?,
        };
        s.endpoint = format!("http://127.0.0.1:{}", s.client_port);
        s.restart()?;
        Ok(s)
    }

    /// The client URL, e.g. `http://127.0.0.1:40123`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Kill etcd (a fault). Its data survives for [`EtcdServer::restart`].
    pub fn kill(&mut self) {
        if let Some(p) = self.process.as_mut() {
            p.kill();
        }
    }

    /// Start etcd again on the same ports with the same data.
    pub fn restart(&mut self) -> Result<(), FixtureError> {
        let Some(dir) = self.data.as_ref().map(|d| d.path().to_path_buf()) else {
            return Ok(());
        };
        self.kill();
        let (client, peer) = (self.client_port, self.peer_port);
        let process = ServerProcess::spawn(
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
            Duration::from_secs(30),
        )?;
        self.process = Some(process);
        Ok(())
    }
}
