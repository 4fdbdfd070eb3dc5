//! The traps an operator fell into, each run against the real
//! `registrar` binary on loopback: addresses without a scheme, bad values
//! exiting 2, one-line backend errors with product names, `watch --json`
//! resume tokens, the endpoint on `ENDPOINT_REMOVED`, `heartbeat` and
//! `register --keep-alive`, `ls -o`, JSON logs and `serve --help`.

use crate::common;

use std::process::Stdio;

use common::cli::{cli, cli_env, next_line, BIN, LIMIT};
use common::{serve_binary, spawn_serve_env};
use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use waypost::testing::eventually;
use waypost_registrar_client::proto::registrar::v1::endpoint_event::EventType;
use waypost_registrar_client::proto::registrar::v1::WatchEndpointsRequest;
use waypost_registrar_client::{ClientConfig, RpcClient};

/// The last line of `stderr`: the CLI's own message, after any log lines.
fn last_line(stderr: &str) -> &str {
    stderr.lines().last().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn addresses_without_a_scheme_are_taken_as_http() {
    let server = serve_binary(&[]).await;
    let out = cli(&["--address", &server.grpc, "ls"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.starts_with("SERVICE"), "{}", out.stdout);
    // Unreachable, without a scheme: the message names the address as
    // used, not "invalid URI".
    let port = waypost_fixtures::free_port().unwrap();
    let addr = format!("127.0.0.1:{port}");
    let out = cli(&["--address", &addr, "ls"]).await;
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(!out.stderr.contains("invalid URI"), "{}", out.stderr);
    assert!(
        out.stderr.contains(&format!("http://{addr}")),
        "{}",
        out.stderr
    );
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
}

/// Every bad value exits 2, naming the flag or argument and what is
/// allowed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_values_exit_2_naming_the_flag() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["register", "s", "i", "10.0.0.5:70000"],
            &["<TARGET>", "1 to 65535"],
        ),
        (&["register", "s", "i", "10.0.0.5:0"], &["1 to 65535"]),
        (&["register", "s", "i", "h:1", "--keep-alive"], &["--node"]),
        (
            &[
                "register",
                "s",
                "i",
                "h:1",
                "--node",
                "n",
                "--keep-alive",
                "--heartbeat-every",
                "1ms",
            ],
            &["--heartbeat-every", "100ms to 1h"],
        ),
        (&["watch", "--from", "7"], &["--from", "<epoch>.<sequence>"]),
        (&["ls", "-o", "csv"], &["--output", "wide"]),
        (&["--log-format", "xml", "ls"], &["--log-format", "json"]),
        (
            &["register", "s", "i", "h:1", "--protocol", "sctp"],
            &["--protocol"],
        ),
    ];
    for (args, needles) in cases {
        let out = cli(args).await;
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        for n in *needles {
            assert!(
                out.stderr.contains(n),
                "{args:?}: no {n:?} in {}",
                out.stderr
            );
        }
    }
}

/// A backend that cannot be opened: one line naming the product (spelled
/// right) and the cause; the chain of causes with `-v`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_errors_are_one_line_with_the_product_name() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("no-such-dir").join("registry.db");
    let db = db.to_str().unwrap();
    let args = [
        "serve",
        "--registry-backend=sqlite",
        "--sqlite-path",
        db,
        "--fail-fast",
        "--grpc-addr",
        "127.0.0.1:0",
        "--health-addr",
        "127.0.0.1:0",
    ];
    let quiet = [("RUST_LOG", "off")];
    let out = cli_env(&args, &quiet).await;
    assert_eq!(out.code, 1, "{}", out.stderr);
    let line = last_line(&out.stderr);
    assert!(line.starts_with("registrar: SQLite backend: "), "{line}");
    assert!(line.contains("registry.db"), "{line}");
    assert!(line.len() < 400, "{} bytes: {line}", line.len());
    assert_eq!(out.stderr.lines().count(), 1, "{}", out.stderr);
    for wrong in ["Sqlite", "Dynamodb", "Etcd"] {
        assert!(!out.stderr.contains(wrong), "{}", out.stderr);
    }
}

