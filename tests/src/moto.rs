//! `moto_server`: the AWS emulator (DynamoDB, Cloud Map, …) on loopback.

use std::net::SocketAddr;
use std::time::Duration;

use crate::{free_port, FixtureError, ServerProcess};

/// A running `moto_server`, or one named by `REGISTRY_TEST_MOTO_URL`.
///
/// Each test should use its own table / namespace names: one server may be
/// shared. Credentials for the emulator are any non-empty strings; use
/// region `us-east-1`.
pub struct MotoServer {
    url: String,
    process: Option<ServerProcess>,
}

impl MotoServer {
    /// Start `moto_server -H 127.0.0.1 -p <free port>` (or use
    /// `REGISTRY_TEST_MOTO_URL` when set).
    pub fn start() -> Result<Self, FixtureError> {
        if let Ok(url) = std::env::var("REGISTRY_TEST_MOTO_URL") {
            return Ok(Self { url, process: None });
        }
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
            Duration::from_secs(60),
        )?;
        Ok(Self {
            url: format!("http://127.0.0.1:{port}"),
            process: Some(process),
        })
    }

    /// The endpoint URL to give the AWS SDK, e.g. `http://127.0.0.1:40123`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Stop the server (a fault); a later `start` gives a new, empty one.
    pub fn kill(&mut self) {
        if let Some(p) = self.process.as_mut() {
            p.kill();
        }
    }
}
