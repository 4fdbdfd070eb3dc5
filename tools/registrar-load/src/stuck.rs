//! Phase 4 of `registrar-load`: what a stream that stops reading costs
//! the registrar, measured in processes of their own.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use waypost::{memory::MemoryRegistry, Batch, Endpoint, Event, Op, Watch};
use waypost_registrar_client::{ClientConfig, RpcClient};
use waypost_registrar_server::RegistrarConfig;

use crate::{endpoints, rss_bytes, start, Args};

/// The stuck clients (a child process): `n` streams on their own
/// connections, each with the protocol's default 64 KiB flow-control
/// window, reading the first message and then nothing. Prints `ready`,
/// holds them until stdin closes.
pub(crate) async fn client(
    url: &str,
    n: usize,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    use tokio::io::AsyncBufReadExt;
    use waypost_registrar_client::proto::registrar::v1::registrar_client::RegistrarClient as Grpc;
    use waypost_registrar_client::proto::registrar::v1::WatchEndpointsRequest;
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let channel = tonic::transport::Endpoint::from_shared(url.to_string())?
            .initial_stream_window_size(65_535)
            .initial_connection_window_size(65_535)
            .connect()
            .await?;
        let mut stream = Grpc::new(channel.clone())
            .watch_endpoints(WatchEndpointsRequest {
                cluster_name: "load".into(),
                node_name: format!("stuck-{i}"),
                last_version: String::new(),
                held: None,
                held_total: None,
            })
            .await?
            .into_inner();
        stream
            .message()
            .await?
            .ok_or_else(|| format!("stream {i} ended before its first message"))?;
        held.push((channel, stream));
    }
    println!("ready");
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while lines.next_line().await?.is_some() {}
    drop(held);
    Ok(())
}

/// Phase 4, on a registry of `size` endpoints: the server's RSS growth per
/// stuck stream (KiB), checking a healthy watcher gets 100 changes in order.
pub(crate) async fn at(
    args: &Args,
    size: usize,
) -> std::result::Result<f64, Box<dyn std::error::Error>> {
    use tokio::io::AsyncBufReadExt;
    let mem = MemoryRegistry::new();
    for chunk in endpoints(size).chunks(5000) {
        mem.apply(chunk.to_vec()).await?;
    }
    let server = start(Arc::new(mem), RegistrarConfig::new("load")).await?;
    server.registrar.state().wait_until_ready().await;
    let healthy = RpcClient::connect(ClientConfig::new(server.url(), "load", "healthy"))?;
    let mut watch = healthy.watch(None);
    match watch.next().await {
        Some(Ok(Event::Snapshot(s))) if s.len() == size => {}
        other => return Err(format!("the healthy watcher's snapshot: {other:?}").into()),
    }
    let rss_before = rss_bytes();
    let mut child = tokio::process::Command::new(std::env::current_exe()?)
        .arg("--stuck-client")
        .arg(server.url())
        .arg("--stuck-streams")
        .arg(args.stuck_streams.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let stdout = child.stdout.take().ok_or("the stuck clients' stdout")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(300), lines.next_line()).await??;
    if line.as_deref() != Some("ready") {
        return Err(format!("the stuck clients said {line:?}").into());
    }
    let rss_after = rss_bytes();
    let stats = server.registrar.watch_stats();
    // The healthy watcher still gets every change, in order.
    for i in 0..100u16 {
        let endpoint = Endpoint::new("healthy-check", format!("e{i}"), "127.0.0.1", 9000 + i);
        server.registrar.write(Op::Register(endpoint), None).await?;
    }
    let mut expected = 0u16;
    while expected < 100 {
        match tokio::time::timeout(Duration::from_secs(60), watch.next()).await? {
            Some(Ok(Event::Added { endpoint, .. })) if endpoint.service == "healthy-check" => {
                if endpoint.port != 9000 + expected {
                    return Err(
                        format!("change {expected} arrived as port {}", endpoint.port).into(),
                    );
                }
                expected += 1;
            }
            Some(Ok(_)) => {}
            other => return Err(format!("the healthy watcher: {other:?}").into()),
        }
    }
    drop(child);
    let per_stream =
        rss_after.saturating_sub(rss_before) as f64 / args.stuck_streams as f64 / 1024.0;
    println!(
        "stuck streams: {} streams on {size} endpoints: server RSS {} -> {} MiB, {per_stream:.1} KiB per stream; {} snapshot messages taken by the streams ({:.1} KiB per stream), {} messages encoded; the healthy watcher got 100 of 100 changes in order",
        args.stuck_streams,
        rss_before / (1 << 20),
        rss_after / (1 << 20),
        stats.snapshot_chunks,
        stats.snapshot_bytes as f64 / args.stuck_streams as f64 / 1024.0,
        stats.messages_encoded,
    );
    Ok(per_stream)
}

/// Phase 4: stuck streams on registries of growing size, each size in a
/// fresh process (memory a previous size freed would hide growth).
pub(crate) async fn phase(args: &Args) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let mut baseline = None;
    for size in [0, 5_000, args.stuck_endpoints] {
        let out = tokio::process::Command::new(std::env::current_exe()?)
            .arg("--stuck-size")
            .arg(size.to_string())
            .arg("--stuck-streams")
            .arg(args.stuck_streams.to_string())
            .kill_on_drop(true)
            .output()
            .await?;
        let text = String::from_utf8_lossy(&out.stdout);
        print!("{text}");
        if !out.status.success() {
            return Err(format!(
                "stuck streams at {size} endpoints: {}",
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        let per_stream: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("per-stream-kib "))
            .and_then(|v| v.trim().parse().ok())
            .ok_or("no per-stream figure")?;
        match baseline {
            None => baseline = Some(per_stream),
            Some(b) => println!(
                "stuck streams: at {size} endpoints a stuck stream costs {:.2}x what it costs on an empty registry",
                per_stream / f64::max(b, 0.1)
            ),
        }
    }
    Ok(())
}
