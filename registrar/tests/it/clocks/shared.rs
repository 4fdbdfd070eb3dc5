//! Two replicas over one DynamoDB table, or one Cloud Map namespace (on
//! moto), replica B's wall clock off: 2 × suspect_after ahead, as far
//! behind, stepped back ten minutes while it runs, stepped forward ten
//! minutes while it runs. Six live agents heartbeat through each replica,
//! and one silent node registers once through each. Whatever B's clock
//! says, no live node is ever shown unhealthy or missing by either
//! replica, both silent nodes are marked unhealthy on both replicas
//! within suspect_after (+ two sweeps, a sync and some slack) of their
//! registration, and self-preservation never holds (two silent nodes in
//! fourteen are below its share).
//!
//! The four cases of a backend run at once, each on a table or namespace
//! of its own, on one moto; the two backends one after the other.

use std::time::Duration;

use tokio::time::Instant;
use waypost::testing::unique;

use super::{
    live_agents, liveness_flags, report, Replica, Sampler, Silent, SAMPLE_EVERY, STEP_SECS,
    SUSPECT, SYNC,
};
use crate::common::faketime::FakeClock;

/// Live agents per replica: with two silent nodes in fourteen, a sweep
/// that finds both silent at once stays under self-preservation's share
/// (0.15).
const LIVE_PER_REPLICA: u16 = 6;
/// `--remove-after`: longer than any case, so silent nodes stay marked.
const REMOVE_AFTER: Duration = Duration::from_secs(300);
/// How far into the silent nodes' silence B's clock is stepped.
const STEP_INTO_SILENCE: Duration = Duration::from_secs(2);
/// Every Cloud Map poll reads the services whose revision moved, and
/// every 10th reads them all (waypost-cloudmap's `full_poll_every`); on
/// moto a revision can move before the instances it counts show, so only
/// the full poll bounds when a change reaches a view.
const CLOUDMAP_FULL_POLL_EVERY: u32 = 10;
/// The backends' tests run one at a time (each starts moto, eight
/// replicas and 24 agents).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
/// Credentials for moto (any will do).
const AWS_ENV: [(&str, &str); 2] = [
    ("AWS_ACCESS_KEY_ID", "test"),
    ("AWS_SECRET_ACCESS_KEY", "test"),
];

/// Replica B's wall clock, against A's (the real one).
#[derive(Debug, Clone, Copy)]
enum BClock {
    Ahead,
    Behind,
    SteppedBack,
    SteppedForward,
}

impl BClock {
    const ALL: [BClock; 4] = [
        BClock::Ahead,
        BClock::Behind,
        BClock::SteppedBack,
        BClock::SteppedForward,
    ];

    fn describe(self) -> String {
        let twice = 2 * SUSPECT.as_secs();
        match self {
            BClock::Ahead => format!("{twice} s ahead (2 × suspect_after)"),
            BClock::Behind => format!("{twice} s behind (2 × suspect_after)"),
            BClock::SteppedBack => format!("stepped back {STEP_SECS} s at run time"),
            BClock::SteppedForward => format!("stepped forward {STEP_SECS} s at run time"),
        }
    }

    fn fake(self) -> FakeClock {
        let twice = 2 * SUSPECT.as_secs() as i64;
        match self {
            BClock::Ahead => FakeClock::offset(twice),
            BClock::Behind => FakeClock::offset(-twice),
            BClock::SteppedBack | BClock::SteppedForward => FakeClock::steppable(),
        }
    }

    /// The step made while the silent nodes are silent, if any.
    fn step(self) -> Option<i64> {
        match self {
            BClock::SteppedBack => Some(-STEP_SECS),
            BClock::SteppedForward => Some(STEP_SECS),
            BClock::Ahead | BClock::Behind => None,
        }
    }
}

/// The shared backend.
#[derive(Debug, Clone, Copy)]
enum Kind {
    #[cfg(feature = "dynamodb")]
    DynamoDb,
    #[cfg(feature = "cloudmap")]
    CloudMap,
}

impl Kind {
    /// The longest a change written by one replica may take to reach the
    /// other's view.
    fn reach(self) -> Duration {
        match self {
            #[cfg(feature = "dynamodb")]
            Kind::DynamoDb => SYNC,
            #[cfg(feature = "cloudmap")]
            Kind::CloudMap => SYNC * CLOUDMAP_FULL_POLL_EVERY,
        }
    }

    /// `serve`'s flags for a table or namespace `name` at moto `url`.
    fn args(self, url: &str, name: &str) -> Vec<String> {
        let mut args = match self {
            #[cfg(feature = "dynamodb")]
            Kind::DynamoDb => vec![
                "--registry-backend=dynamodb".to_string(),
                format!("--dynamodb-table={name}"),
                "--dynamodb-create-table".into(),
            ],
            #[cfg(feature = "cloudmap")]
            Kind::CloudMap => vec![
                "--registry-backend=cloudmap".to_string(),
                format!("--cloudmap-namespace={name}"),
            ],
        };
        args.push(format!("--aws-endpoint-url={url}"));
        args.push("--aws-region=us-east-1".into());
        args.extend(liveness_flags(REMOVE_AFTER));
        args
    }
}

