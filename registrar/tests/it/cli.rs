//! The `registrar` binary as a child process on loopback: the operator
//! CLI end to end (register, ls, watch --json, deregister), usage errors,
//! unreachable addresses, mTLS flags, and `/metrics` scraped and parsed.

use crate::common;

use std::process::Stdio;

use common::cli::{cli, next_line, BIN, LIMIT};
use common::pki::{write_bundle, Ca};
use common::{http_get, serve_binary, serve_binary_in};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use waypost::testing::eventually;
use waypost_registrar_client::ClientConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_register_ls_watch_deregister() {
    let server = serve_binary(&[]).await;
    let url = server.url();

    // A watcher first: it prints the (empty) snapshot, then the changes.
    let mut watch = Command::new(BIN)
        .args(["--address", &url, "watch", "--json", "--count", "4"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let first: serde_json::Value = serde_json::from_str(&next_line(&mut lines).await).unwrap();
    assert_eq!(first["type"], "snapshot");
    assert_eq!(first["endpoints"].as_array().unwrap().len(), 0);

    let out = cli(&[
        "--address",
        &url,
        "register",
        "payments",
        "pod-1",
        "10.0.0.5:8080",
        "--protocol",
        "grpc",
        "--cluster",
        "cluster-a",
        "--node",
        "node-1",
        "--label",
        "zone=z1",
    ])
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.contains("payments/pod-1"), "{}", out.stdout);
    let out = cli(&[
        "--address",
        &url,
        "register",
        "billing",
        "b-1",
        "10.0.0.6:9090",
    ])
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);

    let added: serde_json::Value = serde_json::from_str(&next_line(&mut lines).await).unwrap();
    assert_eq!(added["type"], "added");
    assert_eq!(added["endpoint"]["service"], "payments");
    assert_eq!(added["endpoint"]["id"], "pod-1");
    assert_eq!(added["endpoint"]["port"], 8080);
    assert_eq!(added["endpoint"]["protocol"], "grpc");
    assert_eq!(added["endpoint"]["labels"]["zone"], "z1");

    // The table, filtered.
    let out = cli(&["--address", &url, "ls"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let rows: Vec<&str> = out.stdout.lines().collect();
    assert!(rows[0].starts_with("SERVICE"), "{}", out.stdout);
    assert_eq!(rows.len(), 3, "{}", out.stdout);
    let out = cli(&[
        "--address",
        &url,
        "ls",
        "--service",
        "payments",
        "-o",
        "wide",
    ])
    .await;
    let rows: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(rows.len(), 2, "{}", out.stdout);
    for cell in [
        "payments",
        "pod-1",
        "10.0.0.5:8080",
        "grpc",
        "cluster-a",
        "node-1",
        "healthy",
        "zone=z1",
    ] {
        assert!(rows[1].contains(cell), "{cell} missing in {:?}", rows[1]);
    }
    let out = cli(&["--address", &url, "ls", "--cluster", "default", "--json"]).await;
    let eps: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(eps.len(), 1, "{}", out.stdout);
    assert_eq!(eps[0]["service"], "billing");

    let out = cli(&["--address", &url, "deregister", "payments", "pod-1"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    // billing's add came second; then the removal.
    let second: serde_json::Value = serde_json::from_str(&next_line(&mut lines).await).unwrap();
    assert_eq!(second["endpoint"]["service"], "billing");
    let removed: serde_json::Value = serde_json::from_str(&next_line(&mut lines).await).unwrap();
    assert_eq!(removed["type"], "removed");
    assert_eq!(removed["service"], "payments");
    assert_eq!(removed["id"], "pod-1");
    // --count 4 (the snapshot and three changes) reached: the watcher exits 0.
    let status = tokio::time::timeout(LIMIT, watch.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success());

    let out = cli(&["--address", &url, "ls", "--service", "payments"]).await;
    assert_eq!(out.stdout.lines().count(), 1, "{}", out.stdout);

    // A watch bounded by time ends by itself, printing text.
    let out = cli(&["--address", &url, "watch", "--timeout", "300ms"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.starts_with("snapshot v"), "{}", out.stdout);
    assert!(
        out.stdout.contains("billing/b-1 10.0.0.6:9090"),
        "{}",
        out.stdout
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_flags_exit_2_and_failures_name_the_address() {
    let out = cli(&["ls", "--no-such-flag"]).await;
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("Usage:"), "{}", out.stderr);
    let out = cli(&["register", "svc", "id", "no-port"]).await;
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("HOST:PORT"), "{}", out.stderr);
    let out = cli(&["register", "svc", "id", "10.0.0.5:70000"]).await;
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("<TARGET>"), "{}", out.stderr);
    assert!(out.stderr.contains("1 to 65535"), "{}", out.stderr);
    let out = cli(&["register", "svc"]).await;
    assert_eq!(out.code, 2, "{}", out.stderr);

    let port = waypost_fixtures::free_port().unwrap();
    let addr = format!("http://127.0.0.1:{port}");
    for args in [
        vec!["--address", addr.as_str(), "ls"],
        vec!["--address", addr.as_str(), "watch", "--count", "1"],
        vec![
            "--address",
            addr.as_str(),
            "register",
            "s",
            "i",
            "10.0.0.1:80",
        ],
        vec!["--address", addr.as_str(), "deregister", "s", "i"],
    ] {
        let out = cli(&args).await;
        assert_eq!(out.code, 1, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains(&addr), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("refused"), "{args:?}: {}", out.stderr);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsafe_serving_is_refused_naming_the_flag_that_allows_it() {
    // Plaintext on every interface: refused before the backend is opened.
    let out = cli(&[
        "serve",
        "--grpc-addr",
        "0.0.0.0:0",
        "--health-addr",
        "127.0.0.1:0",
    ])
    .await;
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains("--insecure"), "{}", out.stderr);
    // A policy needs a trust domain; a policy file that does not parse
    // is named.
    let out = cli(&["serve", "--authz-policy", "p.toml"]).await;
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(out.stderr.contains("--trust-domain"), "{}", out.stderr);
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("authz.toml");
    std::fs::write(&policy, "[[rule]]\nname = \"a\"\nids = \"oops\"\n").unwrap();
    let pki = common::pki::Pki::new();
    let f = &pki.server_files;
    let p = |x: &std::path::Path| x.to_str().unwrap().to_string();
    let (ca, cert, key, pol) = (
        p(&f.ca),
        p(f.identity.as_ref().unwrap().0.as_path()),
        p(f.identity.as_ref().unwrap().1.as_path()),
        p(&policy),
    );
    let tls = ["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key];
    let out = cli(&[
        &["serve"][..],
        &tls,
        &["--trust-domain", "example.org", "--authz-policy", &pol],
    ]
    .concat())
    .await;
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains("authz.toml"), "{}", out.stderr);
    // mTLS without authorization.
    let out = cli(&[&["serve"][..], &tls].concat()).await;
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.contains("--allow-any-certificate"),
        "{}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_over_mtls_with_an_admin_and_an_agent_identity() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("test CA");
    let bundle = write_bundle(d, "ca.pem", &[&ca]);
    let (scert, skey) = ca.server().write(d, "server");
    let (acert, akey) = ca
        .client(Some("spiffe://example.org/ops/cli"))
        .write(d, "admin");
    let (ncert, nkey) = ca
        .client(Some("spiffe://example.org/node/n1"))
        .write(d, "n1");
    let p = |x: &std::path::Path| x.to_str().unwrap().to_string();
    let (bundle, scert, skey, acert, akey, ncert, nkey) = (
        p(&bundle),
        p(&scert),
        p(&skey),
        p(&acert),
        p(&akey),
        p(&ncert),
        p(&nkey),
    );
    let server = serve_binary(&[
        "--tls-ca",
        &bundle,
        "--tls-cert",
        &scert,
        "--tls-key",
        &skey,
        "--trust-domain",
        "example.org",
        "--admin-id",
        "spiffe://example.org/ops/cli",
    ])
    .await;
    // No scheme: https:// because TLS flags are given.
    let url = server.grpc.clone();
    let admin = [
        "--address",
        &url,
        "--tls-ca",
        &bundle,
        "--tls-cert",
        &acert,
        "--tls-key",
        &akey,
    ];
    let node1 = [
        "--address",
        &url,
        "--tls-ca",
        &bundle,
        "--tls-cert",
        &ncert,
        "--tls-key",
        &nkey,
    ];

    let out = cli(&[
        &admin[..],
        &["register", "api", "a", "10.0.0.1:80", "--node", "n2"],
    ]
    .concat())
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = cli(&[
        &node1[..],
        &["register", "api", "b", "10.0.0.2:80", "--node", "n1"],
    ]
    .concat())
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = cli(&[&node1[..], &["deregister", "api", "a"]].concat()).await;
    assert_eq!(out.code, 1);
    assert!(
        out.stderr
            .contains("rule \"node\": node \"n2\" is not allowed"),
        "{}",
        out.stderr
    );
    let out = cli(&[&node1[..], &["ls"]].concat()).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(out.stdout.lines().count(), 3, "{}", out.stdout);
    // Without a client certificate; and in plaintext.
    let out = cli(&["--address", &url, "--tls-ca", &bundle, "ls"]).await;
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("no client certificate"),
        "{}",
        out.stderr
    );
    let out = cli(&["--address", &server.url(), "ls"]).await;
    assert_eq!(out.code, 1, "{}", out.stdout);
}

/// Every duration, size and count flag is checked when parsed: zero,
/// negative or absurd values exit 2 naming the flag and the range, before
/// anything starts (no listener is bound, no backend opened).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_values_exit_2_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["serve", "--sync-interval", "0s"], "--sync-interval"),
        (&["serve", "--sync-interval=-1s"], "--sync-interval"),
        (
            &["serve", "--write-batch-interval", "0s"],
            "--write-batch-interval",
        ),
        (
            &["serve", "--write-batch-interval=-5ms"],
            "--write-batch-interval",
        ),
        (
            &["serve", "--write-batch-interval", "2h"],
            "--write-batch-interval",
        ),
        (&["serve", "--probe-interval", "0s"], "--probe-interval"),
        (&["serve", "--drain-timeout=-1s"], "--drain-timeout"),
        (
            &["serve", "--http2-keepalive-interval", "0s"],
            "--http2-keepalive-interval",
        ),
        (
            &["serve", "--http2-keepalive-timeout", "2h"],
            "--http2-keepalive-timeout",
        ),
        (&["serve", "--tcp-keepalive", "500ms"], "--tcp-keepalive"),
        (
            &["serve", "--write-queue-capacity", "0"],
            "--write-queue-capacity",
        ),
        (
            &["serve", "--write-queue-capacity=-3"],
            "--write-queue-capacity",
        ),
        (&["serve", "--write-batch-ops", "0"], "--write-batch-ops"),
        (&["serve", "--ack", "eventually"], "--ack"),
        (&["watch", "--timeout", "0s"], "--timeout"),
        (&["watch", "--count", "0"], "--count"),
        (&["register", "s", "i", "h:1", "--ack", "sure"], "--ack"),
    ];
    for (args, flag) in cases {
        let out = cli(args).await;
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains(flag),
            "{args:?}: the message does not name {flag}: {}",
            out.stderr
        );
        assert!(
            !out.stdout.contains("registrar listening"),
            "{args:?} started serving"
        );
    }
    let out = cli(&["serve", "--sync-interval", "0s"]).await;
    assert!(out.stderr.contains("allowed 10ms to 1h"), "{}", out.stderr);
}

/// The endpoints `ls --json` lists at `url`, as JSON objects.
async fn listed(url: &str) -> Vec<serde_json::Value> {
    let out = cli(&["--address", url, "ls", "--json"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    out.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// With no flag choosing a backend, `serve` runs on SQLite (`registry.db`
/// in its working directory) and serves gRPC and health only: restarted
/// the same way, it still holds what it acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_its_defaults_keeps_what_it_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let server = serve_binary_in(dir.path(), &[]).await;
    for face in ["http-api=", "dns=", "xds="] {
        assert!(!server.line.contains(face), "{face} in {}", server.line);
    }
    let url = server.url();
    for id in ["pod-1", "pod-2"] {
        let out = cli(&[
            "--address",
            &url,
            "register",
            "payments",
            id,
            "10.0.0.5:8080",
        ])
        .await;
        assert_eq!(out.code, 0, "{}", out.stderr);
    }
    assert_eq!(server.terminate().await.code(), Some(0));
    assert!(dir.path().join("registry.db").is_file());

    let server = serve_binary_in(dir.path(), &[]).await;
    let url = server.url();
    eventually("both endpoints after the restart", || async {
        let ids: Vec<String> = listed(&url)
            .await
            .iter()
            .map(|e| e["id"].as_str().unwrap_or_default().to_string())
            .collect();
        (ids == ["pod-1", "pod-2"]).then_some(())
    })
    .await;
}

/// A backend's own flag selects it; beside another backend's flag, or
/// another `--registry-backend`, it is refused naming both flags (it
/// would otherwise be ignored); `memory` says it keeps nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_flag_selects_its_backend_or_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("elsewhere.db");
    let server = serve_binary_in(dir.path(), &["--sqlite-path", db.to_str().unwrap()]).await;
    let out = cli(&[
        "--address",
        &server.url(),
        "register",
        "web",
        "a",
        "10.0.0.1:80",
    ])
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(server.terminate().await.code(), Some(0));
    assert!(db.is_file());
    assert!(!dir.path().join("registry.db").exists());

    let refused: [(&[&str], [&str; 2]); 3] = [
        (
            &[
                "serve",
                "--registry-backend=memory",
                "--sqlite-path",
                "x.db",
            ],
            ["--sqlite-path", "--registry-backend=memory"],
        ),
        (
            &[
                "serve",
                "--sqlite-path",
                "x.db",
                "--etcd-endpoints",
                "http://127.0.0.1:1",
            ],
            ["--sqlite-path", "--etcd-endpoints"],
        ),
        (
            &[
                "serve",
                "--registry-backend=sqlite",
                "--dynamodb-table",
                "t",
            ],
            ["--dynamodb-table", "--registry-backend=sqlite"],
        ),
    ];
    for (args, flags) in refused {
        let out = cli(args).await;
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        for flag in flags {
            assert!(
                out.stderr.contains(flag),
                "{flag} not named: {}",
                out.stderr
            );
        }
    }

    let mut memory = common::spawn_serve(&["--registry-backend=memory"]).await;
    memory.signal("TERM");
    assert_eq!(memory.exit_code(LIMIT).await, Some(0));
    assert!(
        memory
            .stderr()
            .contains("every write is lost when the registrar exits"),
        "{}",
        memory.stderr()
    );
}

/// With their defaults, two registrars start side by side on one host,
/// and one starts while Consul's agent ports (8500 HTTP, 8600 DNS) are
/// taken: the faces beyond gRPC and health are off unless asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_registrars_start_side_by_side_and_beside_consuls_ports() {
    // Held by this test when free; otherwise someone else holds them.
    let _consul_http = std::net::TcpListener::bind("127.0.0.1:8500");
    let _consul_dns_udp = std::net::UdpSocket::bind("127.0.0.1:8600");
    let _consul_dns_tcp = std::net::TcpListener::bind("127.0.0.1:8600");
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let one = serve_binary_in(a.path(), &[]).await;
    let two = serve_binary_in(b.path(), &[]).await;
    for server in [&one, &two] {
        eventually("ready", || async {
            (http_get(&server.health, "/readyz").await.0 == 200).then_some(())
        })
        .await;
    }
    assert_eq!(one.terminate().await.code(), Some(0));
    assert_eq!(two.terminate().await.code(), Some(0));
}

/// The default mTLS policy lets a node register its own endpoints with
/// default values: an endpoint written without a cluster, over plain gRPC
/// or with the CLI (no `--cluster`), belongs to the registrar's cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_without_a_cluster_is_the_registrars_under_the_default_policy() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ca = Ca::new("test CA");
    let p = |x: &std::path::Path| x.to_str().unwrap().to_string();
    let bundle = p(&write_bundle(d, "ca.pem", &[&ca]));
    let (scert, skey) = ca.server().write(d, "server");
    let (scert, skey) = (p(&scert), p(&skey));
    let (ncert, nkey) = ca
        .client(Some("spiffe://example.org/node/n1"))
        .write(d, "n1");
    let server = serve_binary(&[
        "--tls-ca",
        &bundle,
        "--tls-cert",
        &scert,
        "--tls-key",
        &skey,
        "--trust-domain",
        "example.org",
        "--cluster-name",
        "east",
    ])
    .await;
    let url = format!("https://{}", server.grpc);
    let (ncert_s, nkey_s) = (p(&ncert), p(&nkey));
    let node1 = [
        "--address",
        &url,
        "--tls-ca",
        &bundle,
        "--tls-cert",
        &ncert_s,
        "--tls-key",
        &nkey_s,
    ];
    let register = ["register", "api", "by-cli", "10.0.0.2:80", "--node", "n1"];
    let out = cli(&[&node1[..], &register].concat()).await;
    assert_eq!(out.code, 0, "{}", out.stderr);

    let files = waypost_registrar_client::TlsFiles::new(&bundle, &ncert, &nkey);
    let cfg = ClientConfig::new(&url, "east", "n1").with_tls(files);
    let rpc = waypost_registrar_client::RpcClient::connect(cfg).unwrap();
    let plain = waypost::Endpoint::new("api", "by-grpc", "10.0.0.3", 80)
        .with_cluster("")
        .with_node("n1");
    rpc.send(
        &waypost::Op::Register(plain),
        waypost_registrar_client::Ack::Durable,
    )
    .await
    .unwrap();

    let out = cli(&[&node1[..], &["ls", "--json"]].concat()).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let clusters: Vec<(String, String)> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|e| (e["id"].to_string(), e["cluster"].to_string()))
        .collect();
    assert_eq!(
        clusters,
        [
            ("\"by-cli\"".to_string(), "\"east\"".to_string()),
            ("\"by-grpc\"".to_string(), "\"east\"".to_string())
        ]
    );
}
