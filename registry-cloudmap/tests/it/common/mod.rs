//! Test fixtures: a `moto_server` per test (via `waypost-fixtures`), a
//! registry on a namespace of its own, and that registry behind `Polling`.
#![allow(dead_code)]

use std::time::Duration;

use waypost::polling::{Polling, PollingConfig};
use waypost::testing::Guarded;
use waypost_cloudmap::{CloudMapConfig, CloudMapRegistry};
use waypost_fixtures::MotoServer;

/// Deltas the polling hub keeps; `lose_history` writes more than this.
pub const HISTORY: usize = 8;
/// Poll interval of the watch.
pub const INTERVAL: Duration = Duration::from_millis(50);

/// The SDK configuration for the emulator: fixed credentials, `us-east-1`.
pub use waypost_fixtures::configs::cloudmap_sdk as sdk_config;

/// A config for `moto` on a fresh namespace, with a rate limit that does
/// not slow the tests down.
pub fn config(moto: &MotoServer) -> CloudMapConfig {
    waypost_fixtures::configs::cloudmap(moto.url())
}

/// [`config`] without a background liveness sweep within a test (one an
/// hour; a sweep reads the namespace too), for tests that count requests.
pub fn quiet_config(moto: &MotoServer) -> CloudMapConfig {
    config(moto).with_liveness(
        waypost::liveness::LivenessConfig::default().with_sweep_interval(Duration::from_secs(3600)),
    )
}

pub async fn connect(cfg: CloudMapConfig) -> CloudMapRegistry {
    CloudMapRegistry::with_sdk_config(sdk_config(), cfg)
        .await
        .expect("connect to moto")
}

pub fn start_moto() -> MotoServer {
    MotoServer::start().expect("moto_server (pip install 'moto[server]')")
}

/// A registry behind `Polling`, owning its emulator (the one wrapper,
/// `Guarded`; `guard_mut::<MotoServer>()` reaches the server).
pub type Harness = Guarded<Polling<CloudMapRegistry>>;

/// A harness on a fresh emulator and namespace.
pub async fn harness() -> Harness {
    harness_with(|c| c).await
}

/// [`harness`] with the settings changed by `f`.
pub async fn harness_with(f: impl FnOnce(CloudMapConfig) -> CloudMapConfig) -> Harness {
    let moto = start_moto();
    let raw = connect(f(config(&moto))).await;
    let reg = Polling::with_config(
        raw,
        PollingConfig::default()
            .with_interval(INTERVAL)
            .with_history(HISTORY),
    )
    .expect("polling");
    Guarded::new(reg, moto)
}

/// The backend under the `Polling`.
pub fn raw(h: &Harness) -> &CloudMapRegistry {
    h.get_ref().get_ref()
}
