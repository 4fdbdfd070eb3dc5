//! [`SharedLiveness`] over a table in memory, with the sweeper's monotonic
//! clock injected ([`SharedLiveness::sweep_at`]) and other processes'
//! records written with wall clocks off by minutes.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::*;
use crate::model::Version;

#[derive(Default)]
struct Memory {
    endpoints: BTreeMap<EndpointKey, Endpoint>,
    records: BTreeMap<String, NodeRecord>,
    touches: usize,
}

/// A [`NodeTable`] in memory that keeps the contract to the letter.
#[derive(Default)]
struct Table(Mutex<Memory>);

impl Table {
    fn mem(&self) -> MutexGuard<'_, Memory> {
        lock(&self.0)
    }

    fn put(&self, e: Endpoint) {
        self.mem().endpoints.insert(e.key(), e);
    }

    fn health(&self, id: &str) -> Option<Health> {
        let mem = self.mem();
        mem.endpoints
            .values()
            .find(|e| e.id == id)
            .map(|e| e.health)
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("memory table")
    }
}

#[async_trait]
impl NodeTable for Table {
    async fn endpoints(&self) -> Result<Snapshot> {
        let eps: Vec<Endpoint> = self.mem().endpoints.values().cloned().collect();
        Ok(Snapshot::from_endpoints(Version(1), eps))
    }

    async fn service_endpoints(&self, service: &str) -> Result<Vec<Endpoint>> {
        let mem = self.mem();
        Ok(mem
            .endpoints
            .values()
            .filter(|e| e.service == service)
            .cloned()
            .collect())
    }

    async fn node_records(&self) -> Result<Vec<NodeRecord>> {
        Ok(self.mem().records.values().cloned().collect())
    }

    async fn touch(&self, node: &str, at_ms: u64, create: bool) -> Result<Option<NodeRecord>> {
        let mut mem = self.mem();
        mem.touches += 1;
        let before = mem.records.get(node).cloned();
        if before.is_none() && !create {
            return Ok(None);
        }
        let rec = mem
            .records
            .entry(node.to_string())
            .or_insert_with(|| NodeRecord::new(node, at_ms));
        rec.beats += 1;
        rec.beat_ms = at_ms;
        Ok(before)
    }

    async fn admit(&self, node: &str, at_ms: u64) -> Result<()> {
        self.mem()
            .records
            .entry(node.to_string())
            .or_insert_with(|| NodeRecord::new(node, at_ms));
        Ok(())
    }

    async fn mark(&self, seen: &NodeRecord, endpoints: Vec<Endpoint>) -> Result<bool> {
        let mut mem = self.mem();
        match mem.records.get_mut(&seen.node) {
            Some(rec) if rec.heard() == seen.heard() => {
                rec.marked.extend(endpoints.iter().map(Endpoint::key));
            }
            _ => return Ok(false),
        }
        for e in endpoints {
            mem.endpoints.insert(e.key(), e);
        }
        Ok(true)
    }

    async fn revive(&self, node: &str, endpoints: Vec<Endpoint>) -> Result<()> {
        let mut mem = self.mem();
        for e in endpoints {
            mem.endpoints.insert(e.key(), e);
        }
        if let Some(rec) = mem.records.get_mut(node) {
            rec.marked.clear();
        }
        Ok(())
    }

    async fn remove(&self, seen: &NodeRecord, keys: Vec<EndpointKey>) -> Result<bool> {
        let mut mem = self.mem();
        match mem.records.get(&seen.node) {
            Some(rec) if rec.heard() == seen.heard() => {}
            _ => return Ok(false),
        }
        for k in keys {
            mem.endpoints.remove(&k);
        }
        mem.records.remove(&seen.node);
        Ok(true)
    }
}

const S: fn(u64) -> Duration = Duration::from_secs;
const MINUTE_MS: u64 = 60_000;

fn liveness() -> SharedLiveness {
    let cfg = LivenessConfig::default()
        .with_thresholds(S(30), S(300))
        .with_sweep_interval(S(2));
    SharedLiveness::new(cfg).expect("valid settings")
}

fn owned(id: &str, node: &str) -> Endpoint {
    Endpoint::new("api", id, "10.0.0.1", 80).with_node(node)
}

/// Another process records a heartbeat of `node` with its wall clock at
/// `wall_ms`.
async fn beat_from(table: &Table, node: &str, wall_ms: u64) {
    table.touch(node, wall_ms, true).await.expect("touch");
}

