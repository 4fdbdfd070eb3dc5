//! Least privilege and limits over real gRPC on loopback: an authorization
//! policy file, requests refused before they are read, plaintext only on
//! loopback, mTLS only with authorization.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::pki::Pki;
use common::{start_with, Server, TestRegistrar};
use tonic::{Code, Status};
use waypost::testing::ep;
use waypost::{liveness::Liveness, memory::MemoryRegistry, Endpoint, ErrorKind};
use waypost_fixtures::registrar::Running;
use waypost_registrar_client::proto::registrar::v1::{
    ListAllEndpointsRequest, RegisterEndpointRequest, WatchEndpointsRequest,
};
use waypost_registrar_client::{endpoint_to_proto, ClientConfig, RpcClient};
use waypost_registrar_server::{AuthzConfig, Backend, RegistrarConfig, ServeOptions, TlsFiles};

const TD: &str = "example.org";
const CLUSTER: &str = "east";

const POLICY: &str = r#"
[[rule]]
name = "agents"
ids = ["spiffe://example.org/node/{node}"]
read = true
write = { addresses = ["10.0.0.0/8"] }

[[rule]]
name = "payments"
ids = ["spiffe://example.org/ns/payments/sa/deployer"]
write = { services = ["payments", "payments-*"], nodes = ["*"] }
"#;

fn memory() -> Arc<dyn Backend> {
    Arc::new(Liveness::new(MemoryRegistry::new()))
}

async fn start_policy(pki: &Pki) -> Server {
    let path = pki.path().join("authz.toml");
    std::fs::write(&path, POLICY).unwrap();
    let opts = ServeOptions::default()
        .with_tls(pki.server_files.clone())
        .with_authz(AuthzConfig::new(TD).with_policy_file(path));
    start_with(memory(), RegistrarConfig::new(CLUSTER), opts).await
}

fn client(server: &Server, files: TlsFiles) -> RpcClient {
    let url = format!("https://{}", server.addr);
    RpcClient::connect(ClientConfig::new(url, CLUSTER, "cli").with_tls(files)).unwrap()
}

fn as_id(pki: &Pki, name: &str, id: &str) -> TlsFiles {
    pki.agent(&pki.ca, name, Some(id))
}

async fn register(c: &RpcClient, e: &Endpoint) -> Result<(), Status> {
    let req = RegisterEndpointRequest {
        endpoint: Some(endpoint_to_proto(e)),
        ..Default::default()
    };
    c.grpc().register_endpoint(req).await.map(drop)
}

fn at(mut e: Endpoint, address: &str) -> Endpoint {
    e.address = address.to_string();
    e
}

