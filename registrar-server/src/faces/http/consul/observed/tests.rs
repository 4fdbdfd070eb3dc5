//! The judging and coalescing of [`super::Observations`] on injected
//! clocks: replicas simulated with their own wall clocks and sync delays
//! over one stored endpoint, ticking and reporting on one monotonic run.

#![allow(clippy::unwrap_used)]

use super::*;

/// The TTL of the checks below, in ms.
const TTL: u64 = 10_000;
/// The runner's tick, in ms.
const TICK: u64 = 250;
/// Some wall-clock time (ms since the Unix epoch).
const WALL: u64 = 1_800_000_000_000;
const ID: &str = "service:web-1";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn ttl_check(status: Status, wall_ms: u64) -> Check {
    Check {
        name: "t".into(),
        probe: Probe::Ttl { ttl_ms: TTL },
        deregister_after_ms: None,
        status,
        output: String::new(),
        since_ms: wall_ms,
        expires_ms: Some(wall_ms + TTL),
        reports: 0,
        damping: Default::default(),
    }
}

fn endpoint(c: &Check) -> Endpoint {
    let mut e = Endpoint::new("web", "web-1", "10.0.0.1", 80);
    check::put(&mut e, ID, c);
    e
}

fn stored(e: &Endpoint) -> Check {
    check::check(e, ID).unwrap()
}

/// One replica: what it observed, its wall clock (ms since the Unix
/// epoch at each ms of the run), and how long it takes to see another
/// replica's write (the backend's sync, its runner's tick); its own
/// writes it sees at once, as the registrar does.
struct Replica {
    seen: Observations,
    wall: fn(u64) -> u64,
    lag: u64,
}

impl Replica {
    fn new(wall: fn(u64) -> u64, lag: u64) -> Self {
        Self {
            seen: Observations::default(),
            wall,
            lag,
        }
    }
}

/// A write to the backend: when (ms of the run), by which replica.
struct Write {
    at: u64,
    by: usize,
    endpoint: Endpoint,
}

/// Replicas sharing one stored endpoint through a backend, on one
/// run's monotonic time (`ms` since `t0`).
struct Cluster {
    t0: Instant,
    writes: Vec<Write>,
    replicas: Vec<Replica>,
    /// Reports recorded.
    reports_written: usize,
    /// When the last report was recorded.
    last_write: u64,
}

impl Cluster {
    /// A passing check, registered through replica 0 at 0 ms.
    fn new(replicas: Vec<Replica>) -> Self {
        let wall = (replicas[0].wall)(0);
        Self {
            t0: Instant::now(),
            writes: vec![Write {
                at: 0,
                by: 0,
                endpoint: endpoint(&ttl_check(Status::Passing, wall)),
            }],
            replicas,
            reports_written: 0,
            last_write: 0,
        }
    }

    /// What replica `r`'s state holds at `at` ms: the latest write it
    /// has seen.
    fn view(&self, r: usize, at: u64) -> Option<Endpoint> {
        let lag = self.replicas[r].lag;
        self.writes
            .iter()
            .rev()
            .find(|w| w.at + if w.by == r { 0 } else { lag } <= at)
            .map(|w| w.endpoint.clone())
    }

    /// A pass reported to replica `r` at `at` ms: whether it was
    /// recorded.
    fn report(&mut self, r: usize, at: u64) -> bool {
        let Some(e) = self.view(r, at) else {
            return false;
        };
        let replica = &self.replicas[r];
        let now = self.t0 + ms(at);
        let wall = (replica.wall)(at);
        let Some(endpoint) = replica.seen.report(&e, ID, Status::Passing, "", now, wall) else {
            return false;
        };
        self.writes.push(Write {
            at,
            by: r,
            endpoint,
        });
        self.reports_written += 1;
        self.last_write = at;
        true
    }

    /// Every replica's runner ticks at `at` ms, writing the check
    /// critical as the runner does when it finds it lapsed; which
    /// replicas found it lapsed.
    fn tick(&mut self, at: u64) -> Vec<bool> {
        let now = self.t0 + ms(at);
        let mut lapsed = Vec::new();
        for r in 0..self.replicas.len() {
            let Some(e) = self.view(r, at) else {
                lapsed.push(false);
                continue;
            };
            let c = stored(&e);
            let seen = self.replicas[r].seen.observe(&e.key(), ID, &c, now);
            let lapses = seen.ttl_lapsed(&c, now);
            if lapses {
                let endpoint = check::with_status(&e, ID, Status::Critical, "TTL expired").unwrap();
                self.writes.push(Write {
                    at,
                    by: r,
                    endpoint,
                });
            }
            lapsed.push(lapses);
        }
        lapsed
    }

