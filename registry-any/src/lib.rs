#![doc = include_str!("../README.md")]

use std::sync::Arc;

use waypost::backend::BackendUrl;
use waypost::memory::MemoryRegistry;
use waypost::stack::{stack, Stack, StackConfig};
use waypost::{Error, Result};

/// Every scheme [`open`] knows, with the feature that compiles it in.
pub const SCHEMES: &[(&str, &str)] = &[
    ("memory", ""),
    ("sqlite", "sqlite"),
    ("etcd", "etcd"),
    ("etcds", "etcd"),
    ("dynamodb", "dynamodb"),
    ("cloudmap", "cloudmap"),
    ("registrar", "registrar"),
    ("registrars", "registrar"),
    ("gossip", "gossip"),
];

/// Settings that do not belong in a URL.
#[non_exhaustive]
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// The combinators' settings ([`waypost::stack::stack`]): how
    /// backends without a watch are polled, and liveness. Its liveness
    /// thresholds are also those of backends that keep liveness
    /// themselves (SQLite, DynamoDB, Cloud Map; etcd's lease TTL is
    /// `suspect_after`), and its polling interval DynamoDB's, unless the
    /// URL gives them.
    pub stack: StackConfig,
    /// The agent's node for a `registrar://` URL without `node=`.
    pub node: Option<String>,
}

impl OpenOptions {
    /// Set `stack`.
    pub fn with_stack(mut self, stack: StackConfig) -> Self {
        self.stack = stack;
        self
    }

    /// Set `node`.
    pub fn with_node(mut self, node: impl Into<String>) -> Self {
        self.node = Some(node.into());
        self
    }
}

/// Open the backend `url` names, with the default [`OpenOptions`].
pub async fn open(url: &str) -> Result<Arc<dyn Stack>> {
    open_with(url, &OpenOptions::default()).await
}

/// Open the backend `url` names; see the crate documentation.
pub async fn open_with(url: &str, opts: &OpenOptions) -> Result<Arc<dyn Stack>> {
    let parsed = BackendUrl::parse(url)?;
    let scheme = parsed.scheme().to_string();
    match scheme.as_str() {
        "memory" => {
            if !parsed.opaque()?.is_empty() {
                return Err(Error::invalid(
                    "registry URL",
                    format!("{parsed}: expected memory: alone"),
                ));
            }
            parsed.finish()?;
            stack(MemoryRegistry::new(), &opts.stack)
        }
        #[cfg(feature = "sqlite")]
        "sqlite" => {
            let mut cfg: waypost_sqlite::SqliteConfig = url.parse()?;
            let live = &opts.stack.liveness;
            if !parsed.has("suspect_after") {
                cfg.suspect_after = live.suspect_after;
            }
            if !parsed.has("remove_after") {
                cfg.remove_after = live.remove_after.max(cfg.suspect_after);
            }
            if !parsed.has("sweep_interval") {
                cfg.sweep_interval = Some(live.sweep_interval);
            }
            stack(
                waypost_sqlite::SqliteRegistry::open(cfg).await?,
                &opts.stack,
            )
        }
        #[cfg(feature = "etcd")]
        "etcd" | "etcds" => {
            let mut cfg: waypost_etcd::EtcdConfig = url.parse()?;
            if !parsed.has("lease_ttl") {
                cfg = cfg.with_lease_ttl(opts.stack.liveness.suspect_after);
            }
            stack(waypost_etcd::EtcdRegistry::connect(cfg).await?, &opts.stack)
        }
        #[cfg(feature = "dynamodb")]
        "dynamodb" => {
            let mut cfg: waypost_dynamodb::DynamoDbConfig = url.parse()?;
            cfg.liveness = with_liveness(&parsed, cfg.liveness, opts);
            if !parsed.has("poll_interval") {
                cfg.poll_interval = opts.stack.polling.interval;
            }
            stack(
                waypost_dynamodb::DynamoDbRegistry::connect(cfg).await?,
                &opts.stack,
            )
        }
        #[cfg(feature = "cloudmap")]
        "cloudmap" => {
            let mut cfg: waypost_cloudmap::CloudMapConfig = url.parse()?;
            cfg.liveness = with_liveness(&parsed, cfg.liveness, opts);
            stack(
                waypost_cloudmap::CloudMapRegistry::connect(cfg).await?,
                &opts.stack,
            )
        }
        #[cfg(feature = "registrar")]
        "registrar" | "registrars" => {
            let cfg: waypost_registrar_client::ClientConfig = match &opts.node {
                Some(node) if !parsed.has("node") => with_param(url, "node", node).parse()?,
                _ => url.parse()?,
            };
            stack(
                waypost_registrar_client::RegistrarClient::connect(cfg)?,
                &opts.stack,
            )
        }
        #[cfg(feature = "gossip")]
        "gossip" => {
            let cfg: waypost_gossip::GossipConfig = url.parse()?;
            stack(
                waypost_gossip::GossipRegistry::start(cfg).await?,
                &opts.stack,
            )
        }
        other => Err(not_compiled_in(other, &parsed)),
    }
}

