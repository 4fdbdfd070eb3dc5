#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why a fixture could not start.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    /// The server's program is not installed.
    #[error("{program} not found on PATH: {hint}")]
    NotInstalled {
        /// The program that was looked for.
        program: String,
        /// How to install it.
        hint: String,
    },
    /// The server started but did not answer in time, or exited.
    #[error("{program} on {addr} did not come up: {detail}")]
    NotReady {
        /// The program.
        program: String,
        /// Where it should have answered.
        addr: SocketAddr,
        /// Its exit status or last output.
        detail: String,
    },
    /// No Docker-compatible engine answered (for the explicit container
    /// constructors).
    #[error(
        "no container engine: {detail} (run scripts/containers-setup.sh and export what it prints)"
    )]
    NoEngine {
        /// What the probe found.
        detail: String,
    },
    /// The container engine could not create, start, stop or inspect the
    /// fixture's container.
    #[error("container from {image}: {detail}")]
    Container {
        /// The image.
        image: String,
        /// What failed.
        detail: String,
    },
    /// The server is up but the registry on it could not be set up.
    #[cfg(any(
        feature = "etcd",
        feature = "dynamodb",
        feature = "cloudmap",
        feature = "registrar"
    ))]
    #[error("{what}: {source}")]
    Registry {
        /// What was being set up.
        what: String,
        /// The registry's error.
        source: waypost::Error,
    },
    /// Any other I/O failure (ports, temp dirs, spawning).
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> FixtureError {
    let what = what.into();
    move |source| FixtureError::Io { what, source }
}

impl FixtureError {
    /// Whether a server exited because a port it was given was taken
    /// between [`free_port`] finding it and the server binding it (by an
    /// outgoing connection's local port, say).
    pub fn port_taken(&self) -> bool {
        matches!(self, FixtureError::NotReady { detail, .. }
            if detail.to_ascii_lowercase().contains("address already in use"))
    }
}

/// How many times a local server is started on fresh ports when the ones
/// it was given were taken before it bound them.
const PORT_TRIES: u32 = 5;

/// `start()`, which picks its ports with [`free_port`], again with fresh
/// ports while it fails because one was taken, at most [`PORT_TRIES`]
/// times in all.
pub(crate) fn on_fresh_ports<T>(
    mut start: impl FnMut() -> Result<T, FixtureError>,
) -> Result<T, FixtureError> {
    let mut tries = 1;
    loop {
        match start() {
            Err(e) if e.port_taken() && tries < PORT_TRIES => tries += 1,
            result => return result,
        }
    }
}

/// A killed server's port, bound without listening until the server
/// starts again: connections to it are refused, as to nothing, and no
/// other socket binds it meanwhile (another test's server answering there
/// would look like a backend that refuses requests).
pub(crate) struct PortHold {
    _socket: tokio::net::TcpSocket,
}

