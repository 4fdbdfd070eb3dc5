//! `registrar serve`'s `/metrics`: the names, types and plausible values
//! of its series after agents wrote and watched through it.

use crate::common;

use common::{http_get, parse, serve_binary, Scrape, Served};
use waypost::testing::{ep, eventually};
use waypost::Registry;
use waypost_registrar_client::{ClientConfig, RegistrarClient};

async fn scrape(server: &Served) -> Scrape {
    let (code, body) = http_get(&server.health, "/metrics").await;
    assert_eq!(code, 200, "{body}");
    parse(&body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_have_the_nine_names_types_and_plausible_values() {
    let server = serve_binary(&["--cluster-name", "cluster-a"]).await;
    assert_eq!(http_get(&server.health, "/healthz").await.0, 200);
    eventually("ready", || async {
        (http_get(&server.health, "/readyz").await.0 == 200).then_some(())
    })
    .await;

    // A workload: two agents with open streams, writes in two clusters.
    let agent = |node: &str| {
        RegistrarClient::connect(ClientConfig::new(server.url(), "cluster-a", node)).unwrap()
    };
    let a1 = agent("n1");
    let a2 = agent("n2");
    a1.cache().wait_until_ready().await;
    a2.cache().wait_until_ready().await;
    a1.register(ep("api", "1", 80).with_node("n1").with_cluster("cluster-a"))
        .await
        .unwrap();
    a1.register(ep("api", "2", 80).with_node("n1").with_cluster("cluster-a"))
        .await
        .unwrap();
    a2.register(ep("api", "3", 80).with_node("n2").with_cluster("cluster-b"))
        .await
        .unwrap();
    a2.deregister(&waypost::EndpointKey::new("api", "2"))
        .await
        .unwrap();
    eventually("the writes at the other agent", || async {
        a1.list("api").await.ok().filter(|l| l.len() == 2)
    })
    .await;

    let m = eventually("the workload in /metrics", || async {
        let m = scrape(&server).await;
        let settled = m.values.get("registrar_connected_agents") == Some(&2.0)
            && m.values.get("registrar_endpoint_count{cluster=\"cluster-b\"}") == Some(&1.0)
            && m.values.get("registrar_endpoint_count{cluster=\"cluster-a\"}") == Some(&1.0)
            && m.values.get("registrar_write_queue_depth") == Some(&0.0)
            // Four writes; a register and a deregister of one key in the
            // same batch count as one operation.
            && m.values.get("registrar_write_batch_size_sum").is_some_and(|s| *s >= 3.0);
        settled.then_some(m)
    })
    .await;

    let expected = [
        ("registrar_connected_agents", "gauge"),
        ("registrar_endpoint_count", "gauge"),
        ("registrar_sync_duration_seconds", "histogram"),
        ("registrar_sync_errors_total", "counter"),
        ("registrar_write_batch_size", "histogram"),
        ("registrar_write_queue_depth", "gauge"),
        ("registrar_event_broadcast_total", "counter"),
        ("registrar_snapshot_pending_endpoints", "gauge"),
        ("registrar_snapshot_bytes_total", "counter"),
        ("registrar_stream_messages_encoded_total", "counter"),
        // The registrar's own cache of the backend; agents export theirs as
        // agent_registrar_cache_age_seconds and
        // agent_registrar_stream_reconnects_total.
        ("registrar_cache_age_seconds", "gauge"),
        ("registrar_stream_reconnects_total", "counter"),
        ("registrar_backend_up", "gauge"),
        ("registrar_backend_down_seconds", "gauge"),
        ("registrar_ready", "gauge"),
    ];
    for (name, ty) in expected {
        assert_eq!(
            m.types.get(name).map(String::as_str),
            Some(ty),
            "# TYPE of {name}"
        );
    }
    assert_eq!(
        m.get("registrar_endpoint_count{cluster=\"cluster-a\"}"),
        1.0
    );
    assert_eq!(
        m.get("registrar_endpoint_count{cluster=\"cluster-b\"}"),
        1.0
    );
    // The memory backend has a native watch: its first snapshot is a sync.
    assert!(m.get("registrar_sync_duration_seconds_count") >= 1.0);
    assert!(m.get("registrar_sync_duration_seconds_bucket{le=\"+Inf\"}") >= 1.0);
    assert_eq!(m.get("registrar_sync_errors_total"), 0.0);
    // Four single writes, coalesced into 1 to 4 batches of 3 or 4 ops.
    let batches = m.get("registrar_write_batch_size_count");
    assert!((1.0..=4.0).contains(&batches), "{batches}");
    assert!(m.get("registrar_write_batch_size_sum") <= 4.0);
    // Each agent got a snapshot, then 3 adds... at least the snapshots
    // and the changes for each of the two streams.
    assert!(m.get("registrar_event_broadcast_total{type=\"full_snapshot\"}") >= 2.0);
    assert!(m.get("registrar_event_broadcast_total{type=\"endpoint_added\"}") >= 6.0);
    assert!(m.get("registrar_event_broadcast_total{type=\"endpoint_removed\"}") >= 2.0);
    assert_eq!(m.get("registrar_cache_age_seconds"), 0.0);
    assert_eq!(m.get("registrar_stream_reconnects_total"), 0.0);
    assert_eq!(m.get("registrar_backend_up"), 1.0);
    assert_eq!(m.get("registrar_ready"), 1.0);
    assert!(
        !m.types.keys().any(|k| k.starts_with("agent_")),
        "the registrar exports an agent's metric: {:?}",
        m.types.keys().collect::<Vec<_>>()
    );

    // An agent leaves: the gauge follows.
    drop(a2);
    eventually("connected agents back to 1", || async {
        (scrape(&server)
            .await
            .values
            .get("registrar_connected_agents")
            == Some(&1.0))
        .then_some(())
    })
    .await;
    drop(server);
}