/// The liveness of the URL where it gives it, else the options'.
#[cfg(any(feature = "dynamodb", feature = "cloudmap"))]
fn with_liveness(
    parsed: &BackendUrl,
    from_url: waypost::liveness::LivenessConfig,
    opts: &OpenOptions,
) -> waypost::liveness::LivenessConfig {
    let live = &opts.stack.liveness;
    let mut cfg = from_url;
    if !parsed.has("suspect_after") {
        cfg.suspect_after = live.suspect_after;
    }
    if !parsed.has("remove_after") {
        cfg.remove_after = live.remove_after.max(cfg.suspect_after);
    }
    if !parsed.has("sweep_interval") {
        cfg.sweep_interval = live.sweep_interval;
    }
    cfg
}

/// `url` with `name=value` added to its query.
#[cfg(feature = "registrar")]
fn with_param(url: &str, name: &str, value: &str) -> String {
    let value = percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC);
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{name}={value}")
}

/// The error for a scheme this build cannot open.
fn not_compiled_in(scheme: &str, url: &BackendUrl) -> Error {
    match SCHEMES.iter().find(|(s, _)| *s == scheme) {
        Some((_, feature)) => Error::invalid(
            "registry URL",
            format!(
                "{url}: the {scheme} backend is not compiled in: turn on the feature \
                 `{feature}` of waypost-any"
            ),
        ),
        None => {
            let known: Vec<&str> = SCHEMES.iter().map(|(s, _)| *s).collect();
            Error::invalid(
                "registry URL",
                format!(
                    "scheme {} is not a registry backend: expected one of {}",
                    waypost::backend::quote(scheme),
                    known.join(", ")
                ),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error of an open that must fail.
    fn refused(r: Result<Arc<dyn Stack>>) -> Error {
        match r {
            Ok(_) => panic!("opened, but it should have been refused"),
            Err(e) => e,
        }
    }

    #[tokio::test]
    async fn memory_and_unknown_schemes() {
        let reg = open("memory:").await.expect("memory");
        assert!(reg.list("x").await.expect("list").is_empty());
        let msg = |e: Error| e.to_string();
        let e = msg(refused(open("memory:x").await));
        assert!(e.contains("memory: alone"), "{e}");
        let e = msg(refused(open("consul://127.0.0.1:8500").await));
        assert!(
            e.contains("\"consul\"") && e.contains("sqlite, etcd"),
            "{e}"
        );
        let e = msg(refused(open("registry.db").await));
        assert!(e.contains("no scheme"), "{e}");
    }

    #[cfg(not(feature = "gossip"))]
    #[tokio::test]
    async fn a_backend_not_compiled_in_names_its_feature() {
        let e = refused(open("gossip://127.0.0.1:0").await);
        assert!(e.to_string().contains("feature `gossip`"), "{e}");
    }

    #[cfg(feature = "registrar")]
    #[test]
    fn the_node_is_added_encoded() {
        assert_eq!(
            with_param("registrar://r:1?cluster=eu", "node", "a b"),
            "registrar://r:1?cluster=eu&node=a%20b"
        );
        assert_eq!(
            with_param("registrar://r:1", "node", "n"),
            "registrar://r:1?node=n"
        );
    }
}
