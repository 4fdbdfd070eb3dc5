//! `registrar`: the registrar server and its operator commands.

mod backend;
mod cli;
mod connect;
mod error;
mod ops;
mod output;
mod signal;
mod values;

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use tokio::net::TcpListener;
use waypost_registrar_server::{
    backend_scheme, open_backend, stack_config, AuthzConfig, OpenPolicy, Opening, ServeOptions,
    Status,
};

use crate::cli::{Cli, Command, LogFormat, ServeArgs};
use crate::error::CliError;
use crate::signal::shutdown_signal;

fn install_metrics() -> Result<metrics_exporter_prometheus::PrometheusHandle, String> {
    waypost_registrar_server::install_prometheus_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))
}

async fn run_serve(args: ServeArgs) -> Result<(), CliError> {
    let url = args.backend.registry_url()?;
    let stack = stack_config(args.liveness()?, args.sync_interval);
    let scheme = backend_scheme(&url).unwrap_or_default();
    // The product's name, for messages (`DynamoDB backend`).
    let kind = crate::backend::product_name(&scheme).to_string();
    // The URL as logs may show it: secrets replaced.
    let shown = waypost::backend::BackendUrl::parse(&url)
        .map(|u| u.to_string())
        .unwrap_or_default();
    if scheme == "memory" {
        tracing::warn!(
            "the in-memory backend keeps nothing: every write is lost when the registrar exits \
             (without --registry=memory: it runs on SQLite, --registry=sqlite:PATH)"
        );
    }
    let options = serve_options(&args)?;
    let cfg = args.registrar_config();
    cfg.validate().map_err(|e| e.to_string())?;
    let metrics = install_metrics()?;
    let (grpc, health, mut listening) = listen(&args, options.tls.is_some()).await?;
    let mut server = Opening::new(cfg);
    bind_protocols(&args, &mut server, &mut listening).await?;
    server.policy = if args.fail_fast {
        OpenPolicy::FailFast
    } else {
        OpenPolicy::Retry
    };
    server.options = options;
    server.metrics = Some(metrics);
    fail_on_panic(Arc::clone(server.status()));
    if let Some(after) = args.test_panic_after {
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            panic!("injected by --test-panic-after");
        });
    }
    tracing::info!(
        backend = %shown,
        cluster = %args.cluster_name,
        ack = args.ack.as_str(),
        tls = server.options.tls.is_some(),
        "registrar starting"
    );
    // Before the line that says it listens: a signal from then on stops
    // it gracefully.
    let shutdown = shutdown_signal();
    // One line for scripts and tests to read the bound addresses from.
    println!("{listening}");
    server
        .serve(
            || {
                let (url, stack, kind) = (url.clone(), stack.clone(), kind.clone());
                async move {
                    open_backend(&url, &stack).await.map_err(|e| {
                        tracing::warn!(error = %e, "cannot open the {kind} backend");
                        e
                    })
                }
            },
            grpc,
            health,
            shutdown,
        )
        .await
        .map_err(|e| CliError::registry(format!("{kind} backend"), e))
}

/// The serving options the flags ask for (TLS, authorization, limits,
/// keepalives, the dashboard), checked.
fn serve_options(args: &ServeArgs) -> Result<ServeOptions, CliError> {
    let tls_files = args.tls.files()?;
    let authz = args.trust_domain.as_ref().map(|td| {
        let base = AuthzConfig::new(td.clone()).with_id_pattern(args.spiffe_id_pattern.clone());
        let base = match &args.authz_policy {
            Some(path) => base.with_policy_file(path),
            None => base,
        };
        args.admin_ids
            .iter()
            .fold(base, |a, id| a.with_admin(id.clone()))
    });
    let mut options = ServeOptions::default()
        .with_max_request_bytes(args.max_request_bytes)
        .with_http2_keepalive(
            Some(args.http2_keepalive_interval),
            args.http2_keepalive_timeout,
        )
        .with_tcp_keepalive(Some(args.tcp_keepalive))
        .with_ui(args.ui);
    if let Some(files) = tls_files {
        options = options.with_tls(files);
    }
    if let Some(authz) = authz {
        options = options.with_authz(authz);
    }
    if args.insecure {
        options = options.allow_insecure();
    }
    if args.allow_any_certificate {
        options = options.allow_any_certificate();
    }
    options.check().map_err(|e| e.to_string())?;
    if args.ui {
        tracing::warn!(
            addr = %args.health_addr,
            "serving the dashboard at /ui on the health port, which has no authentication: \
             anyone who can reach it can read every endpoint"
        );
    }
    Ok(options)
}

