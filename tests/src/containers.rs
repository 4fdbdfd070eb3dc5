//! Fixture servers in containers, through testcontainers.
//!
//! A container is driven by a small thread of its own (a "keeper") that
//! owns a tokio runtime and the testcontainers handle. That way the same
//! container can be started from synchronous tests, from any tokio runtime
//! flavour, and removed on drop without needing a runtime at the drop site:
//! dropping a [`ServerContainer`] asks the keeper to remove the container
//! (`docker rm -f` through the engine API) and waits for it, which also
//! happens while a panicking test unwinds.
//!
//! The engine is the one testcontainers uses: `DOCKER_HOST` (`tcp://…`,
//! `http://…` or `unix://…`), else `/var/run/docker.sock`. TLS engines
//! (`DOCKER_TLS_VERIFY`) are not probed and count as absent. Ports are
//! published on host `127.0.0.1` only, with a port chosen by the engine.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::mpsc as std_mpsc;
use std::sync::OnceLock;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use testcontainers::bollard::models::{HostConfig, PortBinding};
use testcontainers::core::IntoContainerPort;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};
use tokio::sync::mpsc as tokio_mpsc;

use crate::FixtureError;

/// The label every fixture container carries (value: the fixture's kind,
/// e.g. `etcd`). `scripts/containers-setup.sh` removes leftovers by it.
pub const FIXTURE_LABEL: &str = "org.registry-toolkit.fixture";

/// How long the engine probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the Docker-compatible engine API is expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineAddr {
    /// Plain HTTP over TCP, `host:port` (`DOCKER_HOST=tcp://…` or `http://…`).
    Tcp(String),
    /// A unix socket (`DOCKER_HOST=unix://…` or the default socket).
    Unix(PathBuf),
}

impl EngineAddr {
    /// The engine named by `DOCKER_HOST`, else the default unix socket.
    /// `None` for addresses this probe cannot speak to (TLS, named pipes).
    pub fn from_env() -> Option<Self> {
        if std::env::var_os("DOCKER_TLS_VERIFY").is_some_and(|v| !v.is_empty() && v != "0") {
            return None;
        }
        match std::env::var("DOCKER_HOST") {
            Ok(host) if !host.is_empty() => Self::parse(&host),
            _ => Some(Self::Unix(PathBuf::from("/var/run/docker.sock"))),
        }
    }

    /// Parse a `DOCKER_HOST` value.
    pub fn parse(host: &str) -> Option<Self> {
        if let Some(rest) = host
            .strip_prefix("tcp://")
            .or_else(|| host.strip_prefix("http://"))
        {
            let hostport = rest.split('/').next().unwrap_or_default();
            (!hostport.is_empty()).then(|| Self::Tcp(hostport.to_string()))
        } else {
            host.strip_prefix("unix://")
                .map(|path| Self::Unix(PathBuf::from(path)))
        }
    }

    /// `GET path` on the engine API: the status code and the body (raw, so
    /// possibly chunked). Bounded by `timeout` per connect / read / write.
    pub fn get(&self, path: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
        let request = format!("GET {path} HTTP/1.1\r\nHost: docker\r\nConnection: close\r\n\r\n");
        let mut response = Vec::new();
        match self {
            Self::Tcp(hostport) => {
                let addr = hostport
                    .to_socket_addrs()?
                    .next()
                    .ok_or_else(|| std::io::Error::other(format!("no address for {hostport}")))?;
                let mut s = TcpStream::connect_timeout(&addr, timeout)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
                s.write_all(request.as_bytes())?;
                s.read_to_end(&mut response)?;
            }
            Self::Unix(path) => {
                let mut s = std::os::unix::net::UnixStream::connect(path)?;
                s.set_read_timeout(Some(timeout))?;
                s.set_write_timeout(Some(timeout))?;
                s.write_all(request.as_bytes())?;
                s.read_to_end(&mut response)?;
            }
        }
        parse_response(&response)
            .ok_or_else(|| std::io::Error::other("not an HTTP response from the engine"))
    }
}

fn parse_response(raw: &[u8]) -> Option<(u16, String)> {
    let text = String::from_utf8_lossy(raw);
    let status_line = text.lines().next()?;
    if !status_line.starts_with("HTTP/1.") {
        return None;
    }
    let code = status_line.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}

/// Whether a Docker-compatible engine answers `/_ping` (probed once per
/// process, within two seconds).
pub fn engine_answers() -> bool {
    static ANSWERS: OnceLock<bool> = OnceLock::new();
    *ANSWERS.get_or_init(|| engine_probe().is_ok())
}

