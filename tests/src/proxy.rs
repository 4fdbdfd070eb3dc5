//! A TCP proxy on loopback in front of a fixture server (or a server under
//! test) that tests use to break the network between a client and it: cut
//! every open connection, refuse new ones, or black-hole them (keep them
//! open and forward nothing); or move clients to another server, as a
//! load balancer does when the server behind it changes.
//!
//! ```no_run
//! # async fn demo(server: std::net::SocketAddr) -> Result<(), waypost_fixtures::FixtureError> {
//! let proxy = waypost_fixtures::proxy::CutProxy::start(server).await?;
//! let url = proxy.url(); // give this to the client instead of the server's
//! proxy.refuse();        // every connection closed, new ones dropped
//! proxy.heal();          // forward again
//! # Ok(()) }
//! ```

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::FixtureError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Forward,
    BlackHole,
    Refuse,
}

/// A proxy to a target address, listening on a loopback port of its own.
/// Dropping it closes its listener and every connection.
#[derive(Debug)]
pub struct CutProxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    /// Bumped to close every open connection.
    cut: watch::Sender<u64>,
    /// Where new connections go.
    target: watch::Sender<SocketAddr>,
    task: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    /// Listen on `127.0.0.1:0` and forward every connection to `target`.
    pub async fn start(target: SocketAddr) -> Result<CutProxy, FixtureError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(crate::io("binding the proxy's loopback port"))?;
        let addr = listener
            .local_addr()
            .map_err(crate::io("reading the proxy's port"))?;
        let mode = watch::channel(Mode::Forward).0;
        let cut = watch::channel(0u64).0;
        let target = watch::channel(target).0;
        let (m, c, t) = (mode.clone(), cut.clone(), target.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                if *m.borrow() == Mode::Refuse {
                    continue; // dropped: the client sees the connection close
                }
                let to = *t.borrow();
                tokio::spawn(pipe(client, to, m.subscribe(), c.subscribe()));
            }
        });
        Ok(CutProxy {
            addr,
            mode,
            cut,
            target,
            task,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Close every open connection; new ones go through.
    pub fn cut(&self) {
        self.cut.send_modify(|g| *g += 1);
    }

    /// Close every open connection and drop new ones until
    /// [`CutProxy::heal`].
    pub fn refuse(&self) {
        self.mode.send_replace(Mode::Refuse);
        self.cut();
    }

    /// Forward nothing, without closing anything, until [`CutProxy::heal`].
    pub fn black_hole(&self) {
        self.mode.send_replace(Mode::BlackHole);
    }

    /// Close every open connection and send new ones to `target`.
    pub fn retarget(&self, target: SocketAddr) {
        self.target.send_replace(target);
        self.cut();
    }

    /// Forward again, and accept new connections.
    pub fn heal(&self) {
        self.mode.send_replace(Mode::Forward);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut();
    }
}

async fn pipe(
    client: TcpStream,
    target: SocketAddr,
    mode: watch::Receiver<Mode>,
    mut cut: watch::Receiver<u64>,
) {
    cut.borrow_and_update();
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    tokio::select! {
        _ = copy(cr, sw, mode.clone()) => {}
        _ = copy(sr, cw, mode) => {}
        _ = cut.changed() => {}
    }
}

/// Copy until either side closes; while black-holed, hold what was read.
async fn copy(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if mode.wait_for(|m| *m == Mode::Forward).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