    /// Tick from `from` ms (excluded) to `to` ms (included); whether
    /// any replica found the check lapsed.
    fn ticks(&mut self, from: u64, to: u64) -> bool {
        let mut any = false;
        let mut at = from - from % TICK + TICK;
        while at <= to {
            any |= self.tick(at).contains(&true);
            at += TICK;
        }
        any
    }

    /// The check's status as replica `r` sees it at `at` ms.
    fn status(&self, r: usize, at: u64) -> Option<Status> {
        self.view(r, at).map(|e| stored(&e).status)
    }
}

/// Reports to replicas `to(n)` every `every` ms (a multiple of the
/// tick) for `runs` TTLs, the runners ticking all along: no replica may
/// find the check lapsed.
fn keep_reporting(cluster: &mut Cluster, every: u64, runs: u64, to: fn(u64) -> usize) {
    let mut at = 0;
    let mut n = 0;
    while at < runs * TTL {
        cluster.report(to(n), at);
        assert!(
            !cluster.ticks(at.saturating_sub(1), at + every - 1),
            "the check lapsed between {at} and {} ms although reports kept coming",
            at + every
        );
        at += every;
        n += 1;
    }
    let end = at;
    for r in 0..cluster.replicas.len() {
        assert_eq!(cluster.status(r, end), Some(Status::Passing));
    }
}

/// With no more reports, the check lapses at the tick a TTL after the
/// last recorded report (reports fall on ticks here), not before, and
/// every replica shows it critical once it has seen that write.
fn lapses_a_ttl_after_the_last_recorded_report(cluster: &mut Cluster) {
    let due = cluster.last_write + TTL;
    assert!(!cluster.ticks(cluster.last_write.saturating_sub(1), due - TICK));
    assert!(cluster.tick(due).contains(&true));
    let slowest = cluster.replicas.iter().map(|r| r.lag).max().unwrap_or(0);
    cluster.ticks(due, due + slowest);
    for r in 0..cluster.replicas.len() {
        assert_eq!(cluster.status(r, due + slowest), Some(Status::Critical));
    }
}

#[test]
fn reports_alternating_between_replicas_with_skewed_wall_clocks_keep_a_check_passing() {
    // Replica 1's wall clock is two TTLs ahead of replica 0's; each
    // sees the other's writes two ticks late.
    let mut cluster = Cluster::new(vec![
        Replica::new(|at| WALL + at, 2 * TICK),
        Replica::new(|at| WALL + at + 2 * TTL, 2 * TICK),
    ]);
    keep_reporting(&mut cluster, TTL / 4, 5, |n| (n % 2) as usize);
    // About two writes per TTL (and the first report to each replica),
    // and reports were recorded all along.
    let written = cluster.reports_written;
    assert!(written <= 2 * 5 + 2, "{written} writes");
    assert!(written >= 5, "{written} writes");
    lapses_a_ttl_after_the_last_recorded_report(&mut cluster);
}

#[test]
fn reports_alternating_between_replicas_that_see_each_other_late_keep_a_check_passing() {
    // Each replica alone hears from the service less often than the
    // TTL, and sees the other's writes almost a quarter TTL late.
    let mut cluster = Cluster::new(vec![
        Replica::new(|at| WALL + at, 9 * TICK),
        Replica::new(|at| WALL + at + 2 * TTL, 9 * TICK),
    ]);
    keep_reporting(&mut cluster, 6 * TTL / 10, 6, |n| (n % 2) as usize);
    lapses_a_ttl_after_the_last_recorded_report(&mut cluster);
}

#[test]
fn a_wall_clock_stepped_back_ten_minutes_neither_expires_nor_holds_a_check() {
    // Stepped back ten minutes two TTLs into the run.
    let stepped = |at| {
        if at < 2 * TTL {
            WALL + at
        } else {
            WALL + at - 600_000
        }
    };
    let mut one = Cluster::new(vec![Replica::new(stepped, 0)]);
    keep_reporting(&mut one, 3_000, 5, |_| 0);
    // What was recorded after the step looks long expired by the wall
    // clock: the check stayed passing all the same.
    let c = stored(&one.writes.last().unwrap().endpoint);
    assert!(c.expires_ms.unwrap() < WALL + 2 * TTL, "{c:?}");
    lapses_a_ttl_after_the_last_recorded_report(&mut one);
    // Two replicas, one of them stepped back: alternating reports too.
    let mut two = Cluster::new(vec![
        Replica::new(|at| WALL + at, 2 * TICK),
        Replica::new(stepped, 2 * TICK),
    ]);
    keep_reporting(&mut two, 3_000, 5, |n| (n % 2) as usize);
    lapses_a_ttl_after_the_last_recorded_report(&mut two);
}