impl PortHold {
    /// The port of `url` (`http://host:port`) held, trying for up to a
    /// second while the server's own socket goes away; `None` if it
    /// cannot be (the fault goes on without the hold).
    pub(crate) fn take(url: &str) -> Option<Self> {
        let addr: SocketAddr = url.trim_start_matches("http://").parse().ok()?;
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let held = tokio::net::TcpSocket::new_v4().and_then(|s| {
                // Over the killed server's connections in TIME_WAIT.
                s.set_reuseaddr(true)?;
                s.bind(addr)?;
                Ok(s)
            });
            match held {
                Ok(socket) => return Some(Self { _socket: socket }),
                Err(e) if Instant::now() > deadline => {
                    tracing::warn!("holding {addr} while its server is down: {e}");
                    return None;
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

/// A free TCP port on 127.0.0.1 (bound once, then released for the server).
pub fn free_port() -> Result<u16, FixtureError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(io("binding a free loopback port"))?;
    let port = l.local_addr().map_err(io("reading the bound port"))?.port();
    Ok(port)
}

/// Whether `program` can be found on `PATH`.
pub fn on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// A child process that is killed (and its data directory removed) on drop.
pub struct ServerProcess {
    program: String,
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl ServerProcess {
    /// The process id (for reading its CPU time and memory in `/proc`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Start `program args…` in a fresh temp directory (passed to `args` as
    /// its path) with output to a log file there, and wait until `addr`
    /// accepts TCP connections (at most `limit`).
    pub fn spawn(
        program: &str,
        hint: &str,
        args: impl FnOnce(&Path) -> Vec<String>,
        addr: SocketAddr,
        limit: Duration,
    ) -> Result<Self, FixtureError> {
        let exe = on_path(program).ok_or_else(|| FixtureError::NotInstalled {
            program: program.into(),
            hint: hint.into(),
        })?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("{program}-fixture-"))
            .tempdir()
            .map_err(io("creating a temp dir"))?;
        let log = dir.path().join("server.log");
        let out = std::fs::File::create(&log).map_err(io("creating the server log"))?;
        let err = out.try_clone().map_err(io("cloning the log handle"))?;
        let child = Command::new(exe)
            .args(args(dir.path()))
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(io(format!("spawning {program}")))?;
        let mut server = Self {
            program: program.into(),
            child,
            log,
            _dir: dir,
        };
        server.wait_ready(addr, limit)?;
        tracing::info!(program, %addr, "fixture server up");
        Ok(server)
    }

    fn wait_ready(&mut self, addr: SocketAddr, limit: Duration) -> Result<(), FixtureError> {
        let deadline = Instant::now() + limit;
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            let exited = self.child.try_wait().map_err(io("polling the server"))?;
            if exited.is_some() || Instant::now() > deadline {
                let detail = match exited {
                    Some(status) => format!("exited with {status}; log: {}", self.log_tail()),
                    None => format!("no answer within {limit:?}; log: {}", self.log_tail()),
                };
                return Err(FixtureError::NotReady {
                    program: self.program.clone(),
                    addr,
                    detail,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The last 2 KiB of the server's output.
    pub fn log_tail(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        let start = s.len().saturating_sub(2048);
        let start = (start..s.len())
            .find(|i| s.is_char_boundary(*i))
            .unwrap_or(s.len());
        s[start..].to_string()
    }

    /// Kill the server now (it is also killed on drop).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(any(feature = "etcd", feature = "dynamodb", feature = "cloudmap"))]
pub mod configs;
pub mod containers;
mod etcd;
pub mod fs;
mod moto;
pub mod proxy;
#[cfg(feature = "registrar")]
pub mod registrar;
#[cfg(any(feature = "etcd", feature = "dynamodb", feature = "cloudmap"))]
pub mod registries;

pub use etcd::EtcdServer;
pub use moto::MotoServer;

/// How a fixture's server is provided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provision {
    /// A server named by an environment variable; the fixture does not own
    /// it (kill / restart do nothing).
    External,
    /// A container started through testcontainers, removed on drop.
    Container,
    /// A local process, killed (and its data removed) on drop.
    Process,
}

/// The four ways every fixture server starts, written once over
/// [`Fixture`]: `start` (environment variable, container or process),
/// `start_async`, `start_container` and `start_container_async`.
macro_rules! fixture_starts {
    ($name:literal) => {
        #[doc = concat!("Start ", $name, " (environment variable, container or process, see the")]
        /// type's docs). Blocks; callable from sync tests and from inside a
        /// tokio runtime alike. A container that fails to start is reported on
        /// stderr and replaced by a local process.
        pub fn start() -> Result<Self, FixtureError> {
            crate::provision()
        }

        /// [`Self::start`] for async code: does not block the runtime
        /// while the server comes up.
        pub async fn start_async() -> Result<Self, FixtureError> {
            crate::provision_async().await
        }

        #[doc = concat!("Start ", $name, " in a container through testcontainers, whatever the")]
        /// environment variables say about an existing server. Fails with
        /// [`FixtureError::NoEngine`] when no engine answers.
        pub fn start_container() -> Result<Self, FixtureError> {
            crate::provision_container()
        }

        /// [`Self::start_container`] for async code.
        pub async fn start_container_async() -> Result<Self, FixtureError> {
            crate::provision_container_async().await
        }
    };
}
pub(crate) use fixture_starts;

/// What a fixture server type supplies so that the choice between an
/// external server, a container and a local process is written once.
trait Fixture: Sized + Send + 'static {
    /// `etcd` or `moto`, as in `REGISTRY_TEST_CONTAINERS`.
    const KIND: &'static str;
    /// The container to start.
    fn spec() -> containers::ContainerSpec;
    /// The server named by the environment variable, if any.
    fn external() -> Option<Self>;
    /// The fixture around a started container.
    fn in_container(c: containers::ServerContainer) -> Self;
    /// Start a local process.
    fn start_process() -> Result<Self, FixtureError>;
}

/// Environment variable, then a container when an engine answers, then a
/// local process (blocking).
fn provision<T: Fixture>() -> Result<T, FixtureError> {
    if let Some(s) = T::external() {
        return Ok(s);
    }
    if containers::containers_allowed(T::KIND) && containers::engine_answers() {
        match containers::ServerContainer::start(T::spec()) {
            Ok(c) => return Ok(T::in_container(c)),
            Err(e) => container_fallback(T::KIND, &e),
        }
    }
    T::start_process()
}

/// [`provision`] without blocking the runtime.
async fn provision_async<T: Fixture>() -> Result<T, FixtureError> {
    if let Some(s) = T::external() {
        return Ok(s);
    }
    if containers::containers_allowed(T::KIND) && containers::engine_answers() {
        match containers::ServerContainer::start_async(T::spec()).await {
            Ok(c) => return Ok(T::in_container(c)),
            Err(e) => container_fallback(T::KIND, &e),
        }
    }
    tokio::task::spawn_blocking(T::start_process)
        .await
        .map_err(|e| FixtureError::Io {
            what: format!("starting {}", T::KIND),
            source: std::io::Error::other(e),
        })?
}

/// A container, whatever the environment says; `NoEngine` without one.
fn provision_container<T: Fixture>() -> Result<T, FixtureError> {
    containers::engine_probe().map_err(|detail| FixtureError::NoEngine { detail })?;
    containers::ServerContainer::start(T::spec()).map(T::in_container)
}

/// [`provision_container`] for async code.
async fn provision_container_async<T: Fixture>() -> Result<T, FixtureError> {
    containers::engine_probe().map_err(|detail| FixtureError::NoEngine { detail })?;
    containers::ServerContainer::start_async(T::spec())
        .await
        .map(T::in_container)
}

/// Log, on stderr too (test output shows it), that `start()` fell back
/// from containers to a local process.
fn container_fallback(kind: &str, err: &FixtureError) {
    tracing::warn!(
        kind,
        "fixture container failed, using a local process: {err}"
    );
    eprintln!("waypost-fixtures: {kind} container failed, using a local process: {err}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exited(detail: &str) -> FixtureError {
        FixtureError::NotReady {
            program: "etcd".into(),
            addr: SocketAddr::from(([127, 0, 0, 1], 2379)),
            detail: detail.into(),
        }
    }

    #[test]
    fn a_server_that_found_its_port_taken_is_started_again_a_bounded_number_of_times() {
        let taken = "exited with exit status: 1; log: listen tcp 127.0.0.1:38139: bind: address already in use";
        let mut tries = 0;
        let started = on_fresh_ports(|| {
            tries += 1;
            if tries < 3 {
                Err(exited(taken))
            } else {
                Ok(tries)
            }
        });
        assert_eq!(started.ok(), Some(3));
        // Always taken: the last error, after PORT_TRIES starts.
        let mut tries = 0;
        let started: Result<(), _> = on_fresh_ports(|| {
            tries += 1;
            Err(exited("OSError: [Errno 98] Address already in use"))
        });
        assert!(started.is_err_and(|e| e.port_taken()));
        assert_eq!(tries, PORT_TRIES);
        // Any other failure: not started again.
        let mut tries = 0;
        let started: Result<(), _> = on_fresh_ports(|| {
            tries += 1;
            Err(exited("no answer within 30s"))
        });
        assert!(started.is_err_and(|e| !e.port_taken()));
        assert_eq!(tries, 1);
    }
}
