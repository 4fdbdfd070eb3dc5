//! The change log (`WatchMode::ChangeLog`) against moto: three registries
//! writing one table at once, readers that see every change once and in
//! each key's order, a reader away longer than the retention, and a lost
//! log entry.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use common::{config, shared_moto, RecordingProxy};
use waypost::testing::{eventually, first_snapshot, unique, wait_limit};
use waypost::{Batch, Endpoint, EndpointKey, Event, EventStream, Op, Registry, Watch};
use waypost_dynamodb::aws_sdk_dynamodb::types::AttributeValue;
use waypost_dynamodb::{DynamoDbConfig, DynamoDbRegistry, WatchMode};
use waypost_fixtures::MotoServer;

/// The partition of the log and the sort key of its head, as the crate
/// docs give them.
const LOG: &str = "~registry changelog";
const HEAD: &str = "~head";
const QUERY_TARGET: &str = "DynamoDB_20120810.Query";
const SCAN_TARGET: &str = "DynamoDB_20120810.Scan";

/// Per key, the ports it held in order (`None`: absent), repeats dropped.
type Histories = BTreeMap<EndpointKey, Vec<Option<u16>>>;

fn push(h: &mut Histories, key: EndpointKey, state: Option<u16>) {
    let states = h.entry(key).or_insert_with(|| vec![None]);
    if states.last() != Some(&state) {
        states.push(state);
    }
}

async fn changelog_registry(cfg: &DynamoDbConfig) -> DynamoDbRegistry {
    let reg = DynamoDbRegistry::connect(cfg.clone().with_watch(WatchMode::ChangeLog))
        .await
        .unwrap();
    assert!(reg.uses_changelog() && !reg.watches_stream());
    reg
}

/// A new table: its settings, and the server (kept alive while held).
async fn table() -> (DynamoDbConfig, Arc<MotoServer>) {
    let moto = shared_moto();
    let cfg = config(moto.url()).with_watch(WatchMode::ChangeLog);
    assert!(DynamoDbRegistry::create_table_if_missing(&cfg, false)
        .await
        .unwrap());
    (cfg, moto)
}

/// Every log item, read with the client: (sort key, item).
async fn log_items(reg: &DynamoDbRegistry) -> Vec<(String, HashMap<String, AttributeValue>)> {
    partition_items(reg, LOG).await
}

/// Every item of `partition`, read with the client: (sort key, item).
async fn partition_items(
    reg: &DynamoDbRegistry,
    partition: &str,
) -> Vec<(String, HashMap<String, AttributeValue>)> {
    let mut out = Vec::new();
    let mut start = None;
    loop {
        let page = reg
            .client()
            .query()
            .table_name(reg.table())
            .key_condition_expression("service = :s")
            .expression_attribute_values(":s", AttributeValue::S(partition.into()))
            .consistent_read(true)
            .set_exclusive_start_key(start.take())
            .send()
            .await
            .unwrap();
        for item in page.items() {
            let id = item["id"].as_s().unwrap().clone();
            out.push((id, item.clone()));
        }
        match page.last_evaluated_key {
            Some(k) if !k.is_empty() => start = Some(k),
            _ => return out,
        }
    }
}

/// Delete the log entry of `version` by hand (as TTL would).
async fn delete_entry(reg: &DynamoDbRegistry, version: u64) {
    let out = reg
        .client()
        .delete_item()
        .table_name(reg.table())
        .key("service", AttributeValue::S(LOG.into()))
        .key("id", AttributeValue::S(format!("v{version:020}")))
        .return_values(waypost_dynamodb::aws_sdk_dynamodb::types::ReturnValue::AllOld)
        .send()
        .await
        .unwrap();
    assert!(out.attributes.is_some(), "no log entry {version} to delete");
}

/// The head's version.
async fn head(reg: &DynamoDbRegistry) -> u64 {
    let items = log_items(reg).await;
    let (_, item) = items.iter().find(|(id, _)| id == HEAD).unwrap();
    item["v"].as_n().unwrap().parse().unwrap()
}