/// Missing AWS credentials: one line naming DynamoDB and what to set,
/// not the SDK's error structures; `-v` lists the causes. Needs the
/// binary's `dynamodb` feature (`scripts/test` builds with all of them).
#[cfg(feature = "dynamodb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_aws_credentials_are_one_line() {
    let port = waypost_fixtures::free_port().unwrap();
    let endpoint = format!("http://127.0.0.1:{port}");
    let run = |verbose: bool| {
        let mut cmd = Command::new(BIN);
        if verbose {
            cmd.arg("-v");
        }
        cmd.args([
            "serve",
            "--registry-backend=dynamodb",
            "--aws-region=us-east-1",
            "--aws-endpoint-url",
            &endpoint,
            "--fail-fast",
            "--grpc-addr",
            "127.0.0.1:0",
            "--health-addr",
            "127.0.0.1:0",
        ]);
        cmd.args(common::PROTOCOL_ARGS);
        for var in [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AWS_PROFILE",
            "AWS_WEB_IDENTITY_TOKEN_FILE",
            "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
            "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        ] {
            cmd.env_remove(var);
        }
        cmd.env("AWS_CONFIG_FILE", "/nonexistent/aws-config")
            .env(
                "AWS_SHARED_CREDENTIALS_FILE",
                "/nonexistent/aws-credentials",
            )
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("RUST_LOG", "off")
            .stdout(Stdio::null())
            .kill_on_drop(true);
        async move {
            let out = tokio::time::timeout(LIMIT, cmd.output())
                .await
                .expect("the registrar did not exit")
                .unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        }
    };
    let (code, stderr) = run(false).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("registrar: DynamoDB backend: "),
        "{stderr}"
    );
    assert!(stderr.contains("no usable AWS credentials"), "{stderr}");
    assert!(stderr.contains("AWS_PROFILE"), "{stderr}");
    assert!(stderr.len() < 600, "{} bytes: {stderr}", stderr.len());
    assert!(!stderr.contains("Dynamodb"), "{stderr}");
    let (code, stderr) = run(true).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.lines().count() > 1, "{stderr}");
    assert!(stderr.contains("\n  caused by: "), "{stderr}");
}