/// Probe the engine now: `Ok(address)` when it answers `/_ping` with 200.
pub fn engine_probe() -> Result<EngineAddr, String> {
    let addr = EngineAddr::from_env().ok_or_else(|| {
        "DOCKER_HOST names an engine this probe cannot reach (TLS or a named pipe)".to_string()
    })?;
    match addr.get("/_ping", PROBE_TIMEOUT) {
        Ok((200, _)) => Ok(addr),
        Ok((code, body)) => Err(format!("{addr:?} answered /_ping with {code}: {body}")),
        Err(e) => Err(format!("no engine at {addr:?}: {e}")),
    }
}

/// Whether fixtures of `kind` (`etcd`, `moto`) may use containers when
/// started with `start()`: `REGISTRY_TEST_CONTAINERS` unset or `auto`
/// allows all; `off` / `0` / `none` allows none; otherwise it is a comma
/// separated list of kinds (e.g. `etcd`).
pub fn containers_allowed(kind: &str) -> bool {
    match std::env::var("REGISTRY_TEST_CONTAINERS") {
        Err(_) => true,
        Ok(v) => match v.trim() {
            "" | "auto" | "1" | "on" | "all" => true,
            "off" | "0" | "none" => false,
            list => list.split(',').any(|k| k.trim() == kind),
        },
    }
}

/// What to run: an image with one TCP port that answers HTTP.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    /// The fixture's kind, used in messages and as the label value.
    pub kind: &'static str,
    /// The image reference, e.g. `quay.io/coreos/etcd:v3.5.17`.
    pub image: String,
    /// The container port to publish on `127.0.0.1`.
    pub port: u16,
    /// Environment variables for the container.
    pub env: Vec<(String, String)>,
    /// Arguments (the image's `CMD`); empty keeps the image's own.
    pub cmd: Vec<String>,
    /// An HTTP path whose answer (any status) means the server is ready.
    pub ready_path: &'static str,
    /// How long the server may take to become ready after each start.
    pub limit: Duration,
}

type Reply = std_mpsc::Sender<Result<(), FixtureError>>;

enum Command {
    Stop(Reply),
    Start(Reply),
}

/// A running fixture container, removed when dropped.
pub struct ServerContainer {
    id: String,
    image: String,
    host_port: u16,
    commands: Option<tokio_mpsc::UnboundedSender<Command>>,
    keeper: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ServerContainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerContainer")
            .field("id", &self.id)
            .field("image", &self.image)
            .field("host_port", &self.host_port)
            .finish()
    }
}

struct Ready {
    id: String,
    host_port: u16,
}

impl ServerContainer {
    /// Create and start the container, and wait until it answers HTTP on
    /// its published port. Blocks the calling thread (also fine inside a
    /// tokio runtime: the work happens on the keeper thread).
    pub fn start(spec: ContainerSpec) -> Result<Self, FixtureError> {
        let (tx, rx) = std_mpsc::channel();
        let image = spec.image.clone();
        let (commands, keeper) = spawn_keeper(spec, move |r| {
            let _ = tx.send(r);
        })?;
        let ready = rx
            .recv()
            .unwrap_or_else(|_| Err(container_error(&image, "the keeper thread ended early")));
        Self::assemble(ready, image, commands, keeper)
    }

    /// [`ServerContainer::start`] for async code: awaits readiness without
    /// blocking the runtime.
    pub async fn start_async(spec: ContainerSpec) -> Result<Self, FixtureError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let image = spec.image.clone();
        let (commands, keeper) = spawn_keeper(spec, move |r| {
            let _ = tx.send(r);
        })?;
        let ready = rx
            .await
            .unwrap_or_else(|_| Err(container_error(&image, "the keeper thread ended early")));
        Self::assemble(ready, image, commands, keeper)
    }

    fn assemble(
        ready: Result<Ready, FixtureError>,
        image: String,
        commands: tokio_mpsc::UnboundedSender<Command>,
        keeper: JoinHandle<()>,
    ) -> Result<Self, FixtureError> {
        match ready {
            Ok(Ready { id, host_port }) => {
                tracing::info!(%image, %id, host_port, "fixture container up");
                Ok(Self {
                    id,
                    image,
                    host_port,
                    commands: Some(commands),
                    keeper: Some(keeper),
                })
            }
            Err(e) => {
                drop(commands);
                let _ = keeper.join();
                Err(e)
            }
        }
    }

    /// The container's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The image it runs.
    pub fn image(&self) -> &str {
        &self.image
    }

    /// The published port on `127.0.0.1`.
    pub fn host_port(&self) -> u16 {
        self.host_port
    }

    /// The published address, `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.host_port))
    }

    fn command(&self, make: impl FnOnce(Reply) -> Command) -> Result<(), FixtureError> {
        let (tx, rx) = std_mpsc::channel();
        let gone = || container_error(&self.image, "the keeper thread is gone");
        self.commands
            .as_ref()
            .ok_or_else(gone)?
            .send(make(tx))
            .map_err(|_| gone())?;
        rx.recv().unwrap_or_else(|_| Err(gone()))
    }

    /// Stop the container at once (SIGKILL: `docker stop -t 0`). Its
    /// filesystem and published port stay for [`ServerContainer::restart`].
    pub fn kill(&self) -> Result<(), FixtureError> {
        self.command(Command::Stop)
    }

    /// Start the stopped container again and wait until it answers. The
    /// engine keeps the published port (podman and Docker both do for a
    /// stopped container); an error says so if it changed.
    pub fn restart(&self) -> Result<(), FixtureError> {
        self.command(Command::Start)
    }
}

