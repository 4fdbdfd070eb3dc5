//! Liveness kept in the file: heartbeats and sweeps over the `nodes`
//! table (its rows are [`crate::nodes`]'s).
//!
//! This is not `waypost::liveness::Liveness` (which keeps nodes in
//! memory and is what `stack()` adds to backends without liveness): here
//! nodes, their `last_seen` and the endpoints liveness marked unhealthy
//! are rows of the file, so they survive restarts (status is recomputed on
//! open), are shared by every process using the file, and change in the
//! same transactions as the endpoints and the change log. A node is seen
//! when it heartbeats, is registered with its address, or registers an
//! endpoint; each time, its `beats` count grows by one.
//!
//! Silence is timed on this process's monotonic clock
//! ([`crate::Clock::instant`]), from when it saw a node's count change
//! (at once for its own writes, at its next sweep for another process's),
//! never by comparing `last_seen` (wall time, for people) with the clock:
//! a step of the wall clock, or another process's clock being off, changes
//! no judgement. A node first seen by this process (at open, or written by
//! another process) gets a full `suspect_after` from then, and keeps the
//! status the file holds until then.

use std::collections::BTreeSet;
use std::sync::Weak;
use std::time::{Duration, Instant};

use sqlx::sqlite::SqliteConnection;
use waypost::liveness::SweepReport;
use waypost::{EndpointKey, Error, Health, Result};

use crate::database::Database;
use crate::endpoints::{node_endpoints, remove, upsert};
use crate::layout::millis;
use crate::nodes::{heard, silence};

/// What one sweep of the `nodes` table changed: the nodes, as the generic
/// liveness reports them, and what only a persisted node table adds.
#[non_exhaustive]
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SqliteSweepReport {
    /// Nodes newly marked unhealthy (`suspected`) and removed with all their
    /// endpoints (`removed`). `held` is always false: this sweep has no
    /// self-preservation.
    pub nodes: SweepReport,
    /// Nodes found unhealthy although they were heard from within
    /// `suspect_after` (by another process sharing the file, or before a
    /// heartbeat's own revival could finish); marked healthy again.
    pub recovered: Vec<String>,
    /// Endpoints whose health changed.
    pub endpoints_changed: usize,
    /// Endpoints removed with their node.
    pub endpoints_removed: usize,
}

impl SqliteSweepReport {
    /// Whether the sweep changed nothing.
    pub fn is_empty(&self) -> bool {
        self.nodes.suspected.is_empty()
            && self.nodes.removed.is_empty()
            && self.recovered.is_empty()
            && self.endpoints_changed == 0
            && self.endpoints_removed == 0
    }
}

/// Sweep every `every` until the database is dropped.
pub(crate) async fn sweep_loop(db: Weak<Database>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate; open already swept
    loop {
        tick.tick().await;
        let Some(db) = db.upgrade() else { return };
        if let Err(e) = sweep_at(&db, None).await {
            tracing::warn!(error = %e, "liveness sweep failed");
        }
    }
}

/// Bring back the endpoints liveness marked unhealthy.
pub(crate) async fn revive(
    db: &Database,
    conn: &mut SqliteConnection,
    rev: &mut u64,
    node: &str,
    what: &str,
) -> Result<usize> {
    let eps = node_endpoints(
        db,
        conn,
        node,
        "SELECT endpoint FROM endpoints WHERE node = ?1 AND suspended = 1",
        what,
    )
    .await?;
    let mut n = 0;
    for ep in eps {
        n += usize::from(upsert(db, conn, rev, ep.with_health(Health::Healthy), false).await?);
    }
    Ok(n)
}

/// A heartbeat (`info: None`) or a node registration.
pub(crate) async fn beat(db: &Database, node: &str, info: Option<(&str, &str)>) -> Result<()> {
    let what = format!("heartbeat of node {node}");
    let now = millis(db.cfg.clock.now());
    let mut tx = db.write_tx(&what).await?;
    let res = beat_in(db, tx.conn(), node, info, now, &what).await;
    // A heartbeat admits no unknown node (one that owns no endpoint
    // and has no node row: never registered, or removed by liveness):
    // `NotFound` tells its client to register again (the rule of
    // `waypost::Heartbeat`, checked by the conformance suite).
    let Some((known, revived, rev)) = tx.end(res, &what).await? else {
        return Err(Error::not_found(format!(
            "node {node:?}: no endpoint of this node is registered \
             (never registered, or removed by liveness); register again"
        )));
    };
    db.bump(rev);
    match known.as_deref() {
        None => tracing::info!(node, "node admitted"),
        Some("unhealthy") => tracing::info!(node, revived, "node is back"),
        _ => {}
    }
    Ok(())
}

/// One sweep, judging silence as of `now` on the monotonic clock
/// (`None`: the configured clock's reading once the nodes are read).
pub(crate) async fn sweep_at(db: &Database, now: Option<Instant>) -> Result<SqliteSweepReport> {
    let what = "liveness sweep";
    let mut tx = db.write_tx(what).await?;
    let res = sweep_in(db, tx.conn(), now, what).await;
    let (report, rev) = tx.end(res, what).await?;
    db.bump(rev);
    if !report.is_empty() {
        tracing::info!(
            path = %db.cfg.path.display(),
            suspected = ?report.nodes.suspected,
            removed = ?report.nodes.removed,
            recovered = ?report.recovered,
            endpoints_changed = report.endpoints_changed,
            endpoints_removed = report.endpoints_removed,
            "liveness sweep"
        );
    }
    Ok(report)
}