/// Read `stream` into `state` and `hist` until `state` equals `want`.
async fn follow_to(
    stream: &mut EventStream,
    state: &mut BTreeMap<EndpointKey, Endpoint>,
    hist: &mut Histories,
    want: &BTreeMap<EndpointKey, Endpoint>,
    allow_errors: bool,
) {
    let deadline = tokio::time::Instant::now() + wait_limit();
    while state != want {
        let item = tokio::time::timeout_at(deadline, futures::StreamExt::next(stream))
            .await
            .unwrap_or_else(|_| panic!("timed out; state {state:?}, want {want:?}"))
            .expect("the watch ended");
        let ev = match item {
            Ok(ev) => ev,
            Err(e) if allow_errors => {
                eprintln!("watch reported (expected while stalled): {e}");
                continue;
            }
            Err(e) => panic!("watch failed: {e}"),
        };
        match ev {
            Event::Snapshot(s) => {
                let new: BTreeMap<_, _> = s.iter().map(|e| (e.key(), e.clone())).collect();
                for key in state.keys().chain(new.keys()).cloned().collect::<Vec<_>>() {
                    push(hist, key.clone(), new.get(&key).map(|e| e.port));
                }
                *state = new;
            }
            Event::Added { endpoint, .. } | Event::Updated { endpoint, .. } => {
                push(hist, endpoint.key(), Some(endpoint.port));
                state.insert(endpoint.key(), endpoint);
            }
            Event::Removed { key, .. } => {
                push(hist, key.clone(), None);
                state.remove(&key);
            }
        }
    }
}

async fn table_state(reg: &DynamoDbRegistry) -> BTreeMap<EndpointKey, Endpoint> {
    reg.snapshot()
        .await
        .unwrap()
        .iter()
        .map(|e| (e.key(), e.clone()))
        .collect()
}

/// Three registries write one table at once (each on its own connection,
/// racing for the log's head); two readers see every change exactly once,
/// in the order of each key's history as the log records it, and the log
/// has one entry per batch, versions 1 to N without a hole. (Through a
/// proxy that passes one request at a time: moto does not isolate
/// concurrent transactions, see `RecordingProxy::start_serial`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_writers_every_reader_sees_every_change_once_in_order() {
    let (cfg, moto) = table().await;
    let proxy = RecordingProxy::start_serial(moto.url()).await;
    let cfg = cfg.with_endpoint_url(&proxy.url);
    let writers = [
        changelog_registry(&cfg).await,
        changelog_registry(&cfg).await,
        changelog_registry(&cfg).await,
    ];
    let readers = [
        changelog_registry(&cfg).await,
        changelog_registry(&cfg).await,
    ];
    let mut streams: Vec<EventStream> = readers.iter().map(|r| r.watch(None)).collect();
    let mut states = [BTreeMap::new(), BTreeMap::new()];
    let mut hists = [Histories::new(), Histories::new()];
    for s in streams.iter_mut() {
        // The first state, before any write: the empty table.
        assert!(first_snapshot(s, "the first state").await.is_empty());
    }
    let svc = unique("cl");
    let batches = 20u16;
    let write = |w: u16| {
        let reg = &writers[w as usize];
        let svc = svc.clone();
        async move {
            for j in 0..batches {
                let port = w * 100 + j + 1;
                let mut ops = vec![
                    Op::Register(Endpoint::new(
                        &svc,
                        format!("w{w}-{}", j % 4),
                        "10.0.0.1",
                        port,
                    )),
                    Op::Register(Endpoint::new(
                        &svc,
                        format!("shared-{}", j % 3),
                        "10.0.0.2",
                        port,
                    )),
                ];
                if j % 5 == 4 {
                    ops.push(Op::Deregister(EndpointKey::new(
                        &svc,
                        format!("w{w}-{}", (j + 2) % 4),
                    )));
                    ops.push(Op::Deregister(EndpointKey::new(
                        &svc,
                        format!("shared-{}", (j + 1) % 3),
                    )));
                }
                reg.apply(ops).await.unwrap();
            }
        }
    };
    futures::future::join3(write(0), write(1), write(2)).await;
    eprintln!(
        "{} transactions for {} batches (the rest lost the race for the head)",
        proxy.count(common::TRANSACT_TARGET),
        3 * batches
    );

    // The log: one entry per batch, versions 1..=60 in order, and the head.
    let items = log_items(&readers[0]).await;
    let total = 3 * u64::from(batches);
    assert_eq!(items.len() as u64, total + 1, "entries and the head");
    assert_eq!(head(&readers[0]).await, total);
    let mut truth = Histories::new();
    for (i, (id, item)) in items.iter().filter(|(id, _)| id != HEAD).enumerate() {
        assert_eq!(id, &format!("v{:020}", i + 1));
        for v in item["del"].as_l().unwrap() {
            let m = v.as_m().unwrap();
            let key = EndpointKey::new(m["service"].as_s().unwrap(), m["id"].as_s().unwrap());
            push(&mut truth, key, None);
        }
        for v in item["put"].as_l().unwrap() {
            let m = v.as_m().unwrap();
            let key = EndpointKey::new(m["service"].as_s().unwrap(), m["id"].as_s().unwrap());
            push(
                &mut truth,
                key,
                Some(m["port"].as_n().unwrap().parse().unwrap()),
            );
        }
    }
    let want = table_state(&readers[0]).await;
    // The log ends where the table is.
    let ends: BTreeMap<EndpointKey, Option<u16>> = truth
        .iter()
        .map(|(k, h)| (k.clone(), *h.last().unwrap()))
        .collect();
    for (k, port) in &ends {
        assert_eq!(
            want.get(k).map(|e| e.port),
            *port,
            "{k}: log and table disagree"
        );
    }
    for (i, s) in streams.iter_mut().enumerate() {
        follow_to(s, &mut states[i], &mut hists[i], &want, false).await;
        assert_eq!(hists[i], truth, "reader {i} saw another history");
    }
}