/// One case: replicas A and B (B's clock per `clock`) on a new table or
/// namespace of `kind` at moto `url`.
async fn case(url: String, kind: Kind, clock: BClock) -> Result<(), String> {
    let fake = clock.fake();
    let args = kind.args(&url, &unique("clocks"));
    // One after the other: the first creates the table or namespace.
    let a = Replica::start("A", &args, &AWS_ENV).await;
    let mut env_b = AWS_ENV.to_vec();
    env_b.extend(fake.env());
    let b = Replica::start("B", &args, &env_b).await;
    let replicas = [&a, &b];
    let (mut live, mut agents) = live_agents(&a, "a", LIVE_PER_REPLICA).await;
    let (live_b, agents_b) = live_agents(&b, "b", LIVE_PER_REPLICA).await;
    live.extend(live_b);
    agents.extend(agents_b);
    let missing = |view: Option<Vec<_>>| -> Vec<String> {
        let view: Vec<waypost::Endpoint> = view.unwrap_or_default();
        live.iter()
            .filter(|e| !view.iter().any(|x| x.id == e.id))
            .map(|e| e.id.clone())
            .collect()
    };
    let limit = Instant::now() + Duration::from_secs(30);
    for r in replicas {
        loop {
            let gone = missing(r.view().await);
            if gone.is_empty() {
                break;
            }
            if Instant::now() > limit {
                return report(
                    &format!("{kind:?}, replica B's clock {}", clock.describe()),
                    &[format!(
                        "replica {} did not list live {gone:?} within 30 s of their registration",
                        r.name
                    )],
                    &replicas,
                );
            }
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
    }

    let mut sampler = Sampler::new(&live, 2, true);
    let silent = [
        Silent::register(&a, "silent-a").await,
        Silent::register(&b, "silent-b").await,
    ];
    for s in &silent {
        sampler.follow(&s.endpoint.id);
    }
    let step_at = silent[1].acked + STEP_INTO_SILENCE;
    let mut step = clock.step();
    let mut stepped = String::new();
    let end = silent
        .iter()
        .map(|s| s.mark_deadline(kind.reach()))
        .max()
        .unwrap_or(step_at);
    // Read both views until the later deadline, whatever they show: live
    // nodes must stay healthy all along.
    while Instant::now() < end {
        if let Some(secs) = step.filter(|_| Instant::now() >= step_at) {
            fake.step(secs);
            stepped = format!(" at {}", sampler.at(Instant::now()));
            step = None;
        }
        sampler.sample(&replicas).await;
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    let mut problems = Vec::new();
    for s in &silent {
        sampler.check_marked(&replicas, s, kind.reach(), &mut problems);
        println!(
            "clocks[{kind:?}]: B {}: {}",
            clock.describe(),
            sampler.marks(&replicas, s)
        );
    }
    sampler.check_views(&replicas, &mut problems);
    for r in replicas {
        let held = r.self_preservation().await;
        if held != Some(0.0) {
            problems.push(format!(
                "replica {}: registry_liveness_self_preservation is {held:?}, not 0",
                r.name
            ));
        }
    }
    for agent in agents {
        agent.abandon();
    }
    report(
        &format!("{kind:?}, replica B's clock {}{stepped}", clock.describe()),
        &problems,
        &replicas,
    )
}

/// The text of a case's panic.
fn panic_text(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".into()),
        Err(e) => e.to_string(),
    }
}

/// Run the four cases of `kind` at once on one moto; report every case.
async fn all_cases(kind: Kind) {
    let _one = ONE_AT_A_TIME.lock().await;
    let moto = waypost_fixtures::MotoServer::start_async().await.unwrap();
    let started = Instant::now();
    let tasks: Vec<_> = BClock::ALL
        .iter()
        .map(|&c| (c, tokio::spawn(case(moto.url().to_string(), kind, c))))
        .collect();
    let mut failed = Vec::new();
    for (clock, task) in tasks {
        match task.await {
            Ok(Ok(())) => println!("clocks[{kind:?}]: B {}: passed", clock.describe()),
            Ok(Err(problems)) => failed.push(problems),
            Err(e) => failed.push(format!("B {}: {}", clock.describe(), panic_text(e))),
        }
    }
    println!(
        "clocks[{kind:?}]: {} cases in {:.1} s",
        BClock::ALL.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        failed.is_empty(),
        "{} of {} cases on {kind:?} failed:\n\n{}",
        failed.len(),
        BClock::ALL.len(),
        failed.join("\n\n")
    );
}

#[cfg(feature = "dynamodb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_dynamodb_mark_only_silent_nodes_whatever_their_wall_clocks() {
    all_cases(Kind::DynamoDb).await;
}

#[cfg(feature = "cloudmap")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_cloudmap_mark_only_silent_nodes_whatever_their_wall_clocks() {
    all_cases(Kind::CloudMap).await;
}
