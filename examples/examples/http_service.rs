//! An HTTP service (axum) that announces itself in a SQLite registry and
//! leaves it when it shuts down: on Ctrl-C, on SIGTERM, or — so that the
//! example finishes by itself — after 3 s. The registry is left before the
//! server stops accepting requests.
//!
//! Run with `cargo run --example http_service`.

use std::sync::Arc;
use std::time::Duration;

use waypost::announce::{announce, AnnounceConfig};
use waypost::{Endpoint, Protocol, Registry};
use waypost_sqlite::SqliteRegistry;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Ctrl-C, SIGTERM, or `after`.
async fn shutdown_signal(after: Duration) {
    let term = async {
        #[cfg(unix)]
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
            return;
        }
        std::future::pending::<()>().await
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => println!("Ctrl-C"),
        () = term => println!("SIGTERM"),
        () = tokio::time::sleep(after) => println!("{after:?} passed"),
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    // One line with the causes, not the error's Debug dump.
    examples::report(run().await)
}

/// The example; `main` reports its error.
async fn run() -> Result<(), BoxError> {
    let dir = tempfile::tempdir()?;
    let registry = Arc::new(SqliteRegistry::open_path(dir.path().join("registry.db")).await?);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new().route("/", axum::routing::get(|| async { "hello\n" }));

    let me = Endpoint::new(
        "hello",
        format!("pid-{}", std::process::id()),
        "127.0.0.1",
        addr.port(),
    )
    .with_protocol(Protocol::Http)
    .with_node("this-host");
    let announced = announce(Arc::clone(&registry), vec![me], AnnounceConfig::default())?;
    announced.registered().await;
    println!(
        "serving on http://{addr}, registered as {:?}",
        registry
            .list("hello")
            .await?
            .iter()
            .map(|e| e.key().to_string())
            .collect::<Vec<_>>()
    );

    // Leave the registry first, then stop serving.
    axum::serve(listener, app)
        .with_graceful_shutdown(announced.leave_on(shutdown_signal(Duration::from_secs(3))))
        .await?;
    let left = registry.list("hello").await?;
    println!(
        "stopped; endpoints of \"hello\" in the registry now: {}",
        left.len()
    );
    if !left.is_empty() {
        return Err("the service did not leave the registry".into());
    }
    Ok(())
}