impl Drop for ServerContainer {
    fn drop(&mut self) {
        // Closing the channel makes the keeper remove the container.
        drop(self.commands.take());
        if let Some(k) = self.keeper.take() {
            if k.join().is_err() {
                tracing::warn!(id = %self.id, "the container keeper panicked");
            }
        }
    }
}

fn container_error(image: &str, detail: impl Into<String>) -> FixtureError {
    FixtureError::Container {
        image: image.to_string(),
        detail: detail.into(),
    }
}

/// Split `registry/name:tag` into name and tag (`latest` when absent).
fn split_image(image: &str) -> (String, String) {
    let last_slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[last_slash..].rfind(':') {
        Some(i) => (
            image[..last_slash + i].to_string(),
            image[last_slash + i + 1..].to_string(),
        ),
        None => (image.to_string(), "latest".to_string()),
    }
}

fn spawn_keeper(
    spec: ContainerSpec,
    ready: impl FnOnce(Result<Ready, FixtureError>) + Send + 'static,
) -> Result<(tokio_mpsc::UnboundedSender<Command>, JoinHandle<()>), FixtureError> {
    let (tx, rx) = tokio_mpsc::unbounded_channel();
    let keeper = std::thread::Builder::new()
        .name(format!("{}-container", spec.kind))
        .spawn(move || keep(spec, ready, rx))
        .map_err(|source| FixtureError::Io {
            what: "spawning the container keeper thread".into(),
            source,
        })?;
    Ok((tx, keeper))
}

/// The keeper: start the container, serve stop/start requests, remove it
/// when the handle is dropped (the channel closes).
fn keep(
    spec: ContainerSpec,
    ready: impl FnOnce(Result<Ready, FixtureError>),
    mut commands: tokio_mpsc::UnboundedReceiver<Command>,
) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(source) => {
            return ready(Err(FixtureError::Io {
                what: "building the container keeper's runtime".into(),
                source,
            }))
        }
    };
    rt.block_on(async move {
        let container = match create(&spec).await {
            Ok(c) => c,
            Err(e) => return ready(Err(e)),
        };
        let id = container.id().to_string();
        let host_port = match published_port(&container, &spec).await {
            Ok(p) => p,
            Err(e) => {
                remove(container, &spec.image).await;
                return ready(Err(e));
            }
        };
        if let Err(e) = wait_http(&container, &spec, host_port).await {
            remove(container, &spec.image).await;
            return ready(Err(e));
        }
        ready(Ok(Ready { id, host_port }));
        while let Some(cmd) = commands.recv().await {
            match cmd {
                Command::Stop(reply) => {
                    let r = container
                        .stop_with_timeout(Some(0))
                        .await
                        .map_err(|e| container_error(&spec.image, format!("stop: {e}")));
                    let _ = reply.send(r);
                }
                Command::Start(reply) => {
                    let r = restart(&container, &spec, host_port).await;
                    let _ = reply.send(r);
                }
            }
        }
        remove(container, &spec.image).await;
    });
}

async fn create(spec: &ContainerSpec) -> Result<ContainerAsync<GenericImage>, FixtureError> {
    let (name, tag) = split_image(&spec.image);
    let port_key = format!("{}/tcp", spec.port);
    let mut request = GenericImage::new(name, tag)
        .with_exposed_port(spec.port.tcp())
        .with_label(FIXTURE_LABEL, spec.kind)
        .with_startup_timeout(spec.limit)
        // Publish on loopback only, with a port the engine picks. Setting
        // the binding explicitly matters for podman 4.3, which otherwise
        // reports an empty HostIp (and testcontainers finds no port);
        // 0.0.0.0 would also expose the server beyond this machine.
        .with_host_config_modifier(move |hc: &mut HostConfig| {
            hc.publish_all_ports = Some(false);
            hc.port_bindings = Some(HashMap::from([(
                port_key.clone(),
                Some(vec![PortBinding {
                    host_ip: Some("127.0.0.1".into()),
                    host_port: Some(String::new()),
                }]),
            )]));
        });
    for (k, v) in &spec.env {
        request = request.with_env_var(k, v);
    }
    if !spec.cmd.is_empty() {
        request = request.with_cmd(spec.cmd.clone());
    }
    request
        .start()
        .await
        .map_err(|e| container_error(&spec.image, format!("starting the container: {e}")))
}