#[tokio::test]
async fn writers_whose_clocks_are_off_or_step_are_judged_by_their_changes() {
    let table = Table::default();
    let judge = liveness();
    let wall = now_ms();
    for i in 0..10 {
        table.put(owned(&format!("live-{i}"), &format!("n{i}")));
    }
    table.put(owned("quiet", "silent"));
    let t0 = Instant::now();
    // Ten live nodes recorded every 2 s by a process whose wall clock is
    // ten minutes ahead, then steps twenty minutes back; a silent node
    // recorded once. None of these wall times is ever compared with the
    // judge's.
    for step in 0..=20u64 {
        let writer = if step < 10 {
            wall + 10 * MINUTE_MS + step * 2_000
        } else {
            wall - 10 * MINUTE_MS + step * 2_000
        };
        for i in 0..10 {
            beat_from(&table, &format!("n{i}"), writer).await;
        }
        if step == 0 {
            beat_from(&table, "silent", writer).await;
        }
        let report = judge
            .sweep_at(&table, t0 + S(step * 2))
            .await
            .expect("sweep");
        assert!(!report.held, "self-preservation at {} s", step * 2);
        assert!(report.removed.is_empty(), "at {} s: {report:?}", step * 2);
        let marked_silent = step * 2 >= 30;
        assert_eq!(
            report.suspected,
            if step * 2 == 30 {
                vec!["silent".to_string()]
            } else {
                Vec::new()
            },
            "at {} s",
            step * 2
        );
        for i in 0..10 {
            assert_eq!(table.health(&format!("live-{i}")), Some(Health::Healthy));
        }
        let quiet = if marked_silent {
            Health::Unhealthy
        } else {
            Health::Healthy
        };
        assert_eq!(table.health("quiet"), Some(quiet), "at {} s", step * 2);
    }
}

#[tokio::test]
async fn a_node_first_seen_gets_a_full_grace_and_is_removed_after_remove_after() {
    let table = Table::default();
    let judge = liveness();
    table.put(owned("a", "old"));
    // Recorded long ago by the wall clock, and marked by another sweeper.
    table.mem().records.insert(
        "old".into(),
        NodeRecord::new("old", 1)
            .with_beats(7)
            .with_marked(vec![EndpointKey::new("api", "a")]),
    );
    let t0 = Instant::now();
    let report = judge.sweep_at(&table, t0).await.expect("sweep");
    assert_eq!(report, SweepReport::default());
    // Marked before, and nothing heard since: not revived.
    assert_eq!(table.mem().records["old"].marked.len(), 1);
    let report = judge.sweep_at(&table, t0 + S(299)).await.expect("sweep");
    assert!(report.removed.is_empty(), "{report:?}");
    let report = judge.sweep_at(&table, t0 + S(300)).await.expect("sweep");
    assert_eq!(report.removed, vec!["old".to_string()]);
    assert!(table.mem().endpoints.is_empty());
}

#[tokio::test]
async fn a_marked_node_heard_again_is_revived_by_the_next_sweep() {
    let table = Table::default();
    let judge = liveness();
    table.put(owned("a", "n"));
    let wall = now_ms();
    beat_from(&table, "n", wall).await;
    let t0 = Instant::now();
    judge.sweep_at(&table, t0).await.expect("sweep");
    let report = judge.sweep_at(&table, t0 + S(30)).await.expect("sweep");
    assert_eq!(report.suspected, vec!["n".to_string()]);
    assert_eq!(table.health("a"), Some(Health::Unhealthy));
    // Heard through another process, whose clock is behind: the count
    // moved, so the node is back.
    beat_from(&table, "n", wall - 20 * MINUTE_MS).await;
    judge.sweep_at(&table, t0 + S(32)).await.expect("sweep");
    assert_eq!(table.health("a"), Some(Health::Healthy));
    assert!(table.mem().records["n"].marked.is_empty());
}

#[tokio::test]
async fn heartbeats_write_the_record_once_per_third_of_suspect_after() {
    let table = Table::default();
    let judge = liveness();
    table.put(owned("a", "n"));
    for _ in 0..5 {
        judge.heartbeat(&table, "n").await.expect("heartbeat");
    }
    assert_eq!(
        table.mem().touches,
        2,
        "a failed touch, then the creating one"
    );
    assert_eq!(table.mem().records["n"].beats, 1);
    // Its own write counts at once: silent for nothing yet.
    let report = judge
        .sweep_at(&table, Instant::now() + S(29))
        .await
        .expect("sweep");
    assert!(report.suspected.is_empty(), "{report:?}");
}