/// The work of [`beat`] inside its transaction: the node's
/// previous status, the endpoints revived, the new revision.
async fn beat_in(
    db: &Database,
    conn: &mut SqliteConnection,
    node: &str,
    info: Option<(&str, &str)>,
    now: i64,
    what: &str,
) -> Result<Option<(Option<String>, usize, u64)>> {
    let (start, floor) = db.counters(conn, what).await?;
    let known: Option<String> = sqlx::query_scalar("SELECT status FROM nodes WHERE id = ?1")
        .bind(node)
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| db.map(e, what))?;
    if known.is_none() && info.is_none() {
        let owns: Option<i64> =
            sqlx::query_scalar("SELECT 1 FROM endpoints WHERE node = ?1 LIMIT 1")
                .bind(node)
                .fetch_optional(&mut *conn)
                .await
                .map_err(|e| db.map(e, what))?;
        if owns.is_none() {
            return Ok(None);
        }
    }
    let q = match info {
        None => sqlx::query_scalar(
            "INSERT INTO nodes (id, status, last_seen, beats) VALUES (?1, 'healthy', ?2, 1) \
             ON CONFLICT (id) DO UPDATE SET status = 'healthy', \
             last_seen = excluded.last_seen, beats = nodes.beats + 1 RETURNING beats",
        )
        .bind(node)
        .bind(now),
        Some((address, role)) => sqlx::query_scalar(
            "INSERT INTO nodes (id, status, last_seen, address, role, beats) \
             VALUES (?1, 'healthy', ?2, ?3, ?4, 1) \
             ON CONFLICT (id) DO UPDATE SET status = 'healthy', \
             last_seen = excluded.last_seen, address = excluded.address, \
             role = excluded.role, beats = nodes.beats + 1 RETURNING beats",
        )
        .bind(node)
        .bind(now)
        .bind(address)
        .bind(role),
    };
    let beats: i64 = q.fetch_one(&mut *conn).await.map_err(|e| db.map(e, what))?;
    heard(db, node, beats, now);
    let mut rev = start;
    let revived = revive(db, conn, &mut rev, node, what).await?;
    db.finish(conn, start, floor, rev, what).await?;
    Ok(Some((known, revived, rev)))
}

/// The work of [`sweep_at`] inside its transaction: the report
/// and the new revision.
async fn sweep_in(
    db: &Database,
    conn: &mut SqliteConnection,
    now: Option<Instant>,
    what: &str,
) -> Result<(SqliteSweepReport, u64)> {
    let mut report = SqliteSweepReport::default();
    let (start, floor) = db.counters(conn, what).await?;
    let mut rev = start;
    let rows: Vec<(String, String, i64, i64)> =
        sqlx::query_as("SELECT id, status, beats, last_seen FROM nodes ORDER BY id")
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| db.map(e, what))?;
    // A change is seen when the read that shows it has ended.
    let now = now.unwrap_or_else(|| db.cfg.clock.instant());
    {
        let mut silence = silence(db);
        let ids: BTreeSet<&str> = rows.iter().map(|r| r.0.as_str()).collect();
        silence.retain(|n| ids.contains(n));
        for (id, status, beats, last_seen) in &rows {
            let seen = silence.observe(id, (*beats, *last_seen), now);
            let healthy = status == "healthy";
            if seen.silent_for >= db.cfg.remove_after {
                report.nodes.removed.push(id.clone());
            } else if seen.silent_for >= db.cfg.suspect_after {
                if healthy {
                    report.nodes.suspected.push(id.clone());
                }
            } else if !healthy && seen.heard {
                report.recovered.push(id.clone());
            }
        }
        for node in &report.nodes.removed {
            silence.forget(node);
        }
    }

    for node in &report.nodes.removed {
        let what = format!("remove silent node {node}");
        let keys: Vec<(String, String)> =
            sqlx::query_as("SELECT service, id FROM endpoints WHERE node = ?1")
                .bind(node)
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| db.map(e, &what))?;
        for (service, id) in keys {
            let key = EndpointKey::new(service, id);
            report.endpoints_removed += usize::from(remove(db, conn, &mut rev, &key).await?);
        }
        sqlx::query("DELETE FROM nodes WHERE id = ?1")
            .bind(node)
            .execute(&mut *conn)
            .await
            .map_err(|e| db.map(e, &what))?;
    }

    for node in &report.nodes.suspected {
        let what = format!("mark silent node {node} unhealthy");
        sqlx::query("UPDATE nodes SET status = 'unhealthy' WHERE id = ?1")
            .bind(node)
            .execute(&mut *conn)
            .await
            .map_err(|e| db.map(e, &what))?;
        let eps = node_endpoints(
            db,
            conn,
            node,
            "SELECT endpoint FROM endpoints WHERE node = ?1 AND health = 'healthy'",
            &what,
        )
        .await?;
        for ep in eps {
            let ep = ep.with_health(Health::Unhealthy);
            report.endpoints_changed += usize::from(upsert(db, conn, &mut rev, ep, true).await?);
        }
    }

    for node in &report.recovered {
        sqlx::query("UPDATE nodes SET status = 'healthy' WHERE id = ?1")
            .bind(node)
            .execute(&mut *conn)
            .await
            .map_err(|e| db.map(e, what))?;
        report.endpoints_changed += revive(db, conn, &mut rev, node, what).await?;
    }

    db.finish(conn, start, floor, rev, what).await?;
    Ok((report, rev))
}
