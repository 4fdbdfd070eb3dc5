//! `cloudmap://` URLs ([`CloudMapConfig`]'s `FromStr`).

use std::str::FromStr;

use waypost::backend::BackendUrl;
use waypost::{Error, Result};

use crate::config::CloudMapConfig;

/// What a Cloud Map URL looks like, for errors.
const FORM: &str = "cloudmap://NAMESPACE[?region=…&endpoint=…]";

impl FromStr for CloudMapConfig {
    type Err = Error;

    /// `cloudmap://NAMESPACE`, with the parameters `region`, `endpoint` (an
    /// emulator or a VPC endpoint; credentials come from the usual AWS
    /// chain, or for an emulator `access_key_id` and `secret_access_key`,
    /// never shown), `create_namespace` (`true`: create an HTTP namespace when
    /// missing), `suspect_after`, `remove_after` and `sweep_interval`
    /// (durations such as `10s`).
    ///
    /// ```
    /// use waypost_cloudmap::CloudMapConfig;
    /// let cfg: CloudMapConfig = "cloudmap://registry?region=eu-west-1".parse().unwrap();
    /// assert_eq!(cfg.namespace, "registry");
    /// assert_eq!(cfg.region.as_deref(), Some("eu-west-1"));
    /// ```
    fn from_str(s: &str) -> Result<Self> {
        let mut url = BackendUrl::parse(s)?;
        url.expect_scheme("cloudmap", FORM)?;
        let namespace = url.name(FORM)?;
        let mut cfg = CloudMapConfig::new(namespace);
        if let Some(region) = url.take("region") {
            cfg = cfg.with_region(region);
        }
        if let Some(endpoint) = url.take("endpoint") {
            cfg = cfg.with_endpoint_url(endpoint);
        }
        if let Some(create) = url.take_bool("create_namespace")? {
            cfg = cfg.with_create_namespace(create);
        }
        if let Some((id, secret)) = url.take_pair("access_key_id", "secret_access_key")? {
            cfg = cfg.with_static_credentials(id, secret);
        }
        cfg.liveness = url.take_liveness(cfg.liveness.clone())?;
        url.finish()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_and_parameters() {
        let cfg: CloudMapConfig = "cloudmap://ns?endpoint=http://127.0.0.1:5000&create_namespace=1"
            .parse()
            .unwrap();
        assert_eq!(cfg.namespace, "ns");
        assert_eq!(cfg.endpoint_url.as_deref(), Some("http://127.0.0.1:5000"));
        assert!(cfg.create_namespace);
    }

    #[test]
    fn what_is_wrong_is_named() {
        let msg = |s: &str| s.parse::<CloudMapConfig>().unwrap_err().to_string();
        assert!(msg("cloudmap://").contains("NAMESPACE"));
        assert!(msg("cloudmap://ns?create=1").contains("\"create\""));
        assert!(msg("cloudmap://ns?create_namespace=maybe").contains("\"maybe\""));
        assert!(msg("dynamodb://t").contains("is not cloudmap"));
    }
}
