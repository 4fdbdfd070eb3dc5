//! One replica on a SQLite file whose wall clock is stepped ten minutes
//! forward, then ten minutes back, while it runs. Three live agents
//! heartbeat through it all along and are never shown unhealthy or
//! missing. A node that fell silent is marked unhealthy suspect_after
//! after its silence began and removed remove_after after it, both timed
//! on the process's own clock: the step forward, made right after the
//! mark, removes nothing early, and a step back made two seconds into a
//! silence does not put off its mark.

use std::time::Duration;

use tokio::time::Instant;

use super::{
    live_agents, liveness_flags, report, secs, Replica, Sampler, Silent, SAMPLE_EVERY, SLACK,
    STEP_SECS, SWEEP, SYNC,
};
use crate::common::faketime::FakeClock;

const LIVE: u16 = 3;
/// `--remove-after`: short, so the removal comes soon after the step.
const REMOVE_AFTER: Duration = Duration::from_secs(12);
/// How far into the second silent node's silence the clock steps back.
const STEP_INTO_SILENCE: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_on_sqlite_times_silence_on_its_own_clock_across_steps() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeClock::steppable();
    let mut args = vec![format!(
        "--sqlite-path={}",
        dir.path().join("registry.db").display()
    )];
    args.extend(liveness_flags(REMOVE_AFTER));
    let r = Replica::start("R", &args, &fake.env()).await;
    let replicas = [&r];
    let (live, agents) = live_agents(&r, "a", LIVE).await;
    let mut sampler = Sampler::new(&live, 1, false);
    let mut problems = Vec::new();
    let mut timeline = Vec::new();

    // Forward: marked in time, then the clock jumps ten minutes ahead; the
    // node goes remove_after after its silence began, not at the jump.
    let first = Silent::register(&r, "silent-1").await;
    let id = first.endpoint.id.clone();
    sampler.follow(&id);
    while !sampler.is_marked(0, &id) && Instant::now() < first.mark_deadline(SYNC) {
        sampler.sample(&replicas).await;
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    sampler.check_marked(&replicas, &first, SYNC, &mut problems);
    fake.step(STEP_SECS);
    timeline.push(format!(
        "clock stepped {STEP_SECS:+} s at {}",
        sampler.at(Instant::now())
    ));
    // A sweep may take its time before reading what the registration
    // wrote: one sweep interval early at most.
    let kept_until = first.sent + REMOVE_AFTER - SWEEP;
    let removed_by = first.acked + REMOVE_AFTER + 2 * SWEEP + SYNC + SLACK;
    while sampler.gone_at(0, &id).is_none() && Instant::now() < removed_by {
        sampler.sample(&replicas).await;
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    let bound = format!(
        "registered at {}, to be removed between {} (remove_after {} after it was sent, \
         less a sweep interval) and {} (remove_after + 2 × sweep {} + sync {} + slack {} \
         after it was acknowledged)",
        sampler.at(first.sent),
        sampler.at(kept_until),
        secs(REMOVE_AFTER),
        sampler.at(removed_by),
        secs(SWEEP),
        secs(SYNC),
        secs(SLACK)
    );
    match sampler.gone_at(0, &id) {
        None => problems.push(format!("{id} was not removed; {bound}")),
        Some(at) if at < kept_until => problems.push(format!(
            "{id} was gone at {}, right after the step; {bound}",
            sampler.at(at)
        )),
        Some(_) => {}
    }

    // Back: a node falls silent while the clock is ten minutes ahead, and
    // two seconds later the clock steps back ten minutes: it is marked in
    // time all the same.
    let second = Silent::register(&r, "silent-2").await;
    let id = second.endpoint.id.clone();
    sampler.follow(&id);
    let step_at = second.acked + STEP_INTO_SILENCE;
    let mut stepped = false;
    while (!stepped || !sampler.is_marked(0, &id)) && Instant::now() < second.mark_deadline(SYNC) {
        if !stepped && Instant::now() >= step_at {
            fake.step(0);
            stepped = true;
            timeline.push(format!(
                "stepped back to the real time at {}",
                sampler.at(Instant::now())
            ));
        }
        sampler.sample(&replicas).await;
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    sampler.check_marked(&replicas, &second, SYNC, &mut problems);
    sampler.check_views(&replicas, &mut problems);
    for agent in agents {
        agent.abandon();
    }
    if let Err(problems) = report(
        &format!("SQLite, the replica's {}", timeline.join(", ")),
        &problems,
        &replicas,
    ) {
        panic!("{problems}");
    }
}
