//! The xDS listener served in process: refused off loopback without TLS
//! unless insecure, and with TLS the gRPC port's equal (mTLS, the same
//! authorization). The xDS tests with real clients run the binary
//! (`registrar/tests/it/xds.rs`).

use crate::common;

use common::xds::CDS;
use waypost::testing::eventually;

/// Without TLS, a non-loopback xDS address is refused unless insecure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_xds_listener_is_refused_without_insecure() {
    let mut server =
        waypost_registrar_server::Opening::new(waypost_registrar_server::RegistrarConfig::new("t"));
    server.protocols.xds = Some(tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap());
    let err = common::protocols::refusal(server).await;
    assert!(err.to_string().contains("xds_addr"), "{err}");
    assert!(err.to_string().contains("--insecure"), "{err}");
}

/// With TLS the xDS listener is the gRPC port's equal: mTLS with the same
/// certificates and the same authorization. A reader of the trust domain
/// gets resources; no client certificate is `UNAUTHENTICATED`, an ID of
/// another trust domain `PERMISSION_DENIED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_over_mtls_is_authorized_as_the_grpc_api() {
    use common::pki::Pki;
    use common::xds::{first_cds, tls_channel};
    use waypost_registrar_server::{AuthzConfig, Opening, RegistrarConfig, ServeOptions, TlsFiles};

    let pki = Pki::new();
    let mut server = Opening::new(RegistrarConfig::new("default"));
    server.options = ServeOptions::default()
        .with_tls(pki.server_files.clone())
        .with_authz(AuthzConfig::new("example.org"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let xds = listener.local_addr().unwrap().to_string();
    server.protocols.xds = Some(listener);
    let (_, running) = common::protocols::serve(server).await;

    let reader = pki.agent(&pki.ca, "reader", Some("spiffe://example.org/ci/job"));
    let resp = eventually("a CDS response over mTLS", || async {
        first_cds(tls_channel(&xds, &reader)).await.ok()
    })
    .await;
    assert_eq!(resp.type_url, CDS);
    assert!(resp.resources.is_empty());

    let none = first_cds(tls_channel(&xds, &TlsFiles::ca_only(pki.ca_path())))
        .await
        .unwrap_err();
    assert_eq!(none.code(), tonic::Code::Unauthenticated, "{none:?}");
    let foreign = pki.agent(&pki.ca, "foreign", Some("spiffe://evil.org/node/n1"));
    let denied = first_cds(tls_channel(&xds, &foreign)).await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");

    running.stop().await.unwrap();
}
