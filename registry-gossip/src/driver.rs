//! [`Driver`]: the tokio UDP driver around [`Machine`], shared by a
//! [`GossipRegistry`](crate::GossipRegistry) and its two tasks.
//!
//! The socket, the machine (under one lock, with the version of the last
//! published event), the watch hub and the clock the machine's time is
//! measured from. One task receives datagrams, the other fires the
//! machine's timers; both, and every registry call, go through
//! [`Driver::step`], which runs one machine step and then publishes its
//! changes and sends its datagrams before the lock is released.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use waypost::{backend::Hub, Result, Version};

use crate::config::GossipConfig;
use crate::crdt::{micros, NodeId};
use crate::error;
use crate::machine::Machine;
use crate::watch;

/// The socket, the machine and the hub of one node.
pub(crate) struct Driver {
    state: Mutex<DriverState>,
    /// Watch subscribers and the current snapshot (what reads serve).
    pub(crate) hub: Arc<Hub>,
    socket: Arc<UdpSocket>,
    /// The bound address.
    pub(crate) addr: SocketAddr,
    /// This node's name.
    pub(crate) node: NodeId,
    /// When the driver started, on the monotonic clock.
    epoch: Instant,
    /// The wall-clock time (since the UNIX epoch, µs) at `epoch`: the
    /// machine's clock is this plus `epoch.elapsed()`, comparable across
    /// nodes (replay counters, entry timestamps). Moved forward when the
    /// wall clock is stepped forward (e.g. NTP's first sync after boot);
    /// backward steps are ignored, so the machine's clock never goes back.
    wall_offset: AtomicU64,
    /// Wakes the timer task when the next deadline moved earlier.
    wake: Arc<Notify>,
    /// Largest batch accepted.
    pub(crate) max_batch: usize,
    send_errors: AtomicU64,
}

/// What the lock guards: the machine and the version of the last event
/// published from its changes.
pub(crate) struct DriverState {
    /// The protocol state.
    pub(crate) machine: Machine,
    /// The version of the last published event.
    pub(crate) version: Version,
}

impl Driver {
    /// Bind the UDP socket, build the machine, announce to every seed and
    /// start the receive and timer tasks.
    pub(crate) async fn start(config: GossipConfig) -> Result<(Arc<Driver>, Vec<JoinHandle<()>>)> {
        let socket = UdpSocket::bind(config.bind)
            .await
            .map_err(|e| error::socket(config.bind, e))?;
        let addr = socket
            .local_addr()
            .map_err(|e| error::socket(config.bind, e))?;
        let node = NodeId::new(
            config
                .node_name
                .clone()
                .unwrap_or_else(|| format!("gossip-{addr}")),
        );
        let seed = config.rng_seed.unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            t ^ u64::from(addr.port()).rotate_left(48)
        });
        let epoch = Instant::now();
        let wall_start = wall_clock().unwrap_or_else(|| {
            tracing::warn!("the wall clock is before 1970; other nodes will drop this node's datagrams and entries");
            Duration::ZERO
        });
        let machine = Machine::new(&config, addr, node.clone(), seed, wall_start)?;
        let driver = Arc::new(Driver {
            state: Mutex::new(DriverState {
                machine,
                version: Version::ZERO,
            }),
            hub: Arc::new(Hub::new(config.watch_buffer, config.watch_history)),
            socket: Arc::new(socket),
            addr,
            node,
            epoch,
            wall_offset: AtomicU64::new(micros(wall_start)),
            wake: Arc::new(Notify::new()),
            max_batch: config.max_batch.max(1),
            send_errors: AtomicU64::new(0),
        });
        tracing::info!(%addr, node = %driver.node, seeds = ?config.seeds, "gossip node started");
        for seed in &config.seeds {
            driver.step(|m, now| m.join(*seed, now));
        }
        let tasks = vec![
            tokio::spawn(recv_loop(Arc::downgrade(&driver), driver.socket.clone())),
            tokio::spawn(timer_loop(Arc::downgrade(&driver), driver.wake.clone())),
        ];
        Ok((driver, tasks))
    }

    /// Lock the machine.
    pub(crate) fn lock(&self) -> MutexGuard<'_, DriverState> {
        // The machine is only mutated inside `step`, which completes
        // before the lock is released.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The machine's clock: the wall clock, never going back.
    fn now(&self) -> Duration {
        let elapsed = self.epoch.elapsed();
        let mut offset = self.wall_offset.load(Ordering::Relaxed);
        if let Some(wall) = wall_clock() {
            let current = micros(wall.saturating_sub(elapsed));
            offset = offset.max(current);
            self.wall_offset.fetch_max(current, Ordering::Relaxed);
        }
        Duration::from_micros(offset) + elapsed
    }

    /// The instant of the machine time `t`.
    fn instant(&self, t: Duration) -> Instant {
        let offset = Duration::from_micros(self.wall_offset.load(Ordering::Relaxed));
        self.epoch + t.saturating_sub(offset)
    }

    /// Datagrams the socket refused to send.
    pub(crate) fn send_errors(&self) -> u64 {
        self.send_errors.load(Ordering::Relaxed)
    }

    /// Run one machine step, then publish its changes and send its
    /// datagrams, all under the lock so events keep the machine's order.
    pub(crate) fn step<T>(&self, f: impl FnOnce(&mut Machine, Duration) -> T) -> T {
        let now = self.now();
        let mut st = self.lock();
        let before = st.machine.next_deadline();
        let out = f(&mut st.machine, now);
        let after = st.machine.next_deadline();
        let changes = st.machine.take_changes();
        watch::publish(&self.hub, &mut st.version, changes);
        for (to, packet) in st.machine.take_outbox() {
            if let Err(e) = self.socket.try_send_to(&packet, to) {
                // UDP is lossy anyway; SWIM and anti-entropy retry.
                self.send_errors.fetch_add(1, Ordering::Relaxed);
                tracing::trace!(%to, error = %e, "send failed");
            }
        }
        drop(st);
        // Wake the timer task only when the next deadline moved earlier
        // (waking it on every step would make it spin).
        let earlier = match (before, after) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(b), Some(a)) => a < b,
        };
        if earlier {
            self.wake.notify_one();
        }
        out
    }
}

/// The time since the UNIX epoch; `None` before 1970.
fn wall_clock() -> Option<Duration> {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
}

async fn recv_loop(driver: Weak<Driver>, socket: Arc<UdpSocket>) {
    let mut buf = vec![0u8; 65_536];
    loop {
        let (n, from) = match socket.recv_from(&mut buf).await {
            Ok(v) => v,
            Err(e) => {
                // E.g. an ICMP port-unreachable reported on the next read.
                tracing::trace!(error = %e, "recv failed");
                tokio::task::yield_now().await;
                continue;
            }
        };
        let Some(driver) = driver.upgrade() else {
            return;
        };
        let data = &buf[..n];
        driver.step(|m, now| m.handle_datagram(from, data, now));
    }
}

async fn timer_loop(driver: Weak<Driver>, wake: Arc<Notify>) {
    loop {
        let deadline = {
            let Some(driver) = driver.upgrade() else {
                return;
            };
            let next = driver.lock().machine.next_deadline();
            next.map(|d| driver.instant(d))
        };
        let far = Instant::now() + Duration::from_secs(3600);
        tokio::select! {
            _ = tokio::time::sleep_until(deadline.unwrap_or(far)) => {}
            _ = wake.notified() => {}
        }
        let Some(driver) = driver.upgrade() else {
            return;
        };
        driver.step(|m, now| m.tick(now));
    }
}