/// A reader stalled while its next log entries are deleted (as TTL does
/// after the retention) finds the gap, scans the table once, and then
/// follows the log again without scanning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_away_longer_than_the_retention_scans_once_then_follows_the_log() {
    let (cfg, moto) = table().await;
    let writer = changelog_registry(&cfg).await;
    let proxy = RecordingProxy::start(moto.url()).await;
    let reader = changelog_registry(&cfg.clone().with_endpoint_url(&proxy.url)).await;
    let svc = unique("away");
    let mut stream = reader.watch(None);
    let (mut state, mut hist) = (BTreeMap::new(), Histories::new());
    writer
        .register(Endpoint::new(&svc, "a", "h", 1))
        .await
        .unwrap();
    let mut want = table_state(&writer).await;
    follow_to(&mut stream, &mut state, &mut hist, &want, false).await;
    let scans = proxy.count(SCAN_TARGET);
    assert_eq!(scans, 1, "the first sync scans");

    // Away: every Query fails while versions 2..=4 are written and 2 and 3
    // expire.
    proxy.fail_next(QUERY_TARGET, "InternalServerError", usize::MAX);
    let queries = proxy.count(QUERY_TARGET);
    eventually("the reader to try again", || async {
        (proxy.count(QUERY_TARGET) > queries).then_some(())
    })
    .await;
    writer
        .register(Endpoint::new(&svc, "a", "h", 2))
        .await
        .unwrap();
    writer
        .register(Endpoint::new(&svc, "b", "h", 3))
        .await
        .unwrap();
    writer
        .deregister(&EndpointKey::new(&svc, "a"))
        .await
        .unwrap();
    assert_eq!(head(&writer).await, 4);
    delete_entry(&writer, 2).await;
    delete_entry(&writer, 3).await;
    proxy.clear_faults();

    want = table_state(&writer).await;
    follow_to(&mut stream, &mut state, &mut hist, &want, true).await;
    assert_eq!(
        proxy.count(SCAN_TARGET),
        scans + 1,
        "one scan after the gap"
    );

    // And the log again, without another scan.
    writer
        .register(Endpoint::new(&svc, "c", "h", 4))
        .await
        .unwrap();
    want = table_state(&writer).await;
    follow_to(&mut stream, &mut state, &mut hist, &want, false).await;
    assert_eq!(proxy.count(SCAN_TARGET), scans + 1, "followed the log");
}

