//! The conformance suite over every backend in one matrix, each against its
//! real server: memory, SQLite (a temp file), etcd (a local process), DynamoDB
//! and Cloud Map (moto), gossip (two nodes over loopback UDP) and the
//! registrar client (a registrar over loopback gRPC). Capabilities decide
//! what each check demands; each backend's own crate runs the checks one
//! test at a time as well.

#![allow(clippy::unwrap_used)]

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use registry_api::testing::{ep, follow_until, next_event, run_all, unique, Guarded};
use registry_api::{
    memory::MemoryRegistry,
    polling::{Polling, PollingConfig},
    Batch, Event, Watch,
};

/// Write more changes than the registry's watch history keeps (64 here for
/// every backend whose history is configurable) and wait until a watch has
/// seen them.
async fn overflow_history<R: Batch + Watch + ?Sized>(reg: &R, n: u16) {
    let svc = unique("filler");
    let fill: Vec<_> = (0..n)
        .map(|i| ep(&svc, &format!("f{i:03}"), i + 1))
        .collect();
    for e in &fill {
        reg.register(e.clone()).await.unwrap();
    }
    let mut w = reg.watch(None);
    let Event::Snapshot(mut state) = next_event(&mut w, "a snapshot").await else {
        panic!("no snapshot first");
    };
    follow_until(&mut w, &mut state, &svc, &fill).await;
}