#[test]
fn a_deadline_stamped_two_ttls_ahead_does_not_hold_a_check_past_its_ttl() {
    let mut cluster = Cluster::new(vec![
        Replica::new(|at| WALL + at, 0),
        Replica::new(|at| WALL + at + 2 * TTL, 0),
    ]);
    cluster.tick(0);
    // Recorded by the replica whose clock is ahead: the stored deadline
    // is three TTLs past the other's wall clock.
    assert!(cluster.report(1, TTL / 2));
    let c = stored(&cluster.writes.last().unwrap().endpoint);
    assert_eq!(c.expires_ms, Some(WALL + TTL / 2 + 3 * TTL));
    lapses_a_ttl_after_the_last_recorded_report(&mut cluster);
}

#[test]
fn first_sight_gives_a_full_ttl_of_grace() {
    // Stored long ago: its wall deadline passed an hour ago.
    let c = ttl_check(Status::Passing, WALL - 3_600_000);
    let e = endpoint(&c);
    let seen = Observations::default();
    let t0 = Instant::now();
    let first = seen.observe(&e.key(), ID, &c, t0);
    assert!(first.first && !first.seen_change);
    assert!(!first.ttl_lapsed(&c, t0 + ms(TTL - 1)));
    let later = seen.observe(&e.key(), ID, &c, t0 + ms(TTL));
    assert!(!later.first);
    assert!(later.ttl_lapsed(&c, t0 + ms(TTL)));
    // A critical TTL check does not lapse again.
    let critical = ttl_check(Status::Critical, WALL);
    assert!(!later.ttl_lapsed(&critical, t0 + ms(2 * TTL)));
}

#[test]
fn reports_are_written_on_a_change_of_state_first_sight_or_half_a_ttl_after_the_last_change_seen() {
    let e = endpoint(&ttl_check(Status::Passing, WALL));
    let key = e.key();
    let seen = Observations::default();
    let t0 = Instant::now();
    // Never seen here: written.
    let e = seen.report(&e, ID, Status::Passing, "", t0, WALL).unwrap();
    assert_eq!(stored(&e).reports, 1);
    // The runner sees the write at once (the change is 0 ms old).
    assert!(seen.observe(&key, ID, &stored(&e), t0).seen_change);
    for at in [1, TTL / 4, TTL / 2 - 1] {
        let r = seen.report(&e, ID, Status::Passing, "", t0 + ms(at), WALL + at);
        assert!(
            r.is_none(),
            "a pass {at} ms after the last change was written"
        );
    }
    // A change of state is written at once.
    let at = t0 + ms(TTL / 2 - 1);
    let warn = seen
        .report(&e, ID, Status::Warning, "slow", at, WALL)
        .unwrap();
    assert_eq!(
        (stored(&warn).status, stored(&warn).reports),
        (Status::Warning, 2)
    );
    // Half a TTL after the last change seen: written, whatever the wall
    // clock says (here, stepped back).
    let half = seen
        .report(
            &e,
            ID,
            Status::Passing,
            "",
            t0 + ms(TTL / 2),
            WALL - 600_000,
        )
        .unwrap();
    let c = stored(&half);
    assert_eq!((c.reports, c.since_ms), (2, WALL));
    assert_eq!(c.expires_ms, Some(WALL - 600_000 + TTL));
}

#[test]
fn a_replica_that_hears_rarely_records_a_report_before_skipping_it_could_let_the_check_lapse() {
    // Two replicas' histories: both see the check, take a report at 0
    // (recorded), and see another replica record one at 8 s; one of
    // them takes another report at 8.5 s.
    let e0 = endpoint(&ttl_check(Status::Passing, WALL));
    let key = e0.key();
    let t0 = Instant::now();
    let mut e2 = None;
    let [rare, often] = [(); 2].map(|()| {
        let seen = Observations::default();
        seen.observe(&key, ID, &stored(&e0), t0);
        let e1 = seen.report(&e0, ID, Status::Passing, "", t0, WALL).unwrap();
        seen.observe(&key, ID, &stored(&e1), t0);
        let other = check::with_report(&e1, ID, Status::Passing, "", WALL + 8_000).unwrap();
        seen.observe(&key, ID, &stored(&other), t0 + ms(8_000));
        e2 = Some(other);
        seen
    });
    let e2 = e2.unwrap();
    // 0.5 s after the change, 8.5 s after its previous report: were
    // the next as far off, it would come before the TTL lapsed.
    let skipped = often.report(&e2, ID, Status::Passing, "", t0 + ms(8_500), WALL);
    assert!(skipped.is_none());
    // At 12 s the change is 4 s old: less than half a TTL. The replica
    // whose previous report was 12 s ago records it (another 12 s and
    // the TTL would have lapsed); the one that took one 3.5 s ago does
    // not.
    let at = t0 + ms(12_000);
    assert!(rare
        .report(&e2, ID, Status::Passing, "", at, WALL)
        .is_some());
    assert!(often
        .report(&e2, ID, Status::Passing, "", at, WALL)
        .is_none());
}

