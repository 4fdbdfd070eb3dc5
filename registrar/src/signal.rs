//! The signals that stop `serve` and `watch` gracefully.

/// Resolves on Ctrl-C or SIGTERM. The handlers are installed when this is
/// called, not when the future is first polled: a signal sent as soon as
/// the registrar says it listens is then a graceful stop, never the
/// default action that kills the process without draining.
pub(crate) fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    let mut signals = {
        use tokio::signal::unix::{signal, SignalKind};
        [SignalKind::interrupt(), SignalKind::terminate()].map(|kind| signal(kind).ok())
    };
    async move {
        #[cfg(unix)]
        {
            let [interrupt, terminate] = &mut signals;
            tokio::select! {
                () = received(interrupt) => {}
                () = received(terminate) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutdown signal received");
    }
}

/// Resolves when `signal` arrives; never when it could not be installed.
#[cfg(unix)]
async fn received(signal: &mut Option<tokio::signal::unix::Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => futures::future::pending::<()>().await,
    }
}
