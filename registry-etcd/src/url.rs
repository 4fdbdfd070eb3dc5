//! `etcd://` URLs ([`EtcdConfig`]'s `FromStr`).

use std::str::FromStr;

use waypost::backend::BackendUrl;
use waypost::{Error, Result};

use crate::config::{EtcdConfig, TlsConfig, DEFAULT_PREFIX};

/// What an etcd URL looks like, for errors.
const FORM: &str = "etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT]/PREFIX";

impl FromStr for EtcdConfig {
    type Err = Error;

    /// `etcd://[USER:PASSWORD@]HOST:PORT[,HOST:PORT…][/PREFIX]` (`etcds://`
    /// or `tls=true` for TLS; the prefix defaults to `/registry`), with the
    /// parameters `lease_ttl`, `connect_timeout`, `request_timeout`
    /// (durations such as `10s`), and for TLS `ca_cert`, `client_cert`,
    /// `client_key` (PEM files) and `domain`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use waypost_etcd::EtcdConfig;
    /// let cfg: EtcdConfig = "etcd://10.0.0.1:2379,10.0.0.2:2379/registry?lease_ttl=10s"
    ///     .parse()
    ///     .unwrap();
    /// assert_eq!(cfg.endpoints, ["http://10.0.0.1:2379", "http://10.0.0.2:2379"]);
    /// assert_eq!(cfg.lease_ttl, Duration::from_secs(10));
    /// ```
    fn from_str(s: &str) -> Result<Self> {
        let mut url = BackendUrl::parse(s)?;
        let secure_scheme = url.scheme() == "etcds";
        if !secure_scheme {
            url.expect_scheme("etcd", FORM)?;
        }
        let tls = url.take_bool("tls")?.unwrap_or(secure_scheme);
        let scheme = if tls { "https" } else { "http" };
        let endpoints: Vec<String> = url
            .hosts()?
            .iter()
            .map(|h| format!("{scheme}://{h}"))
            .collect();
        let path = url.path();
        let prefix = if path.is_empty() || path == "/" {
            DEFAULT_PREFIX.to_string()
        } else {
            path
        };
        let mut cfg = EtcdConfig::new(endpoints).with_prefix(prefix);
        if let Some((user, password)) = url.userinfo()? {
            cfg = cfg.with_user(user, password.unwrap_or_default());
        }
        if let Some(d) = url.take_duration("lease_ttl")? {
            cfg = cfg.with_lease_ttl(d);
        }
        if let Some(d) = url.take_duration("connect_timeout")? {
            cfg.connect_timeout = d;
        }
        if let Some(d) = url.take_duration("request_timeout")? {
            cfg.request_timeout = d;
        }
        let files = (
            url.take("ca_cert"),
            url.take("client_cert"),
            url.take("client_key"),
            url.take("domain"),
        );
        if tls {
            cfg = cfg.with_tls(TlsConfig {
                ca_cert: files.0.map(Into::into),
                client_cert: files.1.map(Into::into),
                client_key: files.2.map(Into::into),
                domain: files.3,
            });
        } else if files != (None, None, None, None) {
            return Err(Error::invalid(
                "registry URL",
                format!(
                    "{url}: ca_cert, client_cert, client_key and domain are TLS settings; \
                     use etcds:// or tls=true"
                ),
            ));
        }
        url.finish()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_prefix_user_and_tls() {
        let cfg: EtcdConfig = "etcd://127.0.0.1:2379".parse().unwrap();
        assert_eq!(cfg.endpoints, ["http://127.0.0.1:2379"]);
        assert_eq!(cfg.prefix, DEFAULT_PREFIX);
        let cfg: EtcdConfig = "etcds://root:pw@h:2379/apps/x?ca_cert=/etc/ca.pem"
            .parse()
            .unwrap();
        assert_eq!(cfg.endpoints, ["https://h:2379"]);
        assert_eq!(cfg.prefix, "/apps/x");
        assert_eq!(cfg.user.as_deref(), Some("root"));
        let tls = cfg.tls.clone().expect("tls");
        assert_eq!(
            tls.ca_cert.as_deref(),
            Some(std::path::Path::new("/etc/ca.pem"))
        );
        assert!(!format!("{cfg:?}").contains("pw@") && !format!("{cfg:?}").contains("\"pw\""));
    }

    #[test]
    fn what_is_wrong_is_named() {
        let msg = |s: &str| s.parse::<EtcdConfig>().unwrap_err().to_string();
        assert!(msg("etcd:///registry").contains("HOST:PORT"));
        assert!(msg("etcd://h:x").contains("\"h:x\""));
        assert!(msg("etcd://h:1?ca_cert=/c.pem").contains("TLS"));
        assert!(msg("etcd://h:1?lease=10s").contains("\"lease\""));
        assert!(msg("sqlite:r.db").contains("is not etcd"));
        let e = msg("etcd://root:hunter2@h:1?bogus=1");
        assert!(!e.contains("hunter2") && e.contains("root:***@h:1"), "{e}");
    }
}
