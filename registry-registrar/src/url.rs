//! `registrar://` URLs ([`ClientConfig`]'s `FromStr`).

use std::str::FromStr;

use waypost::backend::BackendUrl;
use waypost::{Error, Result};

use crate::config::ClientConfig;
use crate::tls::TlsFiles;

/// What a registrar URL looks like, for errors.
const FORM: &str = "registrar://HOST:PORT?node=NODE[&cluster=CLUSTER]";

impl FromStr for ClientConfig {
    type Err = Error;

    /// `registrar://HOST:PORT` (`registrars://` for TLS), with the
    /// parameters `node` (this agent's node: required), `cluster` (default
    /// `default`), `ack` (`optimistic` or `durable`), `request_timeout`,
    /// `connect_timeout` (durations such as `10s`), and for TLS `ca` and,
    /// for mTLS, `cert` and `key` (PEM files).
    ///
    /// ```
    /// use waypost_registrar_client::ClientConfig;
    /// let cfg: ClientConfig = "registrar://10.0.0.5:9443?cluster=eu&node=worker-1".parse().unwrap();
    /// assert_eq!(cfg.address, "http://10.0.0.5:9443");
    /// assert_eq!((cfg.cluster_name.as_str(), cfg.node_name.as_str()), ("eu", "worker-1"));
    /// ```
    fn from_str(s: &str) -> Result<Self> {
        let mut url = BackendUrl::parse(s)?;
        let secure = url.scheme() == "registrars";
        if !secure {
            url.expect_scheme("registrar", FORM)?;
        }
        let hosts = url.hosts()?;
        let [host] = hosts.as_slice() else {
            return Err(Error::invalid(
                "registry URL",
                format!("{url}: one HOST:PORT; expected {FORM}"),
            ));
        };
        let address = format!("{}://{host}", if secure { "https" } else { "http" });
        let cluster = url.take("cluster").unwrap_or_else(|| "default".into());
        let Some(node) = url.take("node") else {
            return Err(Error::invalid(
                "registry URL",
                format!("{url}: parameter node is missing (the agent's node); expected {FORM}"),
            ));
        };
        let mut cfg = ClientConfig::new(address, cluster, node);
        if let Some(ack) = url.take("ack") {
            cfg.ack = ack.parse()?;
        }
        if let Some(d) = url.take_duration("request_timeout")? {
            cfg.request_timeout = d;
        }
        if let Some(d) = url.take_duration("connect_timeout")? {
            cfg.connect_timeout = d;
        }
        match (url.take("ca"), url.take("cert"), url.take("key")) {
            (None, None, None) if !secure => {}
            (Some(ca), Some(cert), Some(key)) => cfg = cfg.with_tls(TlsFiles::new(ca, cert, key)),
            (Some(ca), None, None) => cfg = cfg.with_tls(TlsFiles::ca_only(ca)),
            _ => {
                return Err(Error::invalid(
                    "registry URL",
                    format!("{url}: TLS takes ca, or ca with both cert and key"),
                ))
            }
        }
        url.finish()?;
        cfg.validate()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Ack;

    #[test]
    fn address_cluster_node_and_tls() {
        let cfg: ClientConfig =
            "registrars://r:9443?node=n&ca=/ca.pem&cert=/c.pem&key=/k.pem&ack=durable"
                .parse()
                .unwrap();
        assert_eq!(cfg.address, "https://r:9443");
        assert_eq!(cfg.cluster_name, "default");
        assert_eq!(cfg.ack, Ack::Durable);
        assert!(cfg.tls.is_some());
    }

    #[test]
    fn what_is_wrong_is_named() {
        let msg = |s: &str| s.parse::<ClientConfig>().unwrap_err().to_string();
        assert!(msg("registrar://r:9443").contains("node is missing"));
        assert!(msg("registrar://a:1,b:2?node=n").contains("one HOST:PORT"));
        assert!(msg("registrars://r:1?node=n").contains("TLS takes ca"));
        assert!(msg("registrar://r:1?node=n&ack=maybe").contains("\"maybe\""));
        assert!(msg("registrar://r:1?node=n&clutser=x").contains("\"clutser\""));
    }
}