async fn published_port(
    container: &ContainerAsync<GenericImage>,
    spec: &ContainerSpec,
) -> Result<u16, FixtureError> {
    container
        .get_host_port_ipv4(spec.port.tcp())
        .await
        .map_err(|e| container_error(&spec.image, format!("published port of {}: {e}", spec.port)))
}

async fn restart(
    container: &ContainerAsync<GenericImage>,
    spec: &ContainerSpec,
    host_port: u16,
) -> Result<(), FixtureError> {
    if container.is_running().await.unwrap_or(false) {
        container
            .stop_with_timeout(Some(0))
            .await
            .map_err(|e| container_error(&spec.image, format!("stop: {e}")))?;
    }
    container
        .start()
        .await
        .map_err(|e| container_error(&spec.image, format!("start: {e}")))?;
    let now = published_port(container, spec).await?;
    if now != host_port {
        return Err(container_error(
            &spec.image,
            format!("the engine moved the published port from {host_port} to {now} on restart"),
        ));
    }
    wait_http(container, spec, host_port).await
}

/// Wait until `GET ready_path` on the published port gets any HTTP answer.
async fn wait_http(
    container: &ContainerAsync<GenericImage>,
    spec: &ContainerSpec,
    host_port: u16,
) -> Result<(), FixtureError> {
    let addr = SocketAddr::from(([127, 0, 0, 1], host_port));
    let deadline = Instant::now() + spec.limit;
    let path = spec.ready_path;
    loop {
        // A blocking probe is fine: this runtime belongs to the keeper.
        if http_answers(addr, path) {
            return Ok(());
        }
        let running = container.is_running().await.unwrap_or(false);
        if !running || Instant::now() > deadline {
            let mut log = container.stderr_to_vec().await.unwrap_or_default();
            log.extend(container.stdout_to_vec().await.unwrap_or_default());
            let log = String::from_utf8_lossy(&log);
            let tail: String = log
                .chars()
                .rev()
                .take(2048)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let why = if running {
                format!("no HTTP answer on {addr}{path} within {:?}", spec.limit)
            } else {
                "the container exited".to_string()
            };
            return Err(FixtureError::NotReady {
                program: format!("{} container ({})", spec.kind, spec.image),
                addr,
                detail: format!("{why}; log: {tail}"),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether `GET path` on `addr` gets an HTTP status line back.
pub fn http_answers(addr: SocketAddr, path: &str) -> bool {
    let attempt = || -> std::io::Result<bool> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
        s.set_read_timeout(Some(Duration::from_secs(1)))?;
        s.set_write_timeout(Some(Duration::from_secs(1)))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?;
        let mut head = [0u8; 8];
        s.read_exact(&mut head)?;
        Ok(head.starts_with(b"HTTP/1."))
    };
    attempt().unwrap_or(false)
}

async fn remove(container: ContainerAsync<GenericImage>, image: &str) {
    let id = container.id().to_string();
    if let Err(e) = container.rm().await {
        tracing::warn!(%id, %image, "removing the fixture container failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn image_references_split_into_name_and_tag() {
        let s = |i: &str| split_image(i);
        assert_eq!(
            s("quay.io/coreos/etcd:v3.5.17"),
            ("quay.io/coreos/etcd".into(), "v3.5.17".into())
        );
        assert_eq!(
            s("motoserver/moto"),
            ("motoserver/moto".into(), "latest".into())
        );
        assert_eq!(
            s("localhost:5000/x/etcd:local"),
            ("localhost:5000/x/etcd".into(), "local".into())
        );
        assert_eq!(
            s("localhost:5000/x/etcd"),
            ("localhost:5000/x/etcd".into(), "latest".into())
        );
    }

    #[test]
    fn docker_host_values_parse() {
        assert_eq!(
            EngineAddr::parse("tcp://127.0.0.1:2375"),
            Some(EngineAddr::Tcp("127.0.0.1:2375".into()))
        );
        assert_eq!(
            EngineAddr::parse("unix:///run/podman/podman.sock"),
            Some(EngineAddr::Unix("/run/podman/podman.sock".into()))
        );
        assert_eq!(EngineAddr::parse("npipe:////./pipe/docker_engine"), None);
    }

    #[test]
    fn responses_parse() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK").unwrap();
        assert_eq!(r, (200, "OK".into()));
        assert!(parse_response(b"garbage").is_none());
    }
}
