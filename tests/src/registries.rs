//! Ready, isolated registries on fixture servers: each call starts (or
//! reuses, per the fixture's rules) a server and hands back a registry with
//! names of its own (a unique etcd prefix, DynamoDB table or Cloud Map
//! namespace). The server lives as long as the returned registry.
//!
//! ```no_run
//! # async fn demo() -> Result<(), waypost_fixtures::FixtureError> {
//! use waypost::Registry;
//! let reg = waypost_fixtures::registries::etcd().await?;   // feature `etcd`
//! reg.register(waypost::Endpoint::new("api", "a", "127.0.0.1", 80)).await.unwrap();
//! # Ok(()) }
//! ```

use waypost::testing::Guarded;

use crate::FixtureError;

fn setup(what: &str) -> impl FnOnce(waypost::Error) -> FixtureError + '_ {
    move |source| FixtureError::Registry {
        what: what.to_string(),
        source,
    }
}

/// An `EtcdRegistry` under a unique prefix on a fixture etcd.
#[cfg(feature = "etcd")]
pub async fn etcd() -> Result<Guarded<waypost_etcd::EtcdRegistry>, FixtureError> {
    let server = crate::EtcdServer::start_async().await?;
    let reg = waypost_etcd::EtcdRegistry::connect(crate::configs::etcd(server.endpoint()))
        .await
        .map_err(setup("connecting to the fixture etcd"))?;
    Ok(Guarded::new(reg, server))
}

/// Make the fixture etcd at `endpoint` forget its history: one write
/// outside every registry's prefix, then a compaction at its revision, so
/// that a watch from any earlier revision gets a fresh snapshot. The one
/// "lose history" of etcd's tests.
#[cfg(feature = "etcd")]
pub async fn compact_etcd(endpoint: &str) -> Result<(), FixtureError> {
    use waypost_etcd::etcd_client::{Client, CompactionOptions};
    let failed = |what: &'static str| {
        move |e: waypost_etcd::etcd_client::Error| FixtureError::Registry {
            what: format!("{what} on the fixture etcd"),
            source: waypost::Error::unavailable(e.to_string()),
        }
    };
    let mut c = Client::connect([endpoint], None)
        .await
        .map_err(failed("connecting"))?;
    let resp = c
        .put("/compaction-filler", "x", None)
        .await
        .map_err(failed("the filler write"))?;
    let rev = resp.header().map_or(0, |h| h.revision());
    c.compact(rev, Some(CompactionOptions::new().with_physical()))
        .await
        .map_err(failed("compacting"))?;
    Ok(())
}

/// A `DynamoDbRegistry` on a new table (with a stream when `with_stream`,
/// watched natively; otherwise polled every 50 ms) on a fixture moto.
#[cfg(feature = "dynamodb")]
pub async fn dynamodb(
    with_stream: bool,
) -> Result<Guarded<waypost_dynamodb::DynamoDbRegistry>, FixtureError> {
    let moto = crate::MotoServer::start_async().await?;
    let cfg = crate::configs::dynamodb(moto.url());
    waypost_dynamodb::DynamoDbRegistry::create_table_if_missing(&cfg, with_stream)
        .await
        .map_err(setup("creating the fixture table"))?;
    let reg = waypost_dynamodb::DynamoDbRegistry::connect(cfg)
        .await
        .map_err(setup("connecting to the fixture moto"))?;
    Ok(Guarded::new(reg, moto))
}

/// A `CloudMapRegistry` on a new HTTP namespace on a fixture moto, polled
/// every 50 ms for its watch.
#[cfg(feature = "cloudmap")]
pub async fn cloudmap(
) -> Result<Guarded<waypost::polling::Polling<waypost_cloudmap::CloudMapRegistry>>, FixtureError> {
    let moto = crate::MotoServer::start_async().await?;
    let raw = waypost_cloudmap::CloudMapRegistry::with_sdk_config(
        crate::configs::cloudmap_sdk(),
        crate::configs::cloudmap(moto.url()),
    )
    .await
    .map_err(setup("creating the fixture namespace"))?;
    let polling = waypost::polling::Polling::with_config(
        raw,
        waypost::polling::PollingConfig::default()
            .with_interval(std::time::Duration::from_millis(50)),
    )
    .map_err(setup("polling the fixture namespace"))?;
    Ok(Guarded::new(polling, moto))
}
