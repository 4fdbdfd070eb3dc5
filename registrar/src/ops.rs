//! The operator commands: `ls`, `watch`, `register` (once, or kept alive),
//! `heartbeat` and `deregister`.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use waypost::announce::{announce, AnnounceConfig, AnnounceStatus};
use waypost::{Endpoint, EndpointKey, Event, Health, Heartbeat, Registry, Version, Watch};
use waypost_registrar_client::{Ack, ClientConfig, RpcClient, Token};

use crate::cli::{Cli, DeregisterArgs, HeartbeatArgs, LsArgs, Output, RegisterArgs, WatchArgs};
use crate::connect::ClientArgs;
use crate::error::CliError;
use crate::output::{document, endpoint_line, table};

/// A plain client of the registrar at `--address` (a scheme added when it
/// has none), the command's flags completed by those before its name.
fn client(cli: &Cli, args: &ClientArgs, ack: Option<Ack>) -> Result<RpcClient, CliError> {
    let args = args.or(&cli.early);
    let address = args.url();
    let mut cfg = ClientConfig::new(address.clone(), "operator", "registrar-cli")
        .with_timeouts(Duration::from_secs(5), Duration::from_secs(10));
    if let Some(ack) = ack {
        cfg = cfg.with_ack(ack);
    }
    if let Some(files) = args.files()? {
        cfg = cfg.with_tls(files);
    }
    RpcClient::connect(cfg).map_err(|e| CliError::registry(format!("registrar {address}"), e))
}

fn json(v: &serde_json::Value) -> Result<String, CliError> {
    serde_json::to_string(v).map_err(|e| CliError::Message(format!("cannot encode JSON: {e}")))
}

/// `ls`: the endpoints, filtered, as a table or one document.
pub async fn run_ls(cli: &Cli, args: &LsArgs) -> Result<(), CliError> {
    let raw = client(cli, &args.client, None)?;
    let snap = raw
        .snapshot()
        .await
        .map_err(|e| CliError::registry("ls", e))?;
    let eps: Vec<Endpoint> = snap
        .iter()
        .filter(|e| args.service.as_ref().is_none_or(|s| &e.service == s))
        .filter(|e| args.cluster.as_ref().is_none_or(|c| &e.cluster == c))
        .filter(|e| args.node.as_ref().is_none_or(|n| &e.node == n))
        .cloned()
        .collect();
    if args.json {
        for e in &eps {
            let v = serde_json::to_value(e)
                .map_err(|e| CliError::Message(format!("cannot encode JSON: {e}")))?;
            println!("{}", json(&v)?);
        }
        return Ok(());
    }
    match args.output {
        Output::Table | Output::Wide => {
            print!("{}", table(&eps, args.output == Output::Wide));
            if eps.is_empty() {
                eprintln!(
                    "(no endpoints at {} version {})",
                    raw.address(),
                    snap.version()
                );
            }
        }
        format => {
            // ListAllEndpoints carries no epoch of its own; the version is
            // the sequence (resume from a watch's token instead).
            let version = snap.version().to_string();
            print!("{}", document(&eps, &version, format)?);
        }
    }
    Ok(())
}

/// The resume token of `version` on `raw`'s registrar.
fn token(raw: &RpcClient, version: Version) -> String {
    match raw.epoch() {
        Some(epoch) => Token { epoch, version }.to_string(),
        None => version.to_string(),
    }
}

