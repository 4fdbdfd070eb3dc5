//! `sqlite:PATH` URLs ([`SqliteConfig`]'s `FromStr`).

use std::str::FromStr;

use waypost::backend::BackendUrl;
use waypost::{Error, Result};

use crate::config::SqliteConfig;

/// What a SQLite URL looks like, for errors.
const FORM: &str = "sqlite:PATH[?suspect_after=30s&remove_after=5m&sweep_interval=10s]";

impl FromStr for SqliteConfig {
    type Err = Error;

    /// `sqlite:PATH`, with `sqlite:///abs/path` and `sqlite://rel/path`
    /// also read as paths, and the parameters `suspect_after`,
    /// `remove_after`, `sweep_interval` (`off`: no background sweep),
    /// `poll_interval`, `busy_timeout` (durations such as `10s`), `log_len`,
    /// `max_connections` and `max_batch` (counts).
    ///
    /// ```
    /// use std::time::Duration;
    /// use waypost_sqlite::SqliteConfig;
    /// let cfg: SqliteConfig = "sqlite:/var/lib/registry.db?suspect_after=10s&remove_after=1m"
    ///     .parse()
    ///     .unwrap();
    /// assert_eq!(cfg.path.to_str(), Some("/var/lib/registry.db"));
    /// assert_eq!(cfg.suspect_after, Duration::from_secs(10));
    /// assert!("sqlite:r.db?sweep=1s".parse::<SqliteConfig>().is_err());
    /// ```
    fn from_str(s: &str) -> Result<Self> {
        let mut url = BackendUrl::parse(s)?;
        url.expect_scheme("sqlite", FORM)?;
        let path = url.opaque()?;
        if path.is_empty() {
            return Err(Error::invalid(
                "registry URL",
                format!("{url}: no path; expected {FORM}"),
            ));
        }
        let mut cfg = SqliteConfig::new(path);
        if let Some(d) = url.take_duration("suspect_after")? {
            cfg.suspect_after = d;
        }
        if let Some(d) = url.take_duration("remove_after")? {
            cfg.remove_after = d;
        }
        match url.take("sweep_interval").as_deref() {
            None => {}
            Some("off") => cfg.sweep_interval = None,
            Some(v) => {
                let d = humantime::parse_duration(v).map_err(|e| {
                    Error::invalid(
                        "registry URL",
                        format!(
                            "parameter sweep_interval: {} is not a duration such as 10s, \
                             or off ({e})",
                            waypost::backend::quote(v)
                        ),
                    )
                })?;
                cfg.sweep_interval = Some(d);
            }
        }
        if let Some(d) = url.take_duration("poll_interval")? {
            cfg.poll_interval = d;
        }
        if let Some(d) = url.take_duration("busy_timeout")? {
            cfg.busy_timeout = d;
        }
        if let Some(n) = url.take_parsed("log_len", "a count")? {
            cfg.log_len = n;
        }
        if let Some(n) = url.take_parsed("max_connections", "a count")? {
            cfg.max_connections = n;
        }
        if let Some(n) = url.take_parsed("max_batch", "a count")? {
            cfg.max_batch = n;
        }
        url.finish()?;
        cfg.check()?;
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn paths_and_parameters() {
        let cfg: SqliteConfig = "sqlite:registry.db".parse().unwrap();
        assert_eq!(cfg.path.to_str(), Some("registry.db"));
        let cfg: SqliteConfig = "sqlite:///var/lib/r%20b.db?sweep_interval=off&log_len=50"
            .parse()
            .unwrap();
        assert_eq!(cfg.path.to_str(), Some("/var/lib/r b.db"));
        assert_eq!((cfg.sweep_interval, cfg.log_len), (None, 50));
        let cfg: SqliteConfig = "sqlite:r.db?sweep_interval=2s&busy_timeout=1s"
            .parse()
            .unwrap();
        assert_eq!(cfg.sweep_interval, Some(Duration::from_secs(2)));
    }

    #[test]
    fn what_is_wrong_is_named() {
        let msg = |s: &str| s.parse::<SqliteConfig>().unwrap_err().to_string();
        assert!(msg("sqlite:").contains("no path"), "{}", msg("sqlite:"));
        assert!(msg("etcd://a:1").contains("is not sqlite"));
        assert!(msg("sqlite:r.db?log_len=many").contains("log_len"));
        assert!(msg("sqlite:r.db?sweep_interval=soon").contains("sweep_interval"));
        let e = msg("sqlite:r.db?suspect_after=10m&remove_after=1m");
        assert!(e.contains("remove_after"), "{e}");
    }
}
