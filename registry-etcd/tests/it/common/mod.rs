//! Test helpers over the shared fixture (`waypost_fixtures::EtcdServer`, a
//! real etcd on loopback): starting, restarting and reaching it, a config
//! under a prefix of its own (the fixtures' `configs::etcd`), and the
//! fixtures' proxy that cuts connections.
#![allow(dead_code)]

use std::net::SocketAddr;

use waypost_etcd::etcd_client::Client;
pub use waypost_fixtures::EtcdServer;

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
    waypost_fixtures::registries::compact_etcd(etcd.endpoint())
        .await
        .expect("compact etcd");
}

pub use waypost_fixtures::configs::etcd as config;
pub use waypost_fixtures::proxy::CutProxy;
