//! mTLS and authorization over real gRPC on loopback, with certificates
//! made in the test: own node allowed, other nodes refused, unknown CA and
//! missing certificates refused, rotated certificates and CA bundles
//! picked up without a restart. `registrar serve` waiting for certificate
//! files written after it starts is `waypost-registrar`'s `tests/it/tls.rs`.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use common::pki::{write_bundle, Ca, Pki};
use common::{start_with, Server};
use tonic::Code;
use waypost::testing::{ep, eventually};
use waypost::{liveness::Liveness, memory::MemoryRegistry, Registry};
use waypost_registrar_client::proto::registrar::v1::{
    HeartbeatRequest, ListAllEndpointsRequest, RegisterEndpointRequest, UnregisterEndpointRequest,
};
use waypost_registrar_client::{endpoint_to_proto, ClientConfig, RegistrarClient, RpcClient};
use waypost_registrar_server::{AuthzConfig, Backend, RegistrarConfig, ServeOptions, TlsFiles};

const TD: &str = "example.org";

fn memory() -> Arc<dyn Backend> {
    Arc::new(Liveness::new(MemoryRegistry::new()))
}

async fn start_secure(pki: &Pki, authz: Option<AuthzConfig>) -> Server {
    let mut opts = ServeOptions::default().with_tls(pki.server_files.clone());
    if let Some(a) = authz {
        opts = opts.with_authz(a);
    }
    // The cluster of the test endpoints (`ep`): agents write endpoints of
    // their own node in the registrar's own cluster.
    let cfg = RegistrarConfig::new(waypost::Endpoint::DEFAULT_CLUSTER);
    start_with(memory(), cfg, opts).await
}

fn url(server: &Server) -> String {
    format!("https://{}", server.addr)
}

fn raw(server: &Server, files: TlsFiles) -> RpcClient {
    RpcClient::connect(ClientConfig::new(url(server), "test", "cli").with_tls(files)).unwrap()
}