/// Bind the gRPC port (by default on every address with TLS, on loopback
/// without) and the health port; the start of the `listening` line with
/// the addresses bound.
async fn listen(
    args: &ServeArgs,
    tls: bool,
) -> Result<(TcpListener, TcpListener, String), CliError> {
    let grpc_addr = args.grpc_addr(tls);
    let grpc = TcpListener::bind(grpc_addr)
        .await
        .map_err(|e| format!("cannot listen on {grpc_addr} (gRPC): {e}"))?;
    let health = TcpListener::bind(args.health_addr)
        .await
        .map_err(|e| format!("cannot listen on {} (health): {e}", args.health_addr))?;
    let grpc_addr = grpc.local_addr().map_err(|e| e.to_string())?;
    let health_addr = health.local_addr().map_err(|e| e.to_string())?;
    let listening = format!("registrar listening grpc={grpc_addr} health={health_addr}");
    Ok((grpc, health, listening))
}

/// Bind the listeners of the HTTP API, DNS and xDS the flags ask for into
/// `server`, adding their addresses to the `listening` line.
async fn bind_protocols(
    args: &ServeArgs,
    server: &mut Opening,
    listening: &mut String,
) -> Result<(), CliError> {
    #[cfg(feature = "http-api")]
    if let Some(addr) = args.http_api_addr {
        let l = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr} (HTTP API): {e}"))?;
        let bound = l.local_addr().map_err(|e| e.to_string())?;
        listening.push_str(&format!(" http-api={bound}"));
        server.protocols.http_api = Some(l);
    }
    #[cfg(feature = "dns")]
    if let Some(addr) = args.dns_addr {
        let config = waypost_registrar_server::DnsConfig::new(&args.dns_domain, args.dns_ttl)
            .map_err(|e| e.to_string())?;
        let l = waypost_registrar_server::DnsListeners::bind(addr)
            .await
            .map_err(|e| e.to_string())?;
        let bound = l.local_addr().map_err(|e| e.to_string())?;
        listening.push_str(&format!(" dns={bound}"));
        server.protocols.dns = Some((l, config));
    }
    #[cfg(feature = "xds")]
    if let Some(addr) = args.xds_addr {
        let l = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr} (xDS): {e}"))?;
        let bound = l.local_addr().map_err(|e| e.to_string())?;
        listening.push_str(&format!(" xds={bound}"));
        server.protocols.xds = Some(l);
    }
    let _ = (args, server, listening);
    Ok(())
}

/// A panic anywhere (a background task included) makes the registrar not
/// ready; it then drains what it can and exits non-zero.
fn fail_on_panic(status: Arc<Status>) {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        previous(info);
        status.fail(format!("panic: {info}"));
    }));
}

/// Logs to stderr, as text or JSON lines, at `RUST_LOG`'s levels (default
/// `default_level`).
fn init_logging(format: LogFormat, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
}

/// Exit as clap does on a conflict when `serve` is given a client
/// command's option, or a backend's flag beside another backend.
fn check_serve_flags(cli: &Cli) {
    let Command::Serve(args) = &cli.command else {
        return;
    };
    use clap::CommandFactory;
    let conflict = match cli.early.first_given() {
        Some(flag) => Some(format!(
            "{flag} is an option of the client commands, not of `serve`"
        )),
        None => args.backend.registry_url().err(),
    };
    if let Some(message) = conflict {
        Cli::command()
            .error(clap::error::ErrorKind::ArgumentConflict, message)
            .exit();
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    check_serve_flags(&cli);
    let default_level = match cli.command {
        Command::Serve(_) => "info",
        _ => "warn",
    };
    init_logging(cli.log_format, default_level);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("registrar: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match &cli.command {
            Command::Serve(args) => run_serve(ServeArgs::clone(args)).await,
            Command::Ls(args) => ops::run_ls(&cli, args).await,
            Command::Watch(args) => ops::run_watch(&cli, args).await,
            Command::Register(args) => ops::run_register(&cli, args).await,
            Command::Heartbeat(args) => ops::run_heartbeat(&cli, args).await,
            Command::Deregister(args) => ops::run_deregister(&cli, args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("registrar: {}", error::report(&e, cli.verbose));
            ExitCode::FAILURE
        }
    }
}
