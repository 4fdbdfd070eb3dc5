//! An in-process registrar on loopback for tests, and the clients and
//! certificates the tests use on it.

#![allow(dead_code, clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub mod dashboard;
#[cfg(feature = "http-api")]
pub mod http;
pub mod pki;
#[cfg(any(feature = "http-api", feature = "dns", feature = "xds"))]
pub mod protocols;
#[cfg(feature = "xds")]
pub mod xds;

use waypost_registrar_client::{ClientConfig, RegistrarClient};
use waypost_registrar_server::{Backend, RegistrarConfig, ServeOptions};

/// A registrar served in process on loopback (the fixtures' builder).
pub use waypost_fixtures::registrar::{Running as Server, TestRegistrar};

pub async fn start(backend: Arc<dyn Backend>, cfg: RegistrarConfig) -> Server {
    TestRegistrar::new(backend, cfg)
        .start()
        .await
        .expect("start a registrar")
}

pub async fn start_on(backend: Arc<dyn Backend>, cfg: RegistrarConfig, addr: SocketAddr) -> Server {
    TestRegistrar::new(backend, cfg)
        .on(addr)
        .start()
        .await
        .expect("start a registrar")
}

/// Asserts that `python3` can run `import {modules}`, so that a test
/// driving a Python client fails with how to install what it needs
/// (`packages`, from PyPI) instead of a confusing error.
pub fn require_python(modules: &str, packages: &str) {
    let ok = std::process::Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "python3 cannot import {modules}: install it with \
         `python3 -m pip install {packages}` (scripts/test does)"
    );
}

/// A registrar serving with `options` (mTLS, authorization) on loopback.
pub async fn start_with(
    backend: Arc<dyn Backend>,
    cfg: RegistrarConfig,
    options: ServeOptions,
) -> Server {
    TestRegistrar::new(backend, cfg)
        .options(options)
        .start()
        .await
        .expect("start a registrar")
}

pub fn fast_client(url: &str, cluster: &str, node: &str) -> RegistrarClient {
    let cfg = ClientConfig::new(url, cluster, node)
        .with_reconnect(Duration::from_millis(10), Duration::from_millis(200))
        .with_retry_interval(Duration::from_millis(50));
    RegistrarClient::connect(cfg).unwrap()
}