async fn register_code(client: &RpcClient, node: &str, id: &str) -> Code {
    let req = RegisterEndpointRequest {
        endpoint: Some(endpoint_to_proto(&ep("api", id, 8080).with_node(node))),
        ..Default::default()
    };
    match client.grpc().register_endpoint(req).await {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

/// How a call on a connection whose handshake the server aborted fails
/// (which one depends on whether the server's alert or the closed
/// connection is seen first).
fn refused(code: Code) -> bool {
    matches!(code, Code::Cancelled | Code::Unknown | Code::Unavailable)
}

async fn unregister_code(client: &RpcClient, id: &str) -> Code {
    let req = UnregisterEndpointRequest {
        service_name: "api".into(),
        id: id.into(),
        ..Default::default()
    };
    match client.grpc().unregister_endpoint(req).await {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_writes_its_own_node_only() {
    let pki = Pki::new();
    let server = start_secure(&pki, Some(AuthzConfig::new(TD))).await;
    let n1 = raw(
        &server,
        pki.agent(&pki.ca, "n1", Some("spiffe://example.org/node/n1")),
    );
    let n2 = raw(
        &server,
        pki.agent(&pki.ca, "n2", Some("spiffe://example.org/node/n2")),
    );

    assert_eq!(register_code(&n1, "n1", "a1").await, Code::Ok);
    assert_eq!(register_code(&n2, "n2", "b1").await, Code::Ok);
    // Another node's endpoint: neither a new one, nor taking over one of
    // node 2's keys, nor removing it.
    assert_eq!(register_code(&n1, "n2", "a2").await, Code::PermissionDenied);
    assert_eq!(register_code(&n1, "n1", "b1").await, Code::PermissionDenied);
    assert_eq!(unregister_code(&n1, "b1").await, Code::PermissionDenied);
    // Heartbeats likewise.
    let hb = |node: &str| HeartbeatRequest {
        node_name: node.into(),
    };
    let r = n1.grpc().heartbeat(hb("n1")).await;
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(
        n1.grpc().heartbeat(hb("n2")).await.unwrap_err().code(),
        Code::PermissionDenied
    );
    // The refused writes changed nothing.
    let snap = n1.snapshot().await.unwrap();
    let nodes: Vec<(String, String)> = snap
        .iter()
        .map(|e| (e.id.clone(), e.node.clone()))
        .collect();
    assert_eq!(
        nodes,
        vec![("a1".into(), "n1".into()), ("b1".into(), "n2".into())]
    );
    // Its own: removing works.
    assert_eq!(unregister_code(&n1, "a1").await, Code::Ok);
    // The error says who may not write what.
    let err = n1
        .register(ep("api", "x", 1).with_node("n2"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("node \"n2\""), "{err}");

    // The agent client over mTLS: cache, stream, writes.
    let agent = RegistrarClient::connect(
        ClientConfig::new(url(&server), "test", "n1").with_tls(pki.agent(
            &pki.ca,
            "n1b",
            Some("spiffe://example.org/node/n1"),
        )),
    )
    .unwrap();
    agent.cache().wait_until_ready().await;
    agent
        .register(ep("web", "w1", 80).with_node("n1"))
        .await
        .unwrap();
    eventually("n2 sees n1's endpoint through the stream", || async {
        n2.list("web").await.ok().filter(|l| l.len() == 1)
    })
    .await;
    assert_eq!(agent.list("api").await.unwrap().len(), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_trust_domain_no_id_and_readers_are_denied_writes() {
    let pki = Pki::new();
    let server = start_secure(
        &pki,
        Some(AuthzConfig::new(TD).with_admin("spiffe://example.org/ops/cli")),
    )
    .await;
    let foreign = raw(
        &server,
        pki.agent(&pki.ca, "f", Some("spiffe://other.org/node/n1")),
    );
    let anonymous = raw(&server, pki.agent(&pki.ca, "x", None));
    let reader = raw(
        &server,
        pki.agent(&pki.ca, "r", Some("spiffe://example.org/dashboard")),
    );
    let admin = raw(
        &server,
        pki.agent(&pki.ca, "ops", Some("spiffe://example.org/ops/cli")),
    );

    assert_eq!(
        register_code(&foreign, "n1", "f1").await,
        Code::PermissionDenied
    );
    let list = foreign
        .grpc()
        .list_all_endpoints(ListAllEndpointsRequest {})
        .await;
    assert_eq!(list.unwrap_err().code(), Code::PermissionDenied);
    assert_eq!(
        register_code(&anonymous, "n1", "x1").await,
        Code::PermissionDenied
    );
    // A reader of the trust domain reads but does not write.
    assert_eq!(
        register_code(&reader, "n1", "r1").await,
        Code::PermissionDenied
    );
    assert!(reader.snapshot().await.unwrap().is_empty());
    // An admin writes any node.
    assert_eq!(register_code(&admin, "n7", "o1").await, Code::Ok);
    assert_eq!(unregister_code(&admin, "o1").await, Code::Ok);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_untrusted_certificates_are_refused() {
    let pki = Pki::new();
    let server = start_secure(&pki, Some(AuthzConfig::new(TD))).await;

    // No client certificate: the handshake passes, every call is
    // UNAUTHENTICATED with a reason.
    let none = raw(&server, TlsFiles::ca_only(pki.ca_path()));
    let status = none
        .grpc()
        .list_all_endpoints(ListAllEndpointsRequest {})
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(
        status.message().contains("no client certificate"),
        "{status:?}"
    );
    assert_eq!(register_code(&none, "n1", "z").await, Code::Unauthenticated);

    // A certificate of an unknown CA with a valid-looking ID: the server
    // aborts the TLS handshake. In TLS 1.3 the client has finished its side
    // of the handshake by then, so the call fails as the connection closes
    // (CANCELLED "connection closed"; or UNKNOWN "transport error" caused
    // by "received fatal alert: UnknownCA" when the alert arrives first),
    // and nothing is written.
    let rogue_ca = Ca::new("rogue CA");
    let rogue = raw(
        &server,
        pki.agent(&rogue_ca, "rogue", Some("spiffe://example.org/node/n1")),
    );
    let status = rogue
        .grpc()
        .register_endpoint(RegisterEndpointRequest {
            endpoint: Some(endpoint_to_proto(&ep("api", "evil", 1).with_node("n1"))),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(refused(status.code()), "{status:?}");
    let err = rogue.snapshot().await.unwrap_err();
    assert_eq!(err.kind(), waypost::ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains(&server.addr.to_string()), "{err}");

    // A plaintext client gets nowhere either.
    let plain = RpcClient::connect(ClientConfig::new(
        format!("http://{}", server.addr),
        "t",
        "p",
    ))
    .unwrap();
    assert!(plain.snapshot().await.is_err());

    // The good agent still works and nothing was written by the others.
    let good = raw(
        &server,
        pki.agent(&pki.ca, "n1", Some("spiffe://example.org/node/n1")),
    );
    assert!(good.snapshot().await.unwrap().is_empty());
    server.stop().await;
}

/// The certificate the server presents to a new connection.
async fn presented_cert(server: &Server, ca: &Path) -> Vec<u8> {
    let cfg = waypost_registrar_client::tls::client_config(&TlsFiles::ca_only(ca)).unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = connector.connect(name, tcp).await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn der_of(pem: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_certificates_are_picked_up_without_restart() {
    let pki = Pki::new();
    let server = start_secure(&pki, Some(AuthzConfig::new(TD))).await;
    let first = presented_cert(&server, &pki.ca_path()).await;

    // SPIRE writes a new SVID over the old files.
    let rotated = pki.ca.server();
    rotated.write(pki.path(), "server");
    assert_ne!(der_of(&rotated.cert), first);
    let now = presented_cert(&server, &pki.ca_path()).await;
    assert_eq!(
        now,
        der_of(&rotated.cert),
        "the server still presents the old certificate"
    );

    // A new trust bundle: agents of the new CA are refused until the
    // server's CA file includes it, then accepted.
    let new_ca = Ca::new("next CA");
    let next = raw(
        &server,
        pki.agent(&new_ca, "next", Some("spiffe://example.org/node/n9")),
    );
    assert!(refused(register_code(&next, "n9", "n9-a").await));
    write_bundle(pki.path(), "ca.pem", &[&pki.ca, &new_ca]);
    let next = raw(
        &server,
        pki.agent(&new_ca, "next", Some("spiffe://example.org/node/n9")),
    );
    assert_eq!(register_code(&next, "n9", "n9-a").await, Code::Ok);

    server.stop().await;
}

#[test]
fn an_agents_certificate_is_re_read_and_a_half_written_rotation_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let old = ca.client(Some("spiffe://example.org/node/n1"));
    let (cert, key) = old.write(dir.path(), "agent");
    let reloader = waypost_registrar_client::tls::CertReloader::new(&cert, &key).unwrap();
    assert_eq!(reloader.current().cert[0].to_vec(), der_of(&old.cert));

    // The new certificate is written, its key not yet: keep the old pair.
    let new = ca.client(Some("spiffe://example.org/node/n1"));
    std::fs::write(&cert, &new.cert).unwrap();
    assert_eq!(reloader.current().cert[0].to_vec(), der_of(&old.cert));
    // Then the key: the new pair is used.
    std::fs::write(&key, &new.key).unwrap();
    assert_eq!(reloader.current().cert[0].to_vec(), der_of(&new.cert));
    let id = waypost_registrar_client::tls::spiffe_id(&reloader.current().cert[0]).unwrap();
    assert_eq!(id.as_deref(), Some("spiffe://example.org/node/n1"));
}
