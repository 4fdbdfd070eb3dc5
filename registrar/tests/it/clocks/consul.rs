//! A Consul TTL check (the agent API on `--http-api-addr`) on two replicas
//! over one SQLite file, replica B's wall clock 2 × TTL ahead. The
//! service reports to the replicas in turn, so each alone hears a report
//! only every 2.4 s, more than the TTL: the check stays passing on both
//! while the reports come (3 TTLs and more), and once they stop it turns
//! critical on both within the TTL, the runner's tick, a sync and some
//! slack of the last report, and not before half a TTL (a report moves
//! the stored deadline only once it is within half a TTL).
//!
//! Every state each replica shows is read from its `/v1/watch` stream, so
//! a lapse between two reports is seen however short it is.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use super::{report, secs, since, Replica, CLUSTER, SLACK};
use crate::common::faketime::FakeClock;
use crate::common::http::{send_at, Sse};

const TTL: Duration = Duration::from_secs(2);
/// How often the registrar's check runner looks for lapsed checks.
const TICK: Duration = Duration::from_millis(250);
/// `--sync-interval`.
const SYNC: Duration = Duration::from_millis(200);
/// Between two reports (to alternate replicas): each replica alone hears
/// one every 2 × 1.2 s, more than the TTL; every report comes when the
/// stored deadline is within half a TTL, so each moves it.
const REPORT_EVERY: Duration = Duration::from_millis(1200);
/// Reports sent: 7.2 s of them (more than 3 TTLs), to B first, A last.
const REPORTS: u32 = 6;
const SERVICE_ID: &str = "web-1";
const CHECK: &str = "web-ttl";

/// The check's status in an endpoint as the registry stores it.
fn check_status(endpoint: &Value) -> Option<String> {
    let label = endpoint["labels"][format!("consul.check/{CHECK}")].as_str()?;
    let check: Value = serde_json::from_str(label).ok()?;
    check["status"].as_str().map(str::to_string)
}

/// Every status of the check one replica showed, in order, read from its
/// `/v1/watch` stream (with when the test read it); followed until dropped.
struct States {
    seen: Arc<Mutex<Vec<(Instant, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl States {
    async fn follow(http: SocketAddr) -> States {
        let seen = Arc::new(Mutex::new(Vec::<(Instant, String)>::new()));
        let mut sse = Sse::open_at(http, None).await;
        let task = {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                loop {
                    let ev = sse.next().await;
                    let endpoints = match ev.event.as_str() {
                        "snapshot" => ev.data["endpoints"].as_array().cloned().unwrap_or_default(),
                        "added" | "updated" => vec![ev.data["endpoint"].clone()],
                        _ => Vec::new(),
                    };
                    for e in endpoints.iter().filter(|e| e["id"] == SERVICE_ID) {
                        let Some(status) = check_status(e) else {
                            continue;
                        };
                        let mut seen = seen.lock().unwrap();
                        if seen.last().is_none_or(|(_, s)| *s != status) {
                            seen.push((Instant::now(), status));
                        }
                    }
                }
            })
        };
        States { seen, task }
    }

    fn all(&self) -> Vec<(Instant, String)> {
        self.seen.lock().unwrap().clone()
    }

    /// The status shown at `at`.
    fn at(&self, at: Instant) -> Option<String> {
        let all = self.all();
        all.iter()
            .rev()
            .find(|(t, _)| *t <= at)
            .map(|(_, s)| s.clone())
    }

    /// The first time after `from` that it showed `status`.
    fn first_after(&self, from: Instant, status: &str) -> Option<Instant> {
        self.all()
            .into_iter()
            .find(|(t, s)| *t > from && s == status)
            .map(|(t, _)| t)
    }
}

