//! The settings every test of a backend starts from: a fixture server's
//! address, names of the test's own (a unique etcd prefix, DynamoDB table or
//! Cloud Map namespace), the emulator's fixed credentials and region, and
//! intervals short enough for tests. [`crate::registries`] connects with
//! them; tests that need a variation change the returned config.
//!
//! ```no_run
//! # #[cfg(feature = "etcd")] {
//! let cfg = waypost_fixtures::configs::etcd("http://127.0.0.1:2379")
//!     .with_request_timeout(std::time::Duration::from_secs(1));
//! # }
//! ```

use std::time::Duration;

use waypost::testing::unique;

/// An etcd config for `endpoint` (`http://ip:port`) under a prefix of its
/// own, with a 5 s request and a 2 s connect timeout.
#[cfg(feature = "etcd")]
pub fn etcd(endpoint: &str) -> waypost_etcd::EtcdConfig {
    waypost_etcd::EtcdConfig::new([endpoint.to_string()])
        .with_prefix(format!("/{}", unique("test")))
        .with_request_timeout(Duration::from_secs(5))
        .with_connect_timeout(Duration::from_secs(2))
}

/// A DynamoDB config for the emulator at `url` on a table of its own (not
/// created), polled and stream-polled every 50 ms, keeping 64 changes of
/// watch history.
#[cfg(feature = "dynamodb")]
pub fn dynamodb(url: &str) -> waypost_dynamodb::DynamoDbConfig {
    waypost_dynamodb::DynamoDbConfig::new(unique("tbl"))
        .with_region("us-east-1")
        .with_endpoint_url(url)
        .with_static_credentials("test", "test")
        .with_poll_interval(Duration::from_millis(50))
        .with_stream_poll_interval(Duration::from_millis(50))
        .with_watch_history(64)
}

/// The AWS SDK settings for the Cloud Map emulator: fixed credentials,
/// `us-east-1`.
#[cfg(feature = "cloudmap")]
pub fn cloudmap_sdk() -> waypost_cloudmap::aws_sdk_servicediscovery::Config {
    use waypost_cloudmap::aws_sdk_servicediscovery::config::{
        BehaviorVersion, Credentials, Region,
    };
    waypost_cloudmap::aws_sdk_servicediscovery::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "fixture"))
        .build()
}

/// A Cloud Map config for the emulator at `url` on a namespace of its own
/// (created on connect), with a rate limit that does not slow tests down
/// and operations polled every 5 to 100 ms.
#[cfg(feature = "cloudmap")]
pub fn cloudmap(url: &str) -> waypost_cloudmap::CloudMapConfig {
    let rate = std::num::NonZeroU32::new(2000).unwrap_or(std::num::NonZeroU32::MIN);
    waypost_cloudmap::CloudMapConfig::new(unique("ns"))
        .with_endpoint_url(url)
        .with_rate_limit(rate, rate)
        .with_operation_poll(Duration::from_millis(5), Duration::from_millis(100))
        // moto keeps a copy per re-registration (see the option's docs).
        .with_repeat_deregister(true)
}
