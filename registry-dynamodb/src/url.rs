//! `dynamodb://` URLs ([`DynamoDbConfig`]'s `FromStr`).

use std::str::FromStr;

use waypost::backend::{quote, BackendUrl};
use waypost::{Error, Result};

use crate::config::{DynamoDbConfig, WatchMode, CHANGELOG_MAX_HEADS};

/// What a DynamoDB URL looks like, for errors.
const FORM: &str = "dynamodb://TABLE[?region=…&endpoint=…]";

impl FromStr for DynamoDbConfig {
    type Err = Error;

    /// `dynamodb://TABLE`, with the parameters `region`, `endpoint` (an
    /// emulator or a VPC endpoint; credentials come from the usual AWS
    /// chain, or for an emulator `access_key_id` and `secret_access_key`,
    /// never shown), `watch` (`auto`, `changelog` or `scan`), `heads` (the change
    /// log's heads, 1 to 64), `create_table` (`true`: create it when
    /// missing), `poll_interval`, `suspect_after`, `remove_after`,
    /// `sweep_interval` (durations such as `10s`) and `consistent_reads`.
    ///
    /// ```
    /// use waypost_dynamodb::{DynamoDbConfig, WatchMode};
    /// let cfg: DynamoDbConfig =
    ///     "dynamodb://registry?region=eu-west-1&watch=changelog&heads=8".parse().unwrap();
    /// assert_eq!(cfg.table, "registry");
    /// assert_eq!(cfg.region.as_deref(), Some("eu-west-1"));
    /// assert_eq!((cfg.watch, cfg.changelog_heads), (WatchMode::ChangeLog, 8));
    /// ```
    fn from_str(s: &str) -> Result<Self> {
        let mut url = BackendUrl::parse(s)?;
        url.expect_scheme("dynamodb", FORM)?;
        let table = url.name(FORM)?;
        let mut cfg = DynamoDbConfig::new(table);
        if let Some(region) = url.take("region") {
            cfg = cfg.with_region(region);
        }
        if let Some(endpoint) = url.take("endpoint") {
            cfg = cfg.with_endpoint_url(endpoint);
        }
        if let Some(mode) = url.take("watch") {
            cfg.watch = match mode.as_str() {
                "auto" => WatchMode::Auto,
                "changelog" => WatchMode::ChangeLog,
                "scan" => WatchMode::Polling,
                other => {
                    return Err(Error::invalid(
                        "registry URL",
                        format!(
                            "parameter watch: {} is not auto, changelog or scan",
                            quote(other)
                        ),
                    ))
                }
            };
        }
        if let Some(heads) = url.take_parsed::<u32>("heads", "a number of heads")? {
            if !(1..=CHANGELOG_MAX_HEADS).contains(&heads) {
                return Err(Error::invalid(
                    "registry URL",
                    format!(
                        "parameter heads: {heads} is out of range: 1 to {}",
                        CHANGELOG_MAX_HEADS
                    ),
                ));
            }
            cfg.changelog_heads = heads;
        }
        if let Some(create) = url.take_bool("create_table")? {
            cfg.create_table = create;
        }
        if let Some(d) = url.take_duration("poll_interval")? {
            cfg.poll_interval = d;
        }
        if let Some(consistent) = url.take_bool("consistent_reads")? {
            cfg.consistent_reads = consistent;
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
    use std::time::Duration;

    use super::*;

    #[test]
    fn table_and_parameters() {
        let cfg: DynamoDbConfig = "dynamodb://reg?endpoint=http://127.0.0.1:5000&create_table=true\
                                   &suspect_after=10s&remove_after=1m&watch=scan"
            .parse()
            .unwrap();
        assert_eq!(cfg.table, "reg");
        assert_eq!(cfg.endpoint_url.as_deref(), Some("http://127.0.0.1:5000"));
        assert!(cfg.create_table);
        assert_eq!(cfg.watch, WatchMode::Polling);
        assert_eq!(cfg.liveness.suspect_after, Duration::from_secs(10));
    }

    #[test]
    fn what_is_wrong_is_named() {
        let msg = |s: &str| s.parse::<DynamoDbConfig>().unwrap_err().to_string();
        assert!(msg("dynamodb://").contains("TABLE"));
        assert!(msg("dynamodb://t/x").contains("TABLE"));
        assert!(msg("dynamodb://t?watch=stream").contains("\"stream\""));
        assert!(msg("dynamodb://t?heads=65").contains("1 to 64"));
        assert!(msg("dynamodb://t?regoin=x").contains("\"regoin\""));
        assert!(msg("cloudmap://t").contains("is not dynamodb"));
    }
}
