//! A loopback TCP proxy the soak owns, between agents and one replica: it
//! forwards, cuts every open connection, or black-holes them (keeps them
//! open and forwards nothing) for a while.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Forward,
    BlackHole,
}

/// A proxy to `target`, listening on its own loopback port.
pub struct Proxy {
    pub addr: SocketAddr,
    mode: watch::Sender<Mode>,
    /// Bumped to close every open connection.
    cut: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = watch::channel(Mode::Forward).0;
        let cut = watch::channel(0u64).0;
        let (m, c) = (mode.clone(), cut.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let (m, c) = (m.subscribe(), c.subscribe());
                tokio::spawn(pipe(client, target, m, c));
            }
        });
        Proxy {
            addr,
            mode,
            cut,
            task,
        }
    }

    /// Close every open connection (new ones go through).
    pub fn cut(&self) {
        self.cut.send_modify(|g| *g += 1);
    }

    /// Forward nothing, without closing anything, until [`Proxy::heal`].
    pub fn black_hole(&self) {
        self.mode.send_replace(Mode::BlackHole);
    }

    /// Forward again.
    pub fn heal(&self) {
        self.mode.send_replace(Mode::Forward);
    }
}

impl Drop for Proxy {
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