/// `watch --json` prints the full resume token, and `--from` resumes
/// from it: only the changes since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_json_prints_a_token_that_resumes() {
    let server = serve_binary(&[]).await;
    let url = server.grpc.clone();
    let out = cli(&["--address", &url, "watch", "--json", "--count", "1"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let snap: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let token = snap["version"].as_str().unwrap().to_string();
    let parsed: waypost_registrar_client::Token = token.parse().unwrap();
    assert_ne!(parsed.epoch, 0, "{token}");

    let out = cli(&["--address", &url, "register", "api", "a", "10.0.0.1:80"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = cli(&[
        "--address",
        &url,
        "watch",
        "--json",
        "--count",
        "1",
        "--from",
        &token,
    ])
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let ev: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(ev["type"], "added", "{ev}");
    assert_eq!(ev["endpoint"]["id"], "a");
    let next: waypost_registrar_client::Token = ev["version"].as_str().unwrap().parse().unwrap();
    assert_eq!(next.epoch, parsed.epoch);
    assert!(next.version > parsed.version);
    // A token of another run (epoch): a fresh snapshot instead.
    let other = format!("{}.1", parsed.epoch + 1);
    let out = cli(&[
        "--address",
        &url,
        "watch",
        "--json",
        "--count",
        "1",
        "--from",
        &other,
    ])
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let ev: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(ev["type"], "snapshot", "{ev}");
    assert_eq!(ev["endpoints"].as_array().unwrap().len(), 1);
}

/// `ENDPOINT_REMOVED` carries the endpoint that was removed (address,
/// port, node), not only its service and id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_removed_carries_the_last_endpoint() {
    let server = serve_binary(&[]).await;
    let url = server.url();
    let out = cli(&[
        "--address",
        &url,
        "register",
        "api",
        "a",
        "10.0.0.7:8443",
        "--node",
        "n7",
    ])
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let raw = RpcClient::connect(ClientConfig::new(url.clone(), "default", "n7")).unwrap();
    let mut stream = raw
        .grpc()
        .watch_endpoints(WatchEndpointsRequest {
            cluster_name: "default".into(),
            node_name: "n7".into(),
            last_version: String::new(),
            held: None,
            held_total: None,
        })
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(LIMIT, stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.r#type, EventType::FullSnapshot as i32);
    let out = cli(&["--address", &url, "deregister", "api", "a"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let removed = tokio::time::timeout(LIMIT, stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(removed.r#type, EventType::EndpointRemoved as i32);
    let ep = removed.endpoint.unwrap();
    assert_eq!((ep.service_name.as_str(), ep.id.as_str()), ("api", "a"));
    assert_eq!((ep.address.as_str(), ep.port), ("10.0.0.7", 8443));
    assert_eq!(ep.node, "n7");
}

/// `heartbeat` of an unknown node fails (exit 1, naming it); of a node
/// with an endpoint, succeeds. `register --keep-alive` stays up and
/// deregisters on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_and_register_keep_alive() {
    let server = serve_binary(&[]).await;
    let url = server.grpc.clone();
    // A one-off registration with a node says that the node must
    // heartbeat, naming the two ways.
    let out = cli(&[
        "--address",
        &url,
        "register",
        "api",
        "once",
        "10.0.0.8:81",
        "--node",
        "n8",
    ])
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr.contains("registrar heartbeat n8"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("--keep-alive"), "{}", out.stderr);
    let out = cli(&["--address", &url, "deregister", "api", "once"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = cli(&["--address", &url, "heartbeat", "ghost"]).await;
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains("ghost"), "{}", out.stderr);
    assert!(out.stderr.contains("not found"), "{}", out.stderr);

    let mut child = Command::new(BIN)
        .args([
            "--address",
            &url,
            "register",
            "api",
            "kept",
            "10.0.0.8:80",
            "--node",
            "n8",
            "--keep-alive",
            "--heartbeat-every",
            "100ms",
        ])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = next_line(&mut lines).await;
    assert!(line.starts_with("registered api/kept"), "{line}");
    let out = cli(&["--address", &url, "heartbeat", "n8"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = cli(&["--address", &url, "ls", "--node", "n8"]).await;
    assert!(out.stdout.contains("api"), "{}", out.stdout);

    let pid = child.id().unwrap().to_string();
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = tokio::time::timeout(LIMIT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert_eq!(next_line(&mut lines).await, "deregistered api/kept");
    let out = cli(&["--address", &url, "ls", "--node", "n8"]).await;
    assert_eq!(out.stdout.lines().count(), 1, "{}", out.stdout);
}

/// `ls -o`: the default table, `wide` with cluster and labels, and one
/// JSON or YAML document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_output_formats() {
    let server = serve_binary(&[]).await;
    let url = server.grpc.clone();
    let out = cli(&[
        "--address",
        &url,
        "register",
        "api",
        "a",
        "10.0.0.1:80",
        "--label",
        "zone=z1",
    ])
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = cli(&["--address", &url, "ls"]).await;
    let header = out.stdout.lines().next().unwrap();
    assert!(
        header.contains("HEALTH") && !header.contains("LABELS"),
        "{header}"
    );
    let out = cli(&["--address", &url, "ls", "-o", "wide"]).await;
    let rows: Vec<&str> = out.stdout.lines().collect();
    assert!(
        rows[0].contains("CLUSTER") && rows[0].contains("LABELS"),
        "{}",
        out.stdout
    );
    assert!(rows[1].contains("zone=z1"), "{}", out.stdout);
    let out = cli(&["--address", &url, "ls", "-o", "json"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let doc: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(doc["kind"], "EndpointList");
    assert_eq!(doc["items"][0]["labels"]["zone"], "z1");
    let out = cli(&["--address", &url, "ls", "--output", "yaml"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(out.stdout.starts_with("items:\n  - "), "{}", out.stdout);
    assert!(
        out.stdout.contains("\n      zone: \"z1\"\n"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("\nkind: \"EndpointList\"\n"),
        "{}",
        out.stdout
    );
}

/// `--log-format json`: one JSON object per line; a write's line carries
/// the request's node, service and key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_carry_the_write_fields() {
    let server = spawn_serve_env(
        &["--log-format", "json"],
        &[("RUST_LOG", "info,waypost_registrar_server=debug")],
    )
    .await;
    let out = cli(&[
        "--address",
        &server.grpc,
        "register",
        "payments",
        "pod-1",
        "10.0.0.5:8080",
        "--node",
        "node-1",
    ])
    .await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let line: serde_json::Value = eventually("the write's log line", || {
        let text = server.stderr();
        async move {
            text.lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|v| v["fields"]["message"] == "endpoint registered")
        }
    })
    .await;
    assert_eq!(line["level"], "DEBUG", "{line}");
    assert_eq!(line["span"]["node"], "node-1", "{line}");
    assert_eq!(line["span"]["service"], "payments", "{line}");
    assert_eq!(line["span"]["key"], "payments/pod-1", "{line}");
    // Every line is JSON, the start-up line included.
    let text = server.stderr();
    assert!(text.lines().count() >= 2, "{text}");
    for l in text.lines() {
        serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"));
    }
}

/// `serve --help` shows the server's options only, its TLS flags described
/// from the server's side; the client commands show `--address` and the
/// client's TLS flags. A client flag before `serve` is refused (exit 2);
/// before a client command it is still taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_help_has_only_server_options() {
    let out = cli(&["serve", "--help"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(!out.stdout.contains("--address"), "{}", out.stdout);
    assert!(out.stdout.contains("--grpc-addr"), "{}", out.stdout);
    assert!(
        out.stdout
            .contains("agents' and operators' client certificates"),
        "{}",
        out.stdout
    );
    assert!(
        !out.stdout.contains("signed the registrar's certificate"),
        "{}",
        out.stdout
    );
    for cmd in ["ls", "watch", "register", "deregister", "heartbeat"] {
        let out = cli(&[cmd, "--help"]).await;
        assert_eq!(out.code, 0, "{cmd}: {}", out.stderr);
        assert!(out.stdout.contains("--address"), "{cmd}: {}", out.stdout);
        assert!(
            out.stdout.contains("signed the registrar's certificate"),
            "{cmd}: {}",
            out.stdout
        );
        assert!(!out.stdout.contains("--grpc-addr"), "{cmd}: {}", out.stdout);
    }
    let out = cli(&["--address", "127.0.0.1:1", "serve"]).await;
    assert_eq!(out.code, 2, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("--address is an option of the client commands"),
        "{}",
        out.stderr
    );
    let server = serve_binary(&[]).await;
    let out = cli(&["--address", &server.grpc, "ls"]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
    let out = cli(&["ls", "--address", &server.grpc]).await;
    assert_eq!(out.code, 0, "{}", out.stderr);
}