/// A log entry lost in the middle (deleted by hand) is found as a gap
/// that stays, and healed by one scan: the change it held arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_log_entry_is_detected_and_healed_by_a_scan() {
    let (cfg, moto) = table().await;
    let writer = changelog_registry(&cfg).await;
    let proxy = RecordingProxy::start(moto.url()).await;
    let reader = changelog_registry(&cfg.clone().with_endpoint_url(&proxy.url)).await;
    let svc = unique("lost");
    let mut stream = reader.watch(None);
    let (mut state, mut hist) = (BTreeMap::new(), Histories::new());
    writer
        .register(Endpoint::new(&svc, "a", "h", 1))
        .await
        .unwrap();
    let mut want = table_state(&writer).await;
    follow_to(&mut stream, &mut state, &mut hist, &want, false).await;
    let scans = proxy.count(SCAN_TARGET);

    proxy.fail_next(QUERY_TARGET, "InternalServerError", usize::MAX);
    let queries = proxy.count(QUERY_TARGET);
    eventually("the reader to try again", || async {
        (proxy.count(QUERY_TARGET) > queries).then_some(())
    })
    .await;
    writer
        .register(Endpoint::new(&svc, "b", "h", 2))
        .await
        .unwrap(); // 2
    writer
        .register(Endpoint::new(&svc, "lost", "h", 3))
        .await
        .unwrap(); // 3
    writer
        .register(Endpoint::new(&svc, "c", "h", 4))
        .await
        .unwrap(); // 4
    delete_entry(&writer, 3).await;
    proxy.clear_faults();

    want = table_state(&writer).await;
    assert!(want.contains_key(&EndpointKey::new(&svc, "lost")));
    follow_to(&mut stream, &mut state, &mut hist, &want, true).await;
    assert_eq!(
        proxy.count(SCAN_TARGET),
        scans + 1,
        "one scan heals the gap"
    );
    writer
        .register(Endpoint::new(&svc, "d", "h", 5))
        .await
        .unwrap();
    want = table_state(&writer).await;
    follow_to(&mut stream, &mut state, &mut hist, &want, false).await;
    assert_eq!(proxy.count(SCAN_TARGET), scans + 1, "followed the log");
}

/// Log items never show as endpoints: not in a snapshot, not in a list of
/// their partition, not through a registry that follows the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_items_are_invisible_to_reads() {
    let (cfg, _moto) = table().await;
    let writer = changelog_registry(&cfg).await;
    let svc = unique("hidden");
    writer
        .register(Endpoint::new(&svc, "a", "h", 1))
        .await
        .unwrap();
    assert_eq!(log_items(&writer).await.len(), 2, "one entry and the head");
    let snap = writer.snapshot().await.unwrap();
    assert_eq!(snap.len(), 1);
    assert!(writer.list(LOG).await.unwrap().is_empty());
    let plain = DynamoDbRegistry::connect(cfg.clone().with_watch(WatchMode::Polling))
        .await
        .unwrap();
    assert_eq!(plain.snapshot().await.unwrap().len(), 1);
}

/// What bypasses the log reaches every log reader at its periodic check:
/// an item deleted with the client (as another tool, or DynamoDB's TTL
/// deletion of an `item_ttl` endpoint, would) leaves both readers' state,
/// and the one written beside it stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_removed_behind_the_logs_back_leaves_every_reader() {
    let (cfg, _moto) = table().await;
    let cfg = cfg.with_changelog_check_interval(std::time::Duration::from_secs(1));
    let writer = changelog_registry(&cfg).await;
    let readers = [
        changelog_registry(&cfg).await,
        changelog_registry(&cfg).await,
    ];
    let mut streams: Vec<EventStream> = readers.iter().map(|r| r.watch(None)).collect();
    let svc = unique("behind");
    let (gone, kept) = (
        Endpoint::new(&svc, "gone", "10.0.0.1", 80),
        Endpoint::new(&svc, "kept", "10.0.0.2", 80),
    );
    writer.register(gone.clone()).await.unwrap();
    writer.register(kept.clone()).await.unwrap();
    let both: BTreeMap<_, _> = [(gone.key(), gone.clone()), (kept.key(), kept.clone())].into();
    let mut states = vec![BTreeMap::new(); streams.len()];
    let mut hist = Histories::new();
    for (stream, state) in streams.iter_mut().zip(states.iter_mut()) {
        follow_to(stream, state, &mut hist, &both, false).await;
    }
    let out = writer
        .client()
        .delete_item()
        .table_name(writer.table())
        .key("service", AttributeValue::S(svc.clone()))
        .key("id", AttributeValue::S("gone".into()))
        .return_values(waypost_dynamodb::aws_sdk_dynamodb::types::ReturnValue::AllOld)
        .send()
        .await
        .unwrap();
    assert!(
        out.attributes.is_some(),
        "the item was not where the crate docs put it"
    );
    let only_kept: BTreeMap<_, _> = [(kept.key(), kept.clone())].into();
    for (stream, state) in streams.iter_mut().zip(states.iter_mut()) {
        follow_to(stream, state, &mut hist, &only_kept, false).await;
    }
}

