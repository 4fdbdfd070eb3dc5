//! A counting simulation of many clusters syncing from one DynamoDB table:
//! no server, no clock; a model of the table's items with
//! their sizes, and of what each read costs as DynamoDB bills it.
//! Run with `cargo bench -p waypost-dynamodb --bench fleet`.
//!
//! The fleet: 50 clusters × 2 registrar replicas, 100,000 endpoints of
//! about 300 bytes, 1% of them changing per minute (80% updates, 10%
//! removals, 10% additions), each cluster writing its changes as one batch
//! per second, each replica syncing every 5 s at its own phase, for 10
//! simulated minutes. Two ways to sync:
//!
//! - **scan** (today's polling): a `Scan` of the whole table per sync;
//!   pages of 1 MB, each billed as its summed item size rounded up to
//!   4 KB, halved for eventually consistent reads.
//! - **changelog** (`WatchMode::ChangeLog`): a `Query` of the log entries
//!   after the replica's position, plus the head item; billed the same
//!   way, strongly consistent (the default) and eventually consistent.
//!
//! "What the changes weigh": the summed size of the endpoint items a
//! replica's sync had to learn about (a removal: its key), in read units
//! without rounding, at the same consistency. The goal of the issue is
//! changelog read units within 2× of that, whatever the table size; the
//! run is repeated with 10× the endpoints at the same change rate to show
//! it. Lines starting `RATIO` compare against the scan baseline or the
//! change weight computed in the same run.
//!
//! Item sizes follow DynamoDB's rules (attribute name + value bytes,
//! numbers about half their digits plus one, 3 bytes per map or list and
//! 1 per element), for the item layout and the log entry layout in the
//! crate docs.

#![allow(missing_docs)]

#[path = "common/rng.rs"]
mod rng;

use rng::Rng;

fn num(digits: usize) -> usize {
    digits.div_ceil(2) + 1
}

/// Size of one endpoint item: the attributes of the item layout with
/// values of typical lengths, labels padded to reach about 300 bytes.
fn endpoint_item_size(id_len: usize) -> usize {
    let attrs: &[(&str, usize)] = &[
        ("service", 18), // "payments-frontend"
        ("id", id_len),  // a pod name
        ("address", 11), // "10.12.34.56"
        ("protocol", 4), // "http"
        ("cluster", 12), // "prod-eu-w1-07"
        ("node", 28),    // a node name
        ("health", 7),   // "healthy"
    ];
    let strings: usize = attrs.iter().map(|(k, v)| k.len() + v).sum();
    let port = "port".len() + num(4);
    // labels: M of 4 labels, keys ~14, values ~12.
    let labels = "labels".len() + 3 + 4 * (1 + 14 + 12);
    strings + port + labels
}

/// Size of a key-only map (a removal in a log entry).
fn key_size(id_len: usize) -> usize {
    3 + 2 + ("service".len() + 18) + ("id".len() + id_len)
}

/// Size of a log entry holding `puts` endpoint items and `dels` keys.
fn entry_size(put_sizes: usize, n_puts: usize, del_sizes: usize, n_dels: usize) -> usize {
    let key = ("service".len() + "~registry changelog".len()) + ("id".len() + 21);
    let last = "last".len() + num(7);
    let ttl = "expires_at".len() + num(10);
    let put = "put".len() + 3 + put_sizes + n_puts * (1 + 3);
    let del = "del".len() + 3 + del_sizes + n_dels * (1 + 3);
    key + last + ttl + put + del
}

/// Size of the head item.
fn head_size() -> usize {
    ("service".len() + "~registry changelog".len()) + ("id".len() + 5) + ("v".len() + num(7))
}

const KB4: f64 = 4096.0;
const PAGE: usize = 1 << 20;

/// Read units of a paginated read of `sizes` (in order), as DynamoDB bills
/// `Query` and `Scan`: per page, the summed size rounded up to 4 KB;
/// halved when eventually consistent. Returns (requests, units).
fn billed(sizes: impl Iterator<Item = usize>, consistent: bool) -> (u64, f64) {
    let (mut requests, mut units, mut page) = (0u64, 0f64, 0usize);
    for s in sizes {
        if page + s > PAGE && page > 0 {
            requests += 1;
            units += (page as f64 / KB4).ceil();
            page = 0;
        }
        page += s;
    }
    requests += 1;
    units += (page as f64 / KB4).ceil().max(1.0);
    (requests, if consistent { units } else { units / 2.0 })
}

/// [`billed`] for `n` items of `size` bytes each, without iterating.
fn billed_uniform(n: usize, size: usize, consistent: bool) -> (u64, f64) {
    let per_page = (PAGE / size).max(1);
    let (full, rest) = (n / per_page, n % per_page);
    let page_units = ((per_page * size) as f64 / KB4).ceil();
    let mut units = full as f64 * page_units;
    let mut requests = full as u64;
    if rest > 0 || full == 0 {
        requests += 1;
        units += ((rest * size) as f64 / KB4).ceil().max(1.0);
    }
    (requests, if consistent { units } else { units / 2.0 })
}

