//! `gossip://` URLs ([`GossipConfig`]'s `FromStr`).

use std::net::SocketAddr;
use std::str::FromStr;

use waypost::backend::{quote, BackendUrl};
use waypost::{Error, Result};

use crate::config::GossipConfig;

/// What a gossip URL looks like, for errors.
const FORM: &str = "gossip://BIND_HOST:PORT[?seeds=HOST:PORT,HOST:PORT&node=NAME]";

fn addr(s: &str, what: &str) -> Result<SocketAddr> {
    s.parse().map_err(|_| {
        Error::invalid(
            "registry URL",
            format!("{what} {}: expected IP:PORT", quote(s)),
        )
    })
}

impl FromStr for GossipConfig {
    type Err = Error;

    /// `gossip://IP:PORT` (the UDP address to bind), with the parameters
    /// `seeds` (`IP:PORT` of nodes to join through, separated by `,`),
    /// `node` (this node's name), `key` (the shared key of an
    /// authenticated cluster, in hex; never shown) and `max_clock_skew`,
    /// `probe_period` (durations such as `1s`).
    ///
    /// ```
    /// use waypost_gossip::GossipConfig;
    /// let cfg: GossipConfig = "gossip://127.0.0.1:7946?seeds=127.0.0.1:7947&node=a".parse().unwrap();
    /// assert_eq!(cfg.bind.port(), 7946);
    /// assert_eq!(cfg.seeds.len(), 1);
    /// assert_eq!(cfg.node_name.as_deref(), Some("a"));
    /// ```
    fn from_str(s: &str) -> Result<Self> {
        let mut url = BackendUrl::parse(s)?;
        url.expect_scheme("gossip", FORM)?;
        let hosts = url.hosts()?;
        let [bind] = hosts.as_slice() else {
            return Err(Error::invalid(
                "registry URL",
                format!("{url}: one address to bind; expected {FORM}"),
            ));
        };
        let mut cfg = GossipConfig::new();
        cfg.bind = addr(bind, "bind address")?;
        if let Some(seeds) = url.take("seeds") {
            cfg.seeds = seeds
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| addr(s, "seed"))
                .collect::<Result<_>>()?;
        }
        if let Some(node) = url.take("node") {
            cfg.node_name = Some(node);
        }
        if let Some(key) = url.take("key") {
            cfg.auth_key = Some(hex(&key)?);
        }
        if let Some(d) = url.take_duration("max_clock_skew")? {
            cfg.max_clock_skew = d;
        }
        if let Some(d) = url.take_duration("probe_period")? {
            cfg.probe_period = d;
        }
        url.finish()?;
        cfg.validate()?;
        Ok(cfg)
    }
}

/// The bytes of a hex string (the value is a secret: never quoted).
fn hex(s: &str) -> Result<Vec<u8>> {
    let bad = || {
        Error::invalid(
            "registry URL",
            format!(
                "parameter key: not an even number of hex digits ({} characters)",
                s.len()
            ),
        )
    };
    if s.is_empty() || !s.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            s.get(i..i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
                .ok_or_else(bad)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_seeds_node_and_key() {
        let cfg: GossipConfig = "gossip://127.0.0.1:0?seeds=127.0.0.1:1,[::1]:2&key=00ff10"
            .parse()
            .unwrap();
        assert_eq!(cfg.seeds.len(), 2);
        assert_eq!(cfg.auth_key.as_deref(), Some(&[0u8, 255, 16][..]));
    }

    #[test]
    fn what_is_wrong_is_named() {
        let msg = |s: &str| s.parse::<GossipConfig>().unwrap_err().to_string();
        assert!(msg("gossip://host:1").contains("\"host:1\""));
        assert!(msg("gossip://127.0.0.1:1?seeds=x").contains("seed \"x\""));
        let e = msg("gossip://127.0.0.1:1?key=s3cretzz");
        assert!(e.contains("hex") && !e.contains("s3cret"), "{e}");
        assert!(msg("gossip://127.0.0.1:1?seed=127.0.0.1:2").contains("\"seed\""));
    }
}
