//! The fan-out phase's floor (`--encoding floor`): what the same fan-out
//! costs a minimal tokio server with no gRPC, no HTTP/2 and no registry.
//! It accepts `--agents` loopback TCP connections and, for each change
//! (`--rate` per second for `--seconds`), wakes one task per connection
//! (as the registrar wakes one stream per agent) that writes a 128-byte
//! message to its socket. The agents (a child process, on CPU 1 with
//! `--pin`) read them. Its CPU time per delivered message is the floor the
//! registrar's is compared with: one socket write per delivery, and the
//! wake-up before it.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::sync::broadcast;

use crate::procs::{cpu_seconds, spawn_self, CpuMark, Figures, REGISTRAR_CPU};
use crate::{now_micros, Args};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The size of one message: about an `EndpointEvent` delta with its gRPC
/// and HTTP/2 framing.
const MESSAGE: usize = 128;

/// The server's side (this process, on CPU 0 with `--pin`).
pub(crate) async fn serve(args: &Args) -> Res<Figures> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let agents_cpu = args.pin.then_some(REGISTRAR_CPU + 1);
    let mut child = spawn_self(args, &["--floor-client", &addr], agents_cpu)?;
    let (tx, _) = broadcast::channel::<(u64, u64)>(65_536);
    let mut tasks = Vec::with_capacity(args.agents);
    for _ in 0..args.agents {
        let (mut sock, _) = tokio::time::timeout(Duration::from_secs(60), listener.accept())
            .await
            .map_err(|_| "the agents did not connect within 60 s")??;
        sock.set_nodelay(true)?;
        let mut rx = tx.subscribe();
        tasks.push(tokio::spawn(async move {
            let mut msg = [0u8; MESSAGE];
            while let Ok((seq, sent)) = rx.recv().await {
                msg[..8].copy_from_slice(&seq.to_le_bytes());
                msg[8..16].copy_from_slice(&sent.to_le_bytes());
                if sock.write_all(&msg).await.is_err() {
                    return;
                }
            }
        }));
    }
    let stdout = child.stdout.take().ok_or("the agents' stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let writes = args.rate * args.seconds;
    let asked = args.rate.clamp(1, u64::from(u32::MAX));
    let period = Duration::from_millis(10).max(Duration::from_secs(1) / asked as u32);
    let per_tick = ((asked as f64 * period.as_secs_f64()).round() as u64).max(1);
    let mut tick = tokio::time::interval(period);
    let (cpu_start, start) = (CpuMark::now(), Instant::now());
    let mut seq = 0;
    while seq < writes {
        tick.tick().await;
        for _ in 0..per_tick.min(writes - seq) {
            let _ = tx.send((seq, now_micros()));
            seq += 1;
        }
    }
    let mut figures = Figures::default();
    // The floor's writer does not wait for its writes: the rate is what
    // reached every agent, over the time until the last one did.
    let mut delivery_time = start.elapsed();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while let Some(line) = tokio::time::timeout_at(deadline, lines.next_line())
        .await
        .map_err(|_| "the agents did not report within 60 s")??
    {
        if line == "delivered" {
            delivery_time = start.elapsed();
            (figures.server_cpu_per_s, figures.server_kernel_per_s) =
                cpu_start.per_second(delivery_time);
        } else if let Some(r) = line.strip_prefix("result ") {
            let v: Vec<f64> = r.split(' ').filter_map(|x| x.parse().ok()).collect();
            if let [p50, p99, cpu] = v.as_slice() {
                figures.every_p50_ms = *p50;
                figures.every_p99_ms = *p99;
                figures.agents_cpu_per_s = *cpu;
            }
        }
    }
    figures.changes_per_s = writes as f64 / delivery_time.as_secs_f64();
    drop(tx);
    for t in tasks {
        let _ = t.await;
    }
    child.wait().await?;
    Ok(figures)
}

/// The agents' side: `agents` connections to `addr`, each reading every
/// message; prints `delivered` once every message reached every agent
/// (or 30 s after the last was due), then `result <every p50 ms> <every
/// p99 ms> <CPU s/s>`.
pub(crate) async fn client(addr: &str, args: &Args) -> Res<()> {
    let writes = (args.rate * args.seconds) as usize;
    let delivered: Arc<Vec<AtomicUsize>> =
        Arc::new((0..writes).map(|_| AtomicUsize::new(0)).collect());
    let slowest: Arc<Vec<AtomicU64>> = Arc::new((0..writes).map(|_| AtomicU64::new(0)).collect());
    let sent_at: Arc<Vec<AtomicU64>> = Arc::new((0..writes).map(|_| AtomicU64::new(0)).collect());
    let mut readers = Vec::with_capacity(args.agents);
    for _ in 0..args.agents {
        let mut sock = tokio::net::TcpStream::connect(addr).await?;
        let (delivered, slowest, sent_at) = (
            Arc::clone(&delivered),
            Arc::clone(&slowest),
            Arc::clone(&sent_at),
        );
        readers.push(tokio::spawn(async move {
            let mut msg = [0u8; MESSAGE];
            for _ in 0..writes {
                if sock.read_exact(&mut msg).await.is_err() {
                    return;
                }
                let now = now_micros();
                let word = |at: usize| {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(&msg[at..at + 8]);
                    u64::from_le_bytes(b)
                };
                let (seq, sent) = (word(0) as usize, word(8));
                if let (Some(d), Some(s), Some(t)) =
                    (delivered.get(seq), slowest.get(seq), sent_at.get(seq))
                {
                    d.fetch_add(1, Ordering::Relaxed);
                    s.fetch_max(now, Ordering::Relaxed);
                    t.store(sent, Ordering::Relaxed);
                }
            }
        }));
    }
    let cpu_start = cpu_seconds();
    let start = Instant::now();
    let limit = Duration::from_secs(args.seconds + 30);
    for r in readers {
        let left = limit.saturating_sub(start.elapsed());
        if tokio::time::timeout(left, r).await.is_err() {
            println!("floor: some agents did not receive every message in time");
            break;
        }
    }
    let cpu_per_s = (cpu_seconds() - cpu_start) / start.elapsed().as_secs_f64();
    println!("delivered");
    let mut every = hdrhistogram::Histogram::<u64>::new(3)?;
    for i in 0..writes {
        if delivered[i].load(Ordering::Relaxed) == args.agents {
            let last = slowest[i].load(Ordering::Relaxed);
            let sent = sent_at[i].load(Ordering::Relaxed);
            let _ = every.record(last.saturating_sub(sent).max(1));
        }
    }
    let ms = |q: f64| every.value_at_quantile(q) as f64 / 1000.0;
    println!("result {} {} {cpu_per_s}", ms(0.5), ms(0.99));
    Ok(())
}