impl Drop for States {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_check_reported_to_replicas_in_turn_lapses_by_its_ttl_whatever_their_clocks() {
    let dir = tempfile::tempdir().unwrap();
    let args = vec![
        format!("--sqlite-path={}", dir.path().join("registry.db").display()),
        format!("--sync-interval={}ms", SYNC.as_millis()),
        format!("--cluster-name={CLUSTER}"),
    ];
    let a = Replica::start("A", &args, &[]).await;
    let fake = FakeClock::offset(2 * TTL.as_secs() as i64);
    let b = Replica::start("B", &args, &fake.env()).await;
    let replicas = [&a, &b];
    let states = [States::follow(a.http).await, States::follow(b.http).await];
    let body = json!({"Name": "web", "ID": SERVICE_ID, "Port": 8080,
        "Check": {"CheckID": CHECK, "TTL": format!("{}ms", TTL.as_millis()), "Status": "passing"}});
    let put = send_at(
        a.http,
        "PUT",
        "/v1/agent/service/register",
        Some(body.to_string()),
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.body);
    let both = async {
        while states.iter().any(|s| s.all().is_empty()) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let limit = Duration::from_secs(30);
    assert!(
        tokio::time::timeout(limit, both).await.is_ok(),
        "the check was not shown by both replicas within {limit:?}"
    );

    let start = Instant::now();
    let mut reports = Vec::new();
    for n in 0..REPORTS {
        tokio::time::sleep_until(start + REPORT_EVERY * n).await;
        let to = replicas[(n as usize + 1) % 2];
        let sent = Instant::now();
        let pass = send_at(
            to.http,
            "PUT",
            &format!("/v1/agent/check/pass/{CHECK}"),
            None,
        )
        .await;
        assert_eq!(pass.status, 200, "report to {}: {}", to.name, pass.body);
        reports.push((to.name, sent, Instant::now()));
    }
    let (_, last_sent, last_acked) = reports[reports.len() - 1];
    // From when the first report had reached both replicas.
    let passing_from = reports[0].2 + SYNC + TICK;
    let earliest = last_sent + TTL / 2;
    let deadline = last_acked + TTL + TICK + SYNC + SLACK;
    let lapsed = async {
        while !states
            .iter()
            .all(|s| s.first_after(last_sent, "critical").is_some())
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let _ = tokio::time::timeout_at(deadline, lapsed).await;

    let t = |at: Instant| since(start, at);
    let mut problems = Vec::new();
    for (r, s) in replicas.iter().zip(&states) {
        if s.at(passing_from).as_deref() != Some("passing") {
            problems.push(format!(
                "replica {} did not show the check passing at {}, once the first report \
                 had reached it ({:?})",
                r.name,
                t(passing_from),
                s.at(passing_from)
            ));
        }
        let lapses: Vec<String> = s
            .all()
            .into_iter()
            .filter(|(at, st)| *at > passing_from && *at <= last_sent && st != "passing")
            .map(|(at, st)| format!("{st} at {}", t(at)))
            .collect();
        if !lapses.is_empty() {
            problems.push(format!(
                "replica {} showed the check {} while reports came every {} (TTL {})",
                r.name,
                lapses.join(", "),
                secs(REPORT_EVERY),
                secs(TTL)
            ));
        }
        let bound = format!(
            "the last report was sent at {} and acknowledged at {}: critical between {} \
             (half the TTL {} after it) and {} (TTL + tick {} + sync {} + slack {})",
            t(last_sent),
            t(last_acked),
            t(earliest),
            secs(TTL),
            t(deadline),
            secs(TICK),
            secs(SYNC),
            secs(SLACK)
        );
        match s.first_after(last_sent, "critical") {
            None => problems.push(format!(
                "replica {} did not turn it critical after the last report; {bound}",
                r.name
            )),
            Some(at) if at > deadline || at < earliest => problems.push(format!(
                "replica {} showed it critical at {}; {bound}",
                r.name,
                t(at)
            )),
            Some(_) => {}
        }
    }
    if !problems.is_empty() {
        let sends: Vec<String> = reports
            .iter()
            .map(|(to, sent, _)| format!("{to} at {}", t(*sent)))
            .collect();
        problems.push(format!("reports: {}", sends.join(", ")));
        for (r, s) in replicas.iter().zip(&states) {
            let shown: Vec<String> = s
                .all()
                .into_iter()
                .map(|(at, st)| format!("{st} at {}", t(at)))
                .collect();
            problems.push(format!("replica {} showed: {}", r.name, shown.join(", ")));
        }
    }
    if let Err(problems) = report(
        &format!(
            "Consul TTL check, replica B's clock {} s ahead",
            2 * TTL.as_secs()
        ),
        &problems,
        &replicas,
    ) {
        panic!("{problems}");
    }
}