#[test]
fn a_report_recorded_by_an_earlier_release_counts_as_a_change() {
    let mut c = ttl_check(Status::Passing, WALL);
    c.reports = 7;
    let e = endpoint(&c);
    let seen = Observations::default();
    let t0 = Instant::now();
    seen.observe(&e.key(), ID, &c, t0);
    // An earlier release records a report: it moves the deadline and
    // drops the count it does not know.
    let mut old = c.clone();
    old.reports = 0;
    old.expires_ms = Some(WALL + 5_000 + TTL);
    let at = t0 + ms(5_000);
    let seen_then = seen.observe(&e.key(), ID, &old, at);
    assert_eq!(seen_then.changed, at);
    assert!(!seen_then.ttl_lapsed(&old, t0 + ms(5_000 + TTL - 1)));
    // The same state observed again is no change.
    let again = seen.observe(&e.key(), ID, &old, at + ms(TTL));
    assert_eq!(again.changed, at);
    assert!(again.ttl_lapsed(&old, at + ms(TTL)));
}

#[test]
fn deregister_after_counts_from_when_this_replica_saw_the_check_turn_critical() {
    let after = 60_000;
    // Critical since an hour ago by the wall clock that wrote it.
    let mut c = ttl_check(Status::Critical, WALL - 3_600_000);
    c.deregister_after_ms = Some(after);
    let e = endpoint(&c);
    let key = e.key();
    let seen = Observations::default();
    let t0 = Instant::now();
    let first = seen.observe(&key, ID, &c, t0);
    assert_eq!(first.critical_since, Some(t0));
    assert!(!first.deregister_due(&c, t0 + ms(after - 1)));
    // A `fail` report (a change, still critical) does not start it again.
    c.reports += 1;
    let failed = seen.observe(&key, ID, &c, t0 + ms(after / 2));
    assert_eq!(failed.critical_since, Some(t0));
    assert!(failed.deregister_due(&c, t0 + ms(after)));
    // Passing, then critical again: counted from the new turn.
    c.status = Status::Passing;
    let passing = seen.observe(&key, ID, &c, t0 + ms(after));
    assert_eq!(passing.critical_since, None);
    assert!(!passing.deregister_due(&c, t0 + ms(2 * after)));
    c.status = Status::Critical;
    let turned = t0 + ms(after + 1);
    let critical = seen.observe(&key, ID, &c, turned);
    assert_eq!(critical.critical_since, Some(turned));
    assert!(!critical.deregister_due(&c, turned + ms(after - 1)));
    assert!(critical.deregister_due(&c, turned + ms(after)));
    // Without `DeregisterCriticalServiceAfter`, never.
    c.deregister_after_ms = None;
    assert!(!critical.deregister_due(&c, turned + ms(10 * after)));
}

#[test]
fn checks_no_longer_observed_are_forgotten() {
    let c = ttl_check(Status::Passing, WALL);
    let (a, b) = (EndpointKey::new("web", "a"), EndpointKey::new("web", "b"));
    let seen = Observations::default();
    let t0 = Instant::now();
    seen.observe(&a, ID, &c, t0);
    seen.observe(&b, ID, &c, t0);
    seen.observe(&b, "other", &c, t0);
    assert_eq!(seen.len(), 3);
    // The next tick observes only `a`'s check.
    let tick = t0 + ms(TICK);
    seen.observe(&a, ID, &c, tick);
    seen.forget_unseen(tick);
    assert_eq!(seen.len(), 1);
    assert!(!seen.observe(&a, ID, &c, tick).first);
    // Seen again after it was forgotten: a first sight.
    assert!(seen.observe(&b, ID, &c, tick).first);
}
