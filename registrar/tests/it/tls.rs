//! `registrar serve` with mTLS: started before its certificate files
//! exist, it waits for them (`/readyz` naming the missing ones) and then
//! serves mTLS. The in-process mTLS and authorization tests are
//! `waypost-registrar-server`'s (`registrar-server/tests/it/tls.rs`).

use crate::common;

use std::path::Path;

use common::pki::{write_bundle, Ca};
use tonic::Code;
use waypost::testing::{ep, eventually};
use waypost::Registry;
use waypost_registrar_client::proto::registrar::v1::RegisterEndpointRequest;
use waypost_registrar_client::{endpoint_to_proto, ClientConfig, RpcClient};
use waypost_registrar_server::TlsFiles;

const TD: &str = "example.org";

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

/// `registrar serve` started before its certificate files exist (as when a
/// sidecar writes the SVID after the registrar's container starts): it
/// does not exit; the health port answers, `/readyz` is 503 naming the
/// files not found yet, and once they are written it becomes ready and
/// serves mTLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_waits_for_certificate_files_written_after_it_starts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca_path = d.join("bundle.pem");
    let cert_path = d.join("svid.pem");
    let key_path = d.join("svid_key.pem");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let tls = [
        "--tls-ca",
        &s(&ca_path),
        "--tls-cert",
        &s(&cert_path),
        "--tls-key",
        &s(&key_path),
        "--trust-domain",
        TD,
    ]
    .map(String::from);
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();

    // With --fail-fast a missing file is an exit, naming it.
    let out = common::cli::cli(
        &[
            &["serve", "--fail-fast", "--grpc-addr=127.0.0.1:0"][..],
            &["--health-addr=127.0.0.1:0"],
            &tls,
        ]
        .concat(),
    )
    .await;
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains(&s(&ca_path)), "{}", out.stderr);

    let mut server = common::spawn_serve(&tls).await;

    assert_eq!(common::http_get(&server.health, "/healthz").await.0, 200);
    let (code, body) = server.readyz().await;
    assert_eq!(code, 503, "{body}");
    for path in [&ca_path, &cert_path, &key_path] {
        assert!(body.contains(&s(path)), "{path:?} not named: {body}");
    }

    // The bundle and the certificate, not the key yet: still waiting, for
    // the key alone.
    let ca = Ca::new("test CA");
    write_bundle(d, "bundle.pem", &[&ca]);
    let leaf = ca.server();
    std::fs::write(&cert_path, &leaf.cert).unwrap();
    eventually("/readyz naming the private key alone", || async {
        let (code, body) = server.readyz().await;
        (code == 503 && body.contains(&s(&key_path)) && !body.contains(&s(&cert_path)))
            .then_some(())
    })
    .await;
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "the registrar exited: {}",
        server.stderr()
    );

    std::fs::write(&key_path, &leaf.key).unwrap();
    eventually("/readyz 200 once the files are in place", || async {
        (server.readyz().await.0 == 200).then_some(())
    })
    .await;

    // mTLS: an agent writes its own node's endpoint, not another's.
    let (acert, akey) = ca
        .client(Some("spiffe://example.org/node/n1"))
        .write(d, "agent");
    let agent = RpcClient::connect(
        ClientConfig::new(format!("https://{}", server.grpc), "test", "n1")
            .with_tls(TlsFiles::new(&ca_path, acert, akey)),
    )
    .unwrap();
    assert_eq!(register_code(&agent, "n1", "a1").await, Code::Ok);
    assert_eq!(
        register_code(&agent, "n2", "a2").await,
        Code::PermissionDenied
    );
    assert_eq!(agent.snapshot().await.unwrap().len(), 1);
    server.signal("TERM");
    assert_eq!(
        server.exit_code(std::time::Duration::from_secs(30)).await,
        Some(0),
        "{}",
        server.stderr()
    );
}