/// One event as a line of text or JSON; JSON carries the resume token.
fn event_line(raw: &RpcClient, ev: &Event, as_json: bool) -> Result<String, CliError> {
    if as_json {
        let v = match ev {
            Event::Snapshot(s) => serde_json::json!({
                "type": "snapshot",
                "version": token(raw, s.version()),
                "endpoints": s.iter().collect::<Vec<_>>(),
            }),
            Event::Added { version, endpoint } => serde_json::json!({
                "type": "added", "version": token(raw, *version), "endpoint": endpoint,
            }),
            Event::Updated { version, endpoint } => serde_json::json!({
                "type": "updated", "version": token(raw, *version), "endpoint": endpoint,
            }),
            Event::Removed { version, key } => serde_json::json!({
                "type": "removed",
                "version": token(raw, *version),
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

/// `watch`: a snapshot (or the changes since `--from`), then every change.
pub async fn run_watch(cli: &Cli, args: &WatchArgs) -> Result<(), CliError> {
    let raw = client(cli, &args.client, None)?;
    let mut stream = match args.from {
        Some(t) => raw.watch_from(t),
        None => raw.watch(None),
    };
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
                println!("{}", event_line(&raw, &ev, args.json)?);
                seen += 1;
            }
            Some(Err(e)) => return Err(CliError::registry("watch", e)),
            None => {
                return Err(CliError::Message(format!(
                    "watch: registrar {} ended the stream",
                    raw.address()
                )))
            }
        }
    }
    Ok(())
}

/// The endpoint `register` describes.
fn endpoint(args: &RegisterArgs) -> Result<Endpoint, CliError> {
    let (host, port) = args.target.clone();
    let mut ep = Endpoint::new(args.service.clone(), args.id.clone(), host, port)
        .with_protocol(args.protocol)
        // Without --cluster, none: the registrar writes its own.
        .with_cluster(args.cluster.clone().unwrap_or_default())
        .with_node(args.node.clone());
    if args.unhealthy {
        ep = ep.with_health(Health::Unhealthy);
    }
    for (k, v) in &args.labels {
        ep = ep.with_label(k.clone(), v.clone());
    }
    ep.validate()
        .map_err(|e| CliError::registry("register", e))?;
    Ok(ep)
}

/// `register`: once, or kept alive until a shutdown signal.
pub async fn run_register(cli: &Cli, args: &RegisterArgs) -> Result<(), CliError> {
    let ep = endpoint(args)?;
    let raw = client(cli, &args.client, args.ack)?;
    if args.keep_alive {
        return keep_alive(raw, ep, args.heartbeat_every).await;
    }
    let line = endpoint_line(&ep);
    raw.register(ep)
        .await
        .map_err(|e| CliError::registry("register", e))?;
    println!("registered {line}");
    if !args.node.is_empty() {
        eprintln!(
            "note: on backends with leases or liveness (etcd, SQLite) node {} must heartbeat \
             (`registrar heartbeat {}` or `register --keep-alive`), or the endpoint expires",
            args.node, args.node
        );
    }
    Ok(())
}

/// `register --keep-alive`: registered, heartbeated every `every`,
/// registered again when the registry forgot it, deregistered on Ctrl-C
/// or SIGTERM (through [`waypost::announce`]).
async fn keep_alive(raw: RpcClient, ep: Endpoint, every: Duration) -> Result<(), CliError> {
    let line = endpoint_line(&ep);
    let key = ep.key();
    let cfg = AnnounceConfig::default().with_heartbeat_every(every);
    let announced = announce(Arc::new(raw), vec![ep], cfg)
        .map_err(|e| CliError::registry("register --keep-alive", e))?;
    let mut status = announced.status();
    let stop = crate::signal::shutdown_signal();
    tokio::pin!(stop);
    let mut registered_once = false;
    loop {
        tokio::select! {
            () = &mut stop => break,
            changed = status.changed() => {
                if changed.is_err() {
                    break;
                }
                match &*status.borrow_and_update() {
                    AnnounceStatus::Registered { .. } if !registered_once => {
                        registered_once = true;
                        println!("registered {line} (keeping it alive; Ctrl-C to deregister)");
                    }
                    AnnounceStatus::Retrying { error, .. } => {
                        eprintln!("registrar: {key}: retrying: {}", crate::error::report(error, false));
                    }
                    _ => {}
                }
            }
        }
    }
    announced
        .shutdown()
        .await
        .map_err(|e| CliError::registry(format!("deregister {key}"), e))?;
    println!("deregistered {key}");
    Ok(())
}

/// `heartbeat`: one heartbeat of a node.
pub async fn run_heartbeat(cli: &Cli, args: &HeartbeatArgs) -> Result<(), CliError> {
    let raw = client(cli, &args.client, None)?;
    raw.heartbeat(&args.node)
        .await
        .map_err(|e| CliError::registry(format!("heartbeat {}", args.node), e))?;
    println!("heartbeat {}", args.node);
    Ok(())
}

/// `deregister`: remove one endpoint.
pub async fn run_deregister(cli: &Cli, args: &DeregisterArgs) -> Result<(), CliError> {
    let key = EndpointKey::new(args.service.clone(), args.id.clone());
    let raw = client(cli, &args.client, args.ack)?;
    raw.deregister(&key)
        .await
        .map_err(|e| CliError::registry("deregister", e))?;
    println!("deregistered {key}");
    Ok(())
}