struct Params {
    clusters: usize,
    replicas: usize,
    endpoints: usize,
    changes_per_min: usize,
    interval_ms: u64,
    flush_ms: u64,
    minutes: u64,
}

#[derive(Default, Debug)]
struct Totals {
    syncs: u64,
    requests: u64,
    rcu: f64,
    bytes: u64,
}

impl Totals {
    fn add(&mut self, requests: u64, rcu: f64, bytes: usize) {
        self.syncs += 1;
        self.requests += requests;
        self.rcu += rcu;
        self.bytes += bytes as u64;
    }
}

/// One log entry (one batch of one cluster).
struct LogEntry {
    size: usize,
    /// When each change in it was made (for propagation).
    made_ms: Vec<u64>,
}

struct Outcome {
    scan: Totals,
    log_strong: Totals,
    log_eventual: Totals,
    /// Change weight seen by replicas, in bytes (summed over syncs).
    change_bytes: u64,
    table_bytes: usize,
    entries: usize,
    /// Delay from a change being made to the last replica seeing it, ms.
    reach_ms: Vec<u64>,
    write_wcu_plain: f64,
    write_wcu_log: f64,
}

fn wcu(size: usize) -> f64 {
    // Transactional writes: 2 WCU per 1 KB (rounded up) per item.
    2.0 * (size as f64 / 1024.0).ceil().max(1.0)
}

fn simulate(p: &Params) -> Outcome {
    let mut rng = Rng(0x5eed_2026);
    let id_len = 40;
    let item = endpoint_item_size(id_len);
    let key = key_size(id_len);
    let mut live = p.endpoints;
    let readers = p.clusters * p.replicas;
    let end_ms = p.minutes * 60_000;
    let tick = 100u64;
    // Pending changes per cluster: (made at, is_removal).
    let mut pending: Vec<Vec<(u64, bool)>> = vec![Vec::new(); p.clusters];
    let mut log: Vec<LogEntry> = Vec::new();
    let mut prefix_size: Vec<usize> = vec![0];
    let mut prefix_change: Vec<usize> = vec![0];
    let phase: Vec<u64> = (0..readers).map(|_| rng.below(p.interval_ms)).collect();
    let flush_phase: Vec<u64> = (0..p.clusters).map(|_| rng.below(p.flush_ms)).collect();
    let mut pos = vec![0usize; readers];
    // Per entry, how many replicas have read it, and when the last did.
    let mut seen_by = Vec::<usize>::new();
    let mut reach_ms = Vec::new();
    let mut out = Outcome {
        scan: Totals::default(),
        log_strong: Totals::default(),
        log_eventual: Totals::default(),
        change_bytes: 0,
        table_bytes: 0,
        entries: 0,
        reach_ms: Vec::new(),
        write_wcu_plain: 0.0,
        write_wcu_log: 0.0,
    };
    let per_tick = p.changes_per_min as f64 * tick as f64 / 60_000.0;
    let mut owed = 0.0;
    let mut t = 0;
    while t < end_ms {
        // Changes made in this tick, each in a random cluster.
        owed += per_tick;
        while owed >= 1.0 {
            owed -= 1.0;
            let c = rng.below(p.clusters as u64) as usize;
            let kind = rng.below(10);
            let removal = kind == 0;
            if kind == 1 {
                live += 1;
            } else if removal {
                live -= 1;
            }
            pending[c].push((t + rng.below(tick), removal));
        }
        // Each cluster flushes once per `flush_ms`, at its own phase.
        for (c, q) in pending.iter_mut().enumerate() {
            if t % p.flush_ms != flush_phase[c] / tick * tick || q.is_empty() {
                continue;
            }
            let dels = q.iter().filter(|(_, r)| *r).count();
            let puts = q.len() - dels;
            let change_bytes = puts * item + dels * key;
            let size = entry_size(puts * item, puts, dels * key, dels);
            let plain: f64 = (0..puts).map(|_| wcu(item)).sum::<f64>()
                + (0..dels).map(|_| wcu(key)).sum::<f64>();
            out.write_wcu_plain += plain;
            out.write_wcu_log += plain + wcu(head_size()) + wcu(size);
            log.push(LogEntry {
                size,
                made_ms: q.drain(..).map(|(m, _)| m).collect(),
            });
            prefix_size.push(prefix_size.last().copied().unwrap_or(0) + size);
            prefix_change.push(prefix_change.last().copied().unwrap_or(0) + change_bytes);
            seen_by.push(0);
        }
        // Replicas whose sync falls in this tick.
        let table_bytes = live * item;
        for r in 0..readers {
            if t % p.interval_ms != phase[r] / tick * tick {
                continue;
            }
            let (rq, units) = billed_uniform(live, item, false);
            out.scan.add(rq, units, table_bytes);
            let head = log.len();
            let sizes = log[pos[r]..head]
                .iter()
                .map(|e| e.size)
                .chain(std::iter::once(head_size()));
            let bytes = prefix_size[head] - prefix_size[pos[r]] + head_size();
            let (rq, units) = billed(sizes.clone(), true);
            out.log_strong.add(rq, units, bytes);
            let (rq, units) = billed(sizes, false);
            out.log_eventual.add(rq, units, bytes);
            out.change_bytes += (prefix_change[head] - prefix_change[pos[r]]) as u64;
            for (i, e) in log.iter().enumerate().take(head).skip(pos[r]) {
                seen_by[i] += 1;
                if seen_by[i] == readers {
                    reach_ms.extend(e.made_ms.iter().map(|m| t - m));
                }
            }
            pos[r] = head;
        }
        t += tick;
    }
    out.table_bytes = live * item;
    out.entries = log.len();
    reach_ms.sort_unstable();
    out.reach_ms = reach_ms;
    out
}

