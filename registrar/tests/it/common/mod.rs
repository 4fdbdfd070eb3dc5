//! The registrar binary for tests: `registrar serve` children on free
//! loopback ports (killed on drop), their address lines and metrics, and
//! the agent client tuned for tests. The HTTP client, the test PKI and the
//! in-process stack they name are the server library's test helpers
//! (`registrar-server/tests/it/common/`), shared by path.

#![allow(dead_code, clippy::unwrap_used)]

use std::time::Duration;

pub mod cli;
pub mod faketime;
#[cfg(feature = "http-api")]
#[path = "../../../../registrar-server/tests/it/common/http.rs"]
pub mod http;
#[path = "../../../../registrar-server/tests/it/common/pki.rs"]
pub mod pki;
#[cfg(any(feature = "http-api", feature = "dns", feature = "xds"))]
#[path = "../../../../registrar-server/tests/it/common/protocols.rs"]
pub mod protocols;
#[cfg(feature = "xds")]
pub mod xds;

use waypost_registrar_client::{ClientConfig, RegistrarClient};

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

pub fn fast_client(url: &str, cluster: &str, node: &str) -> RegistrarClient {
    let cfg = ClientConfig::new(url, cluster, node)
        .with_reconnect(Duration::from_millis(10), Duration::from_millis(200))
        .with_retry_interval(Duration::from_millis(50));
    RegistrarClient::connect(cfg).unwrap()
}

use std::process::Stdio;

/// `serve` flags putting the HTTP API and DNS on free loopback ports
/// (their default ports would collide between tests running at once).
pub const PROTOCOL_ARGS: &[&str] = &[
    #[cfg(feature = "http-api")]
    "--http-api-addr=127.0.0.1:0",
    #[cfg(feature = "dns")]
    "--dns-addr=127.0.0.1:0",
];

/// `args` with [`PROTOCOL_ARGS`] (and [`memory_unless_chosen`]) added
/// when they run `serve`.
pub fn serve_args<'a>(args: &[&'a str]) -> Vec<&'a str> {
    let mut out = args.to_vec();
    if args.contains(&"serve") && !args.contains(&"--help") {
        out.extend_from_slice(PROTOCOL_ARGS);
        out.extend(memory_unless_chosen(args));
    }
    out
}

/// `--registry-backend=memory` unless `args` choose a backend: `serve`'s
/// default is a SQLite file in the working directory, which tests running
/// at once would share.
pub fn memory_unless_chosen(args: &[&str]) -> Option<&'static str> {
    let chooses = |a: &&str| {
        [
            "--registry",
            "--sqlite-path",
            "--etcd-",
            "--dynamodb-",
            "--cloudmap-",
        ]
        .iter()
        .any(|flag| a.starts_with(flag))
    };
    (!args.iter().any(chooses)).then_some("--registry-backend=memory")
}

use std::collections::BTreeMap;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

/// A `registrar serve` child on free loopback ports, killed on drop.
pub struct Served {
    _child: Child,
    pub grpc: String,
    pub health: String,
    /// The `registrar listening …` line.
    pub line: String,
}

pub async fn serve_binary(extra: &[&str]) -> Served {
    serve_binary_with_env(extra, &[]).await
}

/// [`serve_binary`] with extra environment variables for the child.
pub async fn serve_binary_with_env(extra: &[&str], env: &[(&str, &str)]) -> Served {
    let mut cmd = serve_command(extra);
    cmd.args(PROTOCOL_ARGS)
        .args(memory_unless_chosen(extra))
        .envs(env.iter().copied());
    served(cmd).await
}

/// `registrar serve` in `dir` on free loopback ports with `extra`, every
/// other flag at its default (the backend, and which faces are served).
pub async fn serve_binary_in(dir: &std::path::Path, extra: &[&str]) -> Served {
    let mut cmd = serve_command(extra);
    cmd.current_dir(dir);
    served(cmd).await
}

/// `registrar serve` on free loopback gRPC and health ports, with `extra`.
fn serve_command(extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_registrar"));
    cmd.args([
        "serve",
        "--grpc-addr",
        "127.0.0.1:0",
        "--health-addr",
        "127.0.0.1:0",
    ])
    .args(extra);
    cmd
}

/// The value of `name` (`grpc=`, `xds=`, …) in a registrar's address
/// line; panics naming it when the line has none.
pub fn line_field(line: &str, name: &str) -> String {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(name))
        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
        .to_string()
}

impl Served {
    /// The value of `name` (`http-api=`, `xds=`, …) in its address line.
    pub fn field(&self, name: &str) -> String {
        line_field(&self.line, name)
    }
}

