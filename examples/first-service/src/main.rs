//! `first-service`: run one instance; run two to see them find each other.
//!
//! ```text
//! REGISTRY=sqlite:/tmp/hello.db INSTANCE_ID=a cargo run -p first-service
//! REGISTRY=sqlite:/tmp/hello.db INSTANCE_ID=b cargo run -p first-service
//! ```

use std::time::Duration;

use first_service::{open, start, BoxError, Settings};

/// Ctrl-C or SIGTERM (what Kubernetes sends before it kills a pod).
async fn shutdown_signal() {
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
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let settings = Settings::from_env()?;
    let registry = open(&settings.registry, &settings.node).await?;
    let service = start(registry, &settings).await?;
    println!(
        "{} serves gRPC on {} and HTTP on {}, announced on node {}",
        settings.id, service.grpc, service.http, settings.node
    );
    let signal = shutdown_signal();
    tokio::pin!(signal);
    let mut every = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            () = &mut signal => break,
            _ = every.tick() => match service.call_peer().await {
                Ok(status) => println!("a peer answers: {status}"),
                Err(e) => println!("no peer answers yet: {e}"),
            },
        }
    }
    service.stop().await?;
    println!("left the registry and stopped");
    Ok(())
}