fn denied(r: Result<(), Status>, want: &[&str]) {
    let s = r.unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    for w in want {
        assert!(s.message().contains(w), "{w:?} not in {:?}", s.message());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_file_limits_services_clusters_nodes_and_addresses() {
    let pki = Pki::new();
    let server = start_policy(&pki).await;
    let n1 = client(&server, as_id(&pki, "n1", "spiffe://example.org/node/n1"));
    let deployer = client(
        &server,
        as_id(&pki, "dep", "spiffe://example.org/ns/payments/sa/deployer"),
    );
    let stranger = client(&server, as_id(&pki, "x", "spiffe://example.org/ci/job"));
    let own = at(
        ep("api", "a1", 80).with_node("n1").with_cluster(CLUSTER),
        "10.0.0.7",
    );

    register(&n1, &own).await.unwrap();
    denied(
        register(&n1, &own.clone().with_node("n2")).await,
        &["rule \"agents\"", "node \"n2\""],
    );
    denied(
        register(&n1, &own.clone().with_cluster("west")).await,
        &["rule \"agents\"", "cluster \"west\""],
    );
    denied(
        register(&n1, &at(own.clone(), "192.168.0.9")).await,
        &["rule \"agents\"", "address \"192.168.0.9\"", "10.0.0.0/8"],
    );

    let pay = at(
        ep("payments-api", "p1", 80)
            .with_node("pool")
            .with_cluster(CLUSTER),
        "db.internal",
    );
    register(&deployer, &pay).await.unwrap();
    denied(
        register(&deployer, &ep("auth", "x", 80).with_cluster(CLUSTER)).await,
        &["rule \"payments\"", "service \"auth\""],
    );
    // Taking over an agent's key is writing that agent's endpoint.
    let takeover = ep("api", "a1", 80).with_node("n1").with_cluster(CLUSTER);
    denied(
        register(&deployer, &takeover).await,
        &["rule \"payments\"", "service \"api\""],
    );
    // The deployer's rule allows no reads; an ID no rule matches, nothing.
    denied(
        deployer
            .grpc()
            .list_all_endpoints(ListAllEndpointsRequest {})
            .await
            .map(drop),
        &["rule \"payments\"", "no reads"],
    );
    denied(
        deployer
            .grpc()
            .watch_endpoints(WatchEndpointsRequest::default())
            .await
            .map(drop),
        &["no reads"],
    );
    denied(
        stranger
            .grpc()
            .list_all_endpoints(ListAllEndpointsRequest {})
            .await
            .map(drop),
        &["spiffe://example.org/ci/job", "no rule"],
    );
    // Nothing refused was written.
    let stored: BTreeMap<String, String> = n1
        .grpc()
        .list_all_endpoints(ListAllEndpointsRequest {})
        .await
        .unwrap()
        .into_inner()
        .endpoints
        .into_iter()
        .map(|e| (e.id, e.address))
        .collect();
    assert_eq!(
        stored,
        BTreeMap::from([
            ("a1".to_string(), "10.0.0.7".to_string()),
            ("p1".to_string(), "db.internal".to_string())
        ])
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_refused_before_they_are_read() {
    let pki = Pki::new();
    let server = start_policy(&pki).await;
    let mut big = ep("api", "big", 80).with_node("n1").with_cluster(CLUSTER);
    big.labels.insert("blob".into(), "x".repeat(8 << 20));
    // No client certificate: refused for that, from the headers, whatever
    // the size of the message (decoding it first would answer
    // OUT_OF_RANGE).
    let anonymous = client(&server, TlsFiles::ca_only(pki.ca_path()));
    let s = register(&anonymous, &big).await.unwrap_err();
    assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    // An ID no rule matches: refused before its message is read too.
    let stranger = client(&server, as_id(&pki, "x", "spiffe://example.org/ci/job"));
    let s = register(&stranger, &big).await.unwrap_err();
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    // An agent: a message over the limit (64 KiB) is refused by size.
    let n1 = client(&server, as_id(&pki, "n1", "spiffe://example.org/node/n1"));
    let mut large = big.clone();
    large.labels.insert("blob".into(), "x".repeat(100 << 10));
    let s = register(&n1, &large).await.unwrap_err();
    assert_eq!(s.code(), Code::OutOfRange, "{s:?}");
    assert!(s.message().contains("65536"), "{}", s.message());
    server.stop().await;

    // Raised, the same message is read and then refused as invalid (an
    // endpoint is at most 16 KiB).
    let opts = ServeOptions::default().with_max_request_bytes(1 << 20);
    let server = start_with(memory(), RegistrarConfig::new(CLUSTER), opts).await;
    let plain = RpcClient::connect(ClientConfig::new(server.url(), CLUSTER, "cli")).unwrap();
    let s = register(&plain, &large).await.unwrap_err();
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    server.stop().await;
}

/// Serve with `options` on `grpc`.
async fn spawn_serve(grpc: tokio::net::TcpListener, options: ServeOptions) -> Running {
    TestRegistrar::new(memory(), RegistrarConfig::new(CLUSTER))
        .options(options)
        .listener(grpc)
        .start()
        .await
        .unwrap()
}

/// What a server refusing its options returned (it must return by itself).
async fn refused(grpc: tokio::net::TcpListener, options: ServeOptions) -> waypost::Error {
    let running = spawn_serve(grpc, options).await;
    tokio::time::timeout(std::time::Duration::from_secs(10), running.wait())
        .await
        .expect("the server refused to start")
        .unwrap_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_is_served_on_loopback_only_unless_insecure() {
    let all = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let e = refused(all, ServeOptions::default()).await;
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("--insecure"), "{e}");
    assert!(e.to_string().contains("grpc_addr"), "{e}");

    // Explicitly insecure: served (reached here over loopback).
    let all = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = all.local_addr().unwrap().port();
    let running = spawn_serve(all, ServeOptions::default().allow_insecure()).await;
    let url = format!("http://127.0.0.1:{port}");
    let c = RpcClient::connect(ClientConfig::new(url, CLUSTER, "cli")).unwrap();
    register(&c, &ep("api", "1", 80)).await.unwrap();
    running.stop_result().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_without_authorization_must_be_asked_for() {
    let pki = Pki::new();
    let tls = ServeOptions::default().with_tls(pki.server_files.clone());
    let e = tls.check().unwrap_err();
    assert!(e.to_string().contains("--allow-any-certificate"), "{e}");
    let loopback = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let e = refused(loopback, tls.clone()).await;
    assert!(e.to_string().contains("--allow-any-certificate"), "{e}");
    let any = tls.allow_any_certificate();
    any.check().unwrap();
    let server = start_with(memory(), RegistrarConfig::new(CLUSTER), any).await;
    let c = client(&server, as_id(&pki, "x", "spiffe://elsewhere.org/anything"));
    register(&c, &ep("api", "1", 80).with_node("whatever"))
        .await
        .unwrap();
    server.stop().await;
}
