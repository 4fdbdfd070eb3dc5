//! Test helpers over the shared fixture (`registry_fixtures::EtcdServer`, a
//! real etcd on loopback): starting, restarting and reaching it, a config
//! under a prefix of its own, and a TCP proxy that can cut connections.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use registry_etcd::etcd_client::Client;
use registry_etcd::EtcdConfig;
pub use registry_fixtures::EtcdServer;

/// A fresh etcd of this test's own.
pub async fn start_etcd() -> EtcdServer {
    EtcdServer::start_async()
        .await
        .expect("start etcd (apt-get install etcd-server)")
}

/// Start `etcd` again on its port and data after [`EtcdServer::kill`]
/// (blocking this runtime worker while it comes up).
pub fn restart(etcd: &mut EtcdServer) {
    tokio::task::block_in_place(|| etcd.restart()).expect("restart etcd");
}

/// The client address of `etcd`.
pub fn addr(etcd: &EtcdServer) -> SocketAddr {
    etcd.endpoint()
        .trim_start_matches("http://")
        .parse()
        .expect("the fixture's endpoint is http://ip:port")
}

/// A raw etcd client, for doing things behind the registry's back.
pub async fn client(etcd: &EtcdServer) -> Client {
    Client::connect([etcd.endpoint()], None)
        .await
        .expect("raw etcd client")
}

/// Compact `etcd`'s history past every change made so far.
pub async fn compact(etcd: &EtcdServer) {
    registry_fixtures::registries::compact_etcd(etcd.endpoint())
        .await
        .expect("compact etcd");
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