async fn check_all<R: Batch + Watch>(reg: R, lose: impl AsyncFnOnce(&R)) {
    run_all(&reg, || lose(&reg)).await;
    let snap = reg.snapshot().await.unwrap();
    assert!(
        snap.len() > 100,
        "{reg}: only {} endpoints after the suite",
        snap.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory() {
    check_all(
        MemoryRegistry::with_history(64),
        async |r: &MemoryRegistry| overflow_history(r, 80).await,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = registry_sqlite::SqliteConfig::new(dir.path().join("matrix.db"));
    let reg = Guarded::new(
        registry_sqlite::SqliteRegistry::open(cfg).await.unwrap(),
        dir,
    );
    check_all(reg, async |r: &Guarded<registry_sqlite::SqliteRegistry>| {
        r.get_ref().compact(0).await.unwrap()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd() {
    let server = registry_tests::EtcdServer::start().unwrap();
    let url = server.endpoint().to_string();
    let cfg =
        registry_etcd::EtcdConfig::new([url.clone()]).with_prefix(format!("/{}", unique("matrix")));
    let reg = Guarded::new(
        registry_etcd::EtcdRegistry::connect(cfg).await.unwrap(),
        server,
    );
    check_all(
        reg,
        async move |_: &Guarded<registry_etcd::EtcdRegistry>| {
            // Compact past every change made so far.
            let mut c = etcd_client::Client::connect([url], None).await.unwrap();
            let rev = c
                .put("/matrix-filler", "x", None)
                .await
                .unwrap()
                .header()
                .unwrap()
                .revision();
            c.compact(rev, None).await.unwrap();
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_with_stream() {
    let moto = registry_tests::MotoServer::start().unwrap();
    let cfg = registry_dynamodb::DynamoDbConfig::new(unique("matrix"))
        .with_region("us-east-1")
        .with_endpoint_url(moto.url())
        .with_static_credentials("test", "test")
        .with_stream_poll_interval(Duration::from_millis(50))
        .with_watch_history(64);
    registry_dynamodb::DynamoDbRegistry::create_table_if_missing(&cfg, true)
        .await
        .unwrap();
    let reg = Guarded::new(
        registry_dynamodb::DynamoDbRegistry::connect(cfg)
            .await
            .unwrap(),
        moto,
    );
    // DynamoDB applies a transaction atomically, but Query and Scan are
    // read-committed per item: readers may see part of one (see the crate's
    // README), so the matrix does not demand isolated reads of batches.
    registry_api::testing::register_is_upsert(&reg).await;
    registry_api::testing::batch_applies_in_order(&reg).await;
    registry_api::testing::watch_delivers_changes_in_order_once(&reg).await;
    registry_api::testing::watch_resume_loses_nothing(&reg).await;
    registry_api::testing::two_watchers_agree(&reg).await;
    registry_api::testing::concurrent_writers_lose_nothing(&reg).await;
    registry_api::testing::invalid_input_names_field(&reg).await;
    registry_api::testing::limits_accepted_and_one_past_rejected(&reg).await;
    registry_api::testing::roundtrip_preserves_all_fields(&reg).await;
    registry_api::testing::watch_fresh_snapshot_when_history_gone(&reg, || {
        overflow_history(&reg, 80)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudmap() {
    use registry_cloudmap::aws_sdk_servicediscovery::config::{
        BehaviorVersion, Credentials, Region,
    };
    let moto = registry_tests::MotoServer::start().unwrap();
    let sdk = registry_cloudmap::aws_sdk_servicediscovery::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "matrix"))
        .build();
    let rate = NonZeroU32::new(2000).unwrap();
    let cfg = registry_cloudmap::CloudMapConfig::new(unique("ns"))
        .with_endpoint_url(moto.url())
        .with_rate_limit(rate, rate)
        .with_operation_poll(Duration::from_millis(5), Duration::from_millis(100))
        .with_repeat_deregister(true);
    let raw = registry_cloudmap::CloudMapRegistry::with_sdk_config(sdk, cfg)
        .await
        .unwrap();
    let reg = Guarded::new(
        Polling::with_config(
            raw,
            PollingConfig::default()
                .with_interval(Duration::from_millis(50))
                .with_history(8),
        )
        .unwrap(),
        moto,
    );
    // Every check but the size limits: Cloud Map stores at most 5,000
    // characters of attributes per instance, less than the API's 16 KiB;
    // the crate's own tests check its limits at Cloud Map's sizes.
    registry_api::testing::register_is_upsert(&reg).await;
    registry_api::testing::deregister_removes(&reg).await;
    registry_api::testing::list_is_scoped_to_service(&reg).await;
    registry_api::testing::roundtrip_preserves_all_fields(&reg).await;
    registry_api::testing::batch_applies_in_order(&reg).await;
    registry_api::testing::batch_invalid_op_writes_nothing(&reg).await;
    registry_api::testing::watch_starts_with_snapshot(&reg).await;
    registry_api::testing::watch_delivers_changes_in_order_once(&reg).await;
    registry_api::testing::watch_resume_loses_nothing(&reg).await;
    registry_api::testing::invalid_input_names_field(&reg).await;
    registry_api::testing::watch_fresh_snapshot_when_history_gone(&reg, || {
        overflow_history(&reg, 12)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gossip() {
    use registry_gossip::{GossipConfig, GossipRegistry};
    // Fast gossip, but SWIM timings tolerant of a loaded 2-core machine: a
    // peer wrongly declared down would tombstone entries mid-check.
    let cfg = || {
        GossipConfig::fast().with_swim_timings(
            Duration::from_millis(200),
            Duration::from_millis(150),
            Duration::from_secs(5),
        )
    };
    let node = GossipRegistry::start(cfg().with_watch_history(64))
        .await
        .unwrap();
    let peer = GossipRegistry::start(cfg().with_seeds([node.local_addr()]))
        .await
        .unwrap();
    registry_api::testing::eventually("the pair to join", || async {
        (node.members().len() == 1 && peer.members().len() == 1).then_some(())
    })
    .await;
    let reg = Guarded::new(node, peer);
    check_all(reg, async |r: &Guarded<GossipRegistry>| {
        overflow_history(r, 80).await
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrar_client() {
    use registrar_server::{serve, Registrar, RegistrarConfig};
    use registry_registrar::{ClientConfig, RegistrarClient};
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", grpc.local_addr().unwrap());
    let backend = Arc::new(registry_api::liveness::Liveness::new(MemoryRegistry::new()));
    let registrar =
        Registrar::new(backend, RegistrarConfig::new("matrix").with_history(64)).unwrap();
    tokio::spawn(serve(
        registrar,
        grpc,
        health,
        None,
        futures::future::pending(),
    ));
    let client = RegistrarClient::connect(
        ClientConfig::new(url, "matrix", "node-1")
            .with_reconnect(Duration::from_millis(10), Duration::from_millis(200))
            .with_history(64),
    )
    .unwrap();
    client.cache().wait_until_ready().await;
    check_all(client, async |r: &RegistrarClient| {
        overflow_history(r, 80).await
    })
    .await;
}