fn mb(b: f64) -> String {
    if b >= 1e6 {
        format!("{:.1} MB", b / 1e6)
    } else {
        format!("{:.1} KB", b / 1e3)
    }
}

fn report(label: &str, p: &Params) -> (f64, f64) {
    let o = simulate(p);
    let secs = (p.minutes * 60) as f64;
    let readers = (p.clusters * p.replicas) as f64;
    println!(
        "== {label}: {} endpoints ({} in the table at the end), {} clusters x {} replicas, sync every {} ms, {} changes/min, batches every {} ms per cluster, {} simulated minutes, {} log entries",
        p.endpoints,
        mb(o.table_bytes as f64),
        p.clusters,
        p.replicas,
        p.interval_ms,
        p.changes_per_min,
        p.flush_ms,
        p.minutes,
        o.entries
    );
    let line = |name: &str, t: &Totals| {
        let n = t.syncs as f64;
        println!(
            "{name:<24} per sync per replica: {:>7.2} requests {:>9.2} RCU {:>10}; all replicas: {:>9.1} requests/s {:>10.1} RCU/s {:>10}/s",
            t.requests as f64 / n,
            t.rcu / n,
            mb(t.bytes as f64 / n),
            t.requests as f64 / secs,
            t.rcu / secs,
            mb(t.bytes as f64 / secs),
        );
    };
    line("scan (eventual)", &o.scan);
    line("changelog (consistent)", &o.log_strong);
    line("changelog (eventual)", &o.log_eventual);
    let n = o.log_strong.syncs as f64;
    let weight_strong = o.change_bytes as f64 / KB4;
    let weight_eventual = weight_strong / 2.0;
    println!(
        "{:<24} per sync per replica: {:>10} = {:.2} RCU consistent, {:.2} eventual",
        "what the changes weigh",
        mb(o.change_bytes as f64 / n),
        weight_strong / n,
        weight_eventual / n
    );
    let pct = |q: f64| {
        let v = &o.reach_ms;
        v.get(((v.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0) as f64
            / 1000.0
    };
    println!(
        "change reaches all {} replicas of all {} clusters (made -> last replica synced), both modes: p50 {:.1} s, p99 {:.1} s, max {:.1} s ({} changes)",
        readers,
        p.clusters,
        pct(0.5),
        pct(0.99),
        pct(1.0),
        o.reach_ms.len()
    );
    println!(
        "writes: {:.1} WCU/s without the log, {:.1} WCU/s with it",
        o.write_wcu_plain / secs,
        o.write_wcu_log / secs
    );
    let r_strong = o.log_strong.rcu / weight_strong;
    let r_eventual = o.log_eventual.rcu / weight_eventual;
    println!("RATIO {label} changelog_rcu/change_weight consistent = {r_strong:.2}");
    println!("RATIO {label} changelog_rcu/change_weight eventual = {r_eventual:.2}");
    println!(
        "RATIO {label} scan_rcu/changelog_rcu (eventual scan vs consistent log) = {:.0}",
        o.scan.rcu / o.log_strong.rcu
    );
    println!(
        "RATIO {label} write_wcu with/without log = {:.2}",
        o.write_wcu_log / o.write_wcu_plain
    );
    (o.log_strong.rcu / secs, o.scan.rcu / secs)
}

fn main() {
    let base = Params {
        clusters: 50,
        replicas: 2,
        endpoints: 100_000,
        changes_per_min: 1_000,
        interval_ms: 5_000,
        flush_ms: 1_000,
        minutes: 10,
    };
    println!(
        "endpoint item {} bytes, log head {} bytes",
        endpoint_item_size(40),
        head_size()
    );
    let (log_small, scan_small) = report("100k", &base);
    let big = Params {
        endpoints: 1_000_000,
        ..base
    };
    let (log_big, scan_big) = report("1M", &big);
    println!(
        "RATIO changelog_rcu 1M/100k endpoints (same change rate) = {:.2}",
        log_big / log_small
    );
    println!(
        "RATIO scan_rcu 1M/100k endpoints (same change rate) = {:.2}",
        scan_big / scan_small
    );
}