/// Start `cmd` and wait for its address line.
async fn served(mut cmd: Command) -> Served {
    let mut child = cmd
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the server did not print its addresses")
        .unwrap()
        .expect("the server exited before listening");
    // "registrar listening grpc=127.0.0.1:P health=127.0.0.1:Q"
    let field = |name: &str| line_field(&line, name);
    Served {
        grpc: field("grpc="),
        health: field("health="),
        line,
        _child: child,
    }
}

impl Served {
    pub fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// SIGTERM, then its exit status (bounded).
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self._child.id().expect("the server is running").to_string();
        let killed = Command::new("kill").args(["-TERM", &pid]).status().await;
        assert!(killed.unwrap().success(), "kill -TERM {pid} failed");
        tokio::time::timeout(Duration::from_secs(30), self._child.wait())
            .await
            .expect("the server did not exit within 30 s of SIGTERM")
            .unwrap()
    }
}

/// GET `path` from `addr` over HTTP/1.1.
pub async fn http_get(addr: &str, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = String::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_string(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let code = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = buf
        .split_once("\r\n\r\n")
        .map(|x| x.1)
        .unwrap_or("")
        .to_string();
    (code, body)
}

/// A parsed Prometheus text page: `# TYPE` per family, value per series.
pub struct Scrape {
    pub types: BTreeMap<String, String>,
    pub values: BTreeMap<String, f64>,
}

pub fn parse(text: &str) -> Scrape {
    let mut types = BTreeMap::new();
    let mut values = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            types.insert(
                it.next().unwrap().to_string(),
                it.next().unwrap().to_string(),
            );
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let (series, value) = line.rsplit_once(' ').unwrap();
            values.insert(series.to_string(), value.parse::<f64>().unwrap());
        }
    }
    Scrape { types, values }
}

impl Scrape {
    pub fn get(&self, series: &str) -> f64 {
        *self
            .values
            .get(series)
            .unwrap_or_else(|| panic!("no series {series}"))
    }
}

impl Scrape {
    /// The value of `series`, if present.
    pub fn value(&self, series: &str) -> Option<f64> {
        self.values.get(series).copied()
    }

    /// The value of the one series of `name` whose labels include
    /// `labels` (whatever their order and the other labels), if present.
    pub fn find(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let prefix = format!("{name}{{");
        let mut found = self.values.iter().filter(|(series, _)| {
            series.strip_prefix(&prefix).is_some_and(|rest| {
                labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
            })
        });
        let (_, value) = found.next()?;
        assert!(
            found.next().is_none(),
            "more than one {name} with {labels:?}"
        );
        Some(*value)
    }
}

/// A `registrar serve` child whose exit status and stderr the test reads.
pub struct Spawned {
    pub child: Child,
    pub grpc: String,
    pub health: String,
    /// The `registrar listening …` line.
    pub line: String,
    stderr: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

/// Start `registrar serve` with `extra` flags on free loopback ports and
/// wait for its address line.
pub async fn spawn_serve(extra: &[&str]) -> Spawned {
    spawn_serve_env(extra, &[]).await
}

/// [`spawn_serve`] with extra environment variables for the child.
pub async fn spawn_serve_env(extra: &[&str], env: &[(&str, &str)]) -> Spawned {
    let dir = tempfile::tempdir().unwrap();
    let stderr = dir.path().join("stderr.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_registrar"))
        .args([
            "serve",
            "--grpc-addr",
            "127.0.0.1:0",
            "--health-addr",
            "127.0.0.1:0",
        ])
        .args(PROTOCOL_ARGS)
        .args(memory_unless_chosen(extra))
        .args(extra)
        .env("RUST_LOG", "info")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the server did not print its addresses")
        .unwrap()
        .unwrap_or_else(|| {
            panic!(
                "the server exited before listening: {}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            )
        });
    let field = |name: &str| line_field(&line, name);
    Spawned {
        grpc: field("grpc="),
        health: field("health="),
        line,
        child,
        stderr,
        _dir: dir,
    }
}

impl Spawned {
    pub fn url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// The value of `name` (`http-api=`, `xds=`, …) in its address line.
    pub fn field(&self, name: &str) -> String {
        line_field(&self.line, name)
    }

    /// What the child wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Send `signal` (`TERM`, `KILL`) to the child.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("the child already exited");
        let ok = std::process::Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{signal} {pid} failed");
    }

    /// Wait (bounded by `limit`) for the child to exit; its exit code.
    pub async fn exit_code(&mut self, limit: Duration) -> Option<i32> {
        let status = tokio::time::timeout(limit, self.child.wait())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the registrar did not exit within {limit:?}: {}",
                    self.stderr()
                )
            })
            .unwrap();
        status.code()
    }

    /// `/readyz`: the status code and body.
    pub async fn readyz(&self) -> (u16, String) {
        http_get(&self.health, "/readyz").await
    }
}
