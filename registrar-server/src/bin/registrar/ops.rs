//! The operator commands: `ls`, `watch`, `register`, `deregister`.

use std::time::Duration;

use futures::StreamExt;
use registry_api::{Endpoint, EndpointKey, Event, Health, Registry, Watch};
use registry_registrar::{Ack, ClientConfig, RpcClient};

use crate::cli::{Cli, DeregisterArgs, LsArgs, RegisterArgs, WatchArgs};

/// A plain client of the registrar at `--address`.
fn client(cli: &Cli, ack: Option<Ack>) -> Result<RpcClient, String> {
    let mut cfg = ClientConfig::new(cli.address.clone(), "operator", "registrar-cli")
        .with_timeouts(Duration::from_secs(5), Duration::from_secs(10));
    if let Some(ack) = ack {
        cfg = cfg.with_ack(ack);
    }
    if let Some(files) = cli.tls.client_files()? {
        cfg = cfg.with_tls(files);
    }
    RpcClient::connect(cfg).map_err(|e| format!("registrar {}: {e}", cli.address))
}

fn endpoint_line(e: &Endpoint) -> String {
    let labels: Vec<String> = e.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(
        "{}/{} {} {} cluster={} node={} {}{}{}",
        e.service,
        e.id,
        host_port(e),
        e.protocol.as_str(),
        e.cluster,
        if e.node.is_empty() { "-" } else { &e.node },
        e.health.as_str(),
        if labels.is_empty() { "" } else { " " },
        labels.join(",")
    )
}

fn host_port(e: &Endpoint) -> String {
    if e.address.contains(':') {
        format!("[{}]:{}", e.address, e.port)
    } else {
        format!("{}:{}", e.address, e.port)
    }
}

fn json(v: &serde_json::Value) -> Result<String, String> {
    serde_json::to_string(v).map_err(|e| format!("cannot encode JSON: {e}"))
}

pub async fn run_ls(cli: &Cli, args: &LsArgs) -> Result<(), String> {
    let raw = client(cli, None)?;
    let snap = raw.snapshot().await.map_err(|e| format!("ls: {e}"))?;
    let eps: Vec<Endpoint> = snap
        .iter()
        .filter(|e| args.service.as_ref().is_none_or(|s| &e.service == s))
        .filter(|e| args.cluster.as_ref().is_none_or(|c| &e.cluster == c))
        .filter(|e| args.node.as_ref().is_none_or(|n| &e.node == n))
        .cloned()
        .collect();
    if args.json {
        for e in &eps {
            let line = serde_json::to_string(e).map_err(|e| format!("cannot encode JSON: {e}"))?;
            println!("{line}");
        }
        return Ok(());
    }
    let rows: Vec<[String; 8]> = eps
        .iter()
        .map(|e| {
            [
                e.service.clone(),
                e.id.clone(),
                host_port(e),
                e.protocol.as_str().to_string(),
                e.cluster.clone(),
                if e.node.is_empty() {
                    "-".into()
                } else {
                    e.node.clone()
                },
                e.health.as_str().to_string(),
                e.labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(","),
            ]
        })
        .collect();
    let header = [
        "SERVICE", "ID", "ADDRESS", "PROTOCOL", "CLUSTER", "NODE", "HEALTH", "LABELS",
    ]
    .map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    for r in std::iter::once(&header).chain(&rows) {
        let line: Vec<String> = r
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
    if rows.is_empty() {
        eprintln!(
            "(no endpoints at {} version {})",
            raw.address(),
            snap.version()
        );
    }
    Ok(())
}

/// One event as a line of text or JSON.
fn event_line(ev: &Event, as_json: bool) -> Result<String, String> {
    if as_json {
        let v = match ev {
            Event::Snapshot(s) => serde_json::json!({
                "type": "snapshot",
                "version": s.version().0,
                "endpoints": s.iter().collect::<Vec<_>>(),
            }),
            Event::Added { version, endpoint } => {
                serde_json::json!({"type": "added", "version": version.0, "endpoint": endpoint})
            }
            Event::Updated { version, endpoint } => {
                serde_json::json!({"type": "updated", "version": version.0, "endpoint": endpoint})
            }
            Event::Removed { version, key } => serde_json::json!({
                "type": "removed",
                "version": version.0,
                "service": key.service,
                "id": key.id,
            }),
        };
        return json(&v);
    }
    Ok(match ev {
        Event::Snapshot(s) => {
            let mut out = format!("snapshot v{}: {} endpoints", s.version(), s.len());
            for e in s.iter() {
                out.push_str("\n  ");
                out.push_str(&endpoint_line(e));
            }
            out
        }
        Event::Added { version, endpoint } => {
            format!("added   v{version} {}", endpoint_line(endpoint))
        }
        Event::Updated { version, endpoint } => {
            format!("updated v{version} {}", endpoint_line(endpoint))
        }
        Event::Removed { version, key } => format!("removed v{version} {key}"),
    })
}

pub async fn run_watch(cli: &Cli, args: &WatchArgs) -> Result<(), String> {
    let raw = client(cli, None)?;
    let mut stream = raw.watch(None);
    let deadline = args.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut seen = 0u64;
    while args.count.is_none_or(|n| seen < n) {
        let next = match deadline {
            Some(d) => match tokio::time::timeout_at(d, stream.next()).await {
                Ok(n) => n,
                Err(_) => return Ok(()),
            },
            None => stream.next().await,
        };
        match next {
            Some(Ok(ev)) => {
                println!("{}", event_line(&ev, args.json)?);
                seen += 1;
            }
            Some(Err(e)) => return Err(format!("watch: {e}")),
            None => {
                return Err(format!(
                    "watch: registrar {} ended the stream",
                    raw.address()
                ))
            }
        }
    }
    Ok(())
}

pub async fn run_register(cli: &Cli, args: &RegisterArgs) -> Result<(), String> {
    let (host, port) = args.target.clone();
    let mut ep = Endpoint::new(args.service.clone(), args.id.clone(), host, port)
        .with_protocol(args.protocol)
        .with_cluster(args.cluster.clone())
        .with_node(args.node.clone());
    if args.unhealthy {
        ep = ep.with_health(Health::Unhealthy);
    }
    for (k, v) in &args.labels {
        ep = ep.with_label(k.clone(), v.clone());
    }
    ep.validate().map_err(|e| format!("register: {e}"))?;
    let raw = client(cli, args.ack)?;
    let line = endpoint_line(&ep);
    raw.register(ep)
        .await
        .map_err(|e| format!("register: {e}"))?;
    println!("registered {line}");
    Ok(())
}

pub async fn run_deregister(cli: &Cli, args: &DeregisterArgs) -> Result<(), String> {
    let key = EndpointKey::new(args.service.clone(), args.id.clone());
    let raw = client(cli, args.ack)?;
    raw.deregister(&key)
        .await
        .map_err(|e| format!("deregister: {e}"))?;
    println!("deregistered {key}");
    Ok(())
}