/// Four registries write one table whose log has four heads, every batch
/// touching keys of several heads and every writer sharing keys with the
/// others: each head's entries run from 1 to its head without a hole,
/// each key's changes are all on the head `changelog_head_of` names, and
/// two readers see every key's history as the logs record it. A registry
/// set to another number of heads is refused, naming the setting, and
/// writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_heads_every_reader_sees_each_keys_history_in_order() {
    let heads = 4u32;
    let (cfg, moto) = table().await;
    let proxy = RecordingProxy::start_serial(moto.url()).await;
    let cfg = cfg
        .with_endpoint_url(&proxy.url)
        .with_changelog_heads(heads);
    let mut writers = Vec::new();
    for _ in 0..4 {
        writers.push(changelog_registry(&cfg).await);
    }
    let readers = [
        changelog_registry(&cfg).await,
        changelog_registry(&cfg).await,
    ];
    let mut streams: Vec<EventStream> = readers.iter().map(|r| r.watch(None)).collect();
    let mut states = [BTreeMap::new(), BTreeMap::new()];
    let mut hists = [Histories::new(), Histories::new()];
    for s in streams.iter_mut() {
        assert!(first_snapshot(s, "the first state").await.is_empty());
    }
    let svc = unique("heads");
    let batches = 12u16;
    let write = |w: u16| {
        let reg = &writers[w as usize];
        let svc = svc.clone();
        async move {
            for j in 0..batches {
                let port = w * 100 + j + 1;
                let mut ops: Vec<Op> = (0..3)
                    .map(|k| {
                        Op::Register(Endpoint::new(
                            &svc,
                            format!("shared-{}", (j + k) % 6),
                            "10.0.0.2",
                            port,
                        ))
                    })
                    .collect();
                if j % 4 == 3 {
                    ops.push(Op::Deregister(EndpointKey::new(
                        &svc,
                        format!("shared-{}", (j + 4) % 6),
                    )));
                }
                reg.apply(ops).await.unwrap();
            }
        }
    };
    futures::future::join4(write(0), write(1), write(2), write(3)).await;

    let mut truth = Histories::new();
    let mut used = 0;
    for h in 0..heads {
        let partition = if h == 0 {
            LOG.to_string()
        } else {
            format!("{LOG}/{h}")
        };
        let items = partition_items(&readers[0], &partition).await;
        let Some((_, head_item)) = items.iter().find(|(id, _)| id == HEAD) else {
            continue;
        };
        used += 1;
        assert_eq!(head_item["heads"].as_n().unwrap(), &heads.to_string());
        let top: usize = head_item["v"].as_n().unwrap().parse().unwrap();
        let entries: Vec<_> = items.iter().filter(|(id, _)| id != HEAD).collect();
        assert_eq!(entries.len(), top, "head {h}: one entry per version");
        for (i, (id, item)) in entries.iter().enumerate() {
            assert_eq!(id, &format!("v{:020}", i + 1), "head {h}");
            let mut changed = Vec::new();
            for v in item["del"].as_l().unwrap() {
                let m = v.as_m().unwrap();
                let key = EndpointKey::new(m["service"].as_s().unwrap(), m["id"].as_s().unwrap());
                changed.push((key, None));
            }
            for v in item["put"].as_l().unwrap() {
                let m = v.as_m().unwrap();
                let key = EndpointKey::new(m["service"].as_s().unwrap(), m["id"].as_s().unwrap());
                changed.push((key, Some(m["port"].as_n().unwrap().parse().unwrap())));
            }
            for (key, port) in changed {
                assert_eq!(
                    waypost_dynamodb::changelog_head_of(&key, heads),
                    h,
                    "{key} on head {h}"
                );
                push(&mut truth, key, port);
            }
        }
    }
    assert!(used > 1, "the keys should spread over several heads");
    let want = table_state(&readers[0]).await;
    for (k, h) in &truth {
        assert_eq!(
            want.get(k).map(|e| e.port),
            *h.last().unwrap(),
            "{k}: log and table disagree"
        );
    }
    for (i, s) in streams.iter_mut().enumerate() {
        follow_to(s, &mut states[i], &mut hists[i], &want, false).await;
        assert_eq!(hists[i], truth, "reader {i} saw another history");
    }

    // Another number of heads: refused, and nothing written.
    let other = changelog_registry(&cfg.clone().with_changelog_heads(1)).await;
    let shared = (0..6)
        .map(|k| EndpointKey::new(&svc, format!("shared-{k}")))
        .find(|k| waypost_dynamodb::changelog_head_of(k, heads) == 0)
        .unwrap_or_else(|| EndpointKey::new(&svc, "shared-0"));
    let err = other
        .register(Endpoint::new(&svc, &shared.id, "10.9.9.9", 9))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("changelog_heads") && err.to_string().contains("4 head"),
        "{err}"
    );
    assert_eq!(table_state(&readers[0]).await, want, "nothing was written");
}
