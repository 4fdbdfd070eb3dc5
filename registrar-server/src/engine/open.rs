//! Opening the backend the registrar runs on: one URL, as every program
//! using the toolkit opens its backend ([`waypost_any::open_with`]: each
//! backend crate parses its own URL, and the backend is wrapped in what its
//! capabilities call for). Which backends a build can open is chosen with
//! the cargo features `sqlite`, `etcd`, `dynamodb` and `cloudmap`.

use std::sync::Arc;
use std::time::Duration;

use crate::metrics::names;
use waypost::backend::BackendUrl;
use waypost::liveness::LivenessConfig;
use waypost::polling::PollingConfig;
use waypost::stack::StackConfig;
use waypost::{Error, ErrorKind, Result};

/// What the registrar needs of a backend: batches, a watch and heartbeats
/// ([`waypost::stack::Stack`]). [`open_backend`] wraps each backend
/// as its capabilities call for ([`waypost::stack::stack`]).
pub use waypost::stack::Stack as Backend;

/// The combinators' settings for the registrar's backend: polled every
/// `sync_interval` when it has no watch of its own (with the registrar's
/// metric names), and `liveness` (also the thresholds of backends that
/// keep liveness themselves, and etcd's lease TTL, unless the URL gives
/// them).
pub fn stack_config(liveness: LivenessConfig, sync_interval: Duration) -> StackConfig {
    let polling = PollingConfig::default()
        .with_interval(sync_interval)
        .with_metrics_prefix(names::PREFIX);
    StackConfig::default()
        .with_polling(polling)
        .with_liveness(liveness)
}

/// Open the backend `url` names (`sqlite:PATH`, `etcd://HOST:PORT/PREFIX`,
/// `dynamodb://TABLE?…`, `cloudmap://NAMESPACE?…`, `memory:`) with
/// `stack`'s settings. Errors keep the backend's kind: transient ones
/// (unreachable) are worth a retry, permanent ones (a read-only or corrupt
/// file, a missing table without `create_table=true`, bad credentials) are
/// not; a URL that does not parse, or names a backend this build does not
/// include, is `InvalidInput` naming what is wrong.
pub async fn open_backend(url: &str, stack: &StackConfig) -> Result<Arc<dyn Backend>> {
    let opts = waypost_any::OpenOptions::default().with_stack(stack.clone());
    waypost_any::open_with(url, &opts)
        .await
        .map_err(|e| hint(url, e))
}

/// The scheme of `url` (`sqlite`, `etcd`, …), for messages; `None` when
/// it has none.
pub fn backend_scheme(url: &str) -> Option<String> {
    BackendUrl::parse(url).ok().map(|u| u.scheme().to_string())
}

/// A missing DynamoDB table: the library's hint names its Rust setting; the
/// registrar's user needs the URL's parameter or the flag.
fn hint(url: &str, e: Error) -> Error {
    if e.kind() != ErrorKind::NotFound || backend_scheme(url).as_deref() != Some("dynamodb") {
        return e;
    }
    let table = BackendUrl::parse(url)
        .ok()
        .and_then(|u| u.authority().map(str::to_string))
        .unwrap_or_default();
    Error::not_found(format!(
        "DynamoDB table {table} does not exist; add create_table=true to the registry URL \
         (or start the registrar with --dynamodb-create-table) to create it"
    ))
    .with_source(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn urls_open_or_say_what_is_wrong() {
        let cfg = stack_config(LivenessConfig::default(), Duration::from_secs(5));
        let reg = open_backend("memory:", &cfg).await.expect("memory");
        assert!(reg.list("x").await.expect("list").is_empty());
        let Err(err) = open_backend("mysql://db:3306", &cfg).await else {
            panic!("a mysql URL was not refused");
        };
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.to_string().contains("\"mysql\""), "{err}");
        assert_eq!(backend_scheme("dynamodb://t"), Some("dynamodb".into()));
        assert_eq!(backend_scheme("registry.db"), None);
    }

    #[test]
    fn a_missing_table_names_the_parameter_and_the_flag() {
        let e = hint("dynamodb://orders?region=x", Error::not_found("no table"));
        let msg = e.to_string();
        assert!(msg.contains("orders") && msg.contains("create_table=true"), "{msg}");
        assert!(msg.contains("--dynamodb-create-table"), "{msg}");
        let other = hint("sqlite:r.db", Error::not_found("gone"));
        assert_eq!(other.to_string(), Error::not_found("gone").to_string());
    }
}
