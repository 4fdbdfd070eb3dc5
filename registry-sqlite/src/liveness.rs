//! Liveness kept in the file: the `nodes` table, heartbeats and sweeps.
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
use std::sync::{MutexGuard, Weak};
use std::time::{Duration, Instant, SystemTime};

use sqlx::sqlite::SqliteConnection;
use waypost::backend::Silence;
use waypost::liveness::SweepReport;
use waypost::{Endpoint, EndpointKey, Error, Health, Result};

use crate::error::corrupt;
use crate::layout::{
    decode, encode, from_millis, log_rows, millis, store_rows, EpRow, EpRowSuspended,
};
use crate::shared::Database;

/// A node as the `nodes` table holds it.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    /// The node's name, as its endpoints carry it in `Endpoint::node`.
    pub id: String,
    /// Its routable address, if it registered one ([`crate::SqliteRegistry::register_node`]).
    pub address: String,
    /// Its role (`compute` unless registered otherwise).
    pub role: String,
    /// `Healthy`, or `Unhealthy` once silent for `suspect_after`.
    pub status: Health,
    /// When its last heartbeat arrived (millisecond precision).
    pub last_seen: SystemTime,
}

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
        if let Err(e) = db.sweep_at(None).await {
            tracing::warn!(error = %e, "liveness sweep failed");
        }
    }
}

impl Database {
    /// The stored endpoint with `key` and its `suspended` flag.
    pub(crate) async fn get(
        &self,
        conn: &mut SqliteConnection,
        key: &EndpointKey,
        what: &str,
    ) -> Result<Option<(Endpoint, bool)>> {
        let row: Option<EpRowSuspended> = sqlx::query_as(
            "SELECT endpoint, suspended FROM endpoints WHERE service = ?1 AND id = ?2",
        )
        .bind(&key.service)
        .bind(&key.id)
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| self.map(e, what))?;
        row.map(|(json, susp)| Ok((decode(&self.cfg.path, (json,))?, susp != 0)))
            .transpose()
    }

    /// Store `ep` (with the `suspended` flag) and log the change; `false`
    /// when nothing changed.
    pub(crate) async fn upsert(
        &self,
        conn: &mut SqliteConnection,
        rev: &mut u64,
        ep: Endpoint,
        suspended: bool,
    ) -> Result<bool> {
        let key = ep.key();
        let what = || format!("register {key}");
        let old = self.get(conn, &key, &what()).await?;
        let kind = match &old {
            Some((o, s)) if *o == ep => {
                if *s != suspended {
                    sqlx::query(
                        "UPDATE endpoints SET suspended = ?3 WHERE service = ?1 AND id = ?2",
                    )
                    .bind(&key.service)
                    .bind(&key.id)
                    .bind(i64::from(suspended))
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| self.map(e, &what()))?;
                }
                return Ok(false);
            }
            Some(_) => "updated",
            None => "added",
        };
        *rev += 1;
        let path = &self.cfg.path;
        let what = what();
        let json = encode(&ep)?;
        store_rows(conn, path, &[(ep, suspended, *rev)], &what).await?;
        log_rows(conn, path, &[(*rev, kind, key, Some(json))], &what).await?;
        Ok(true)
    }

    /// Remove `key` and log it; `false` when it did not exist.
    pub(crate) async fn remove(
        &self,
        conn: &mut SqliteConnection,
        rev: &mut u64,
        key: &EndpointKey,
    ) -> Result<bool> {
        let what = || format!("deregister {key}");
        let res = sqlx::query("DELETE FROM endpoints WHERE service = ?1 AND id = ?2")
            .bind(&key.service)
            .bind(&key.id)
            .execute(&mut *conn)
            .await
            .map_err(|e| self.map(e, &what()))?;
        if res.rows_affected() == 0 {
            return Ok(false);
        }
        *rev += 1;
        let entry = (*rev, "removed", key.clone(), None);
        log_rows(conn, &self.cfg.path, &[entry], &what()).await?;
        Ok(true)
    }

    /// Endpoints of `node` matching `filter` (an SQL condition chosen among
    /// fixed strings).
    pub(crate) async fn node_endpoints(
        &self,
        conn: &mut SqliteConnection,
        node: &str,
        sql: &'static str,
        what: &str,
    ) -> Result<Vec<Endpoint>> {
        let rows: Vec<EpRow> = sqlx::query_as(sql)
            .bind(node)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| self.map(e, what))?;
        rows.into_iter()
            .map(|r| decode(&self.cfg.path, r))
            .collect()
    }

    /// Record that `nodes` were seen now: new ones are admitted healthy; a
    /// known one keeps its status (an unhealthy one recovers at the next
    /// sweep, which revives its endpoints).
    pub(crate) async fn seen(
        &self,
        conn: &mut SqliteConnection,
        nodes: &BTreeSet<String>,
        what: &str,
    ) -> Result<()> {
        let now = millis(self.cfg.clock.now());
        for node in nodes {
            let beats: i64 = sqlx::query_scalar(
                "INSERT INTO nodes (id, status, last_seen, beats) VALUES (?1, 'healthy', ?2, 1) \
                 ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen, \
                 beats = nodes.beats + 1 RETURNING beats",
            )
            .bind(node)
            .bind(now)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| self.map(e, what))?;
            self.heard(node, beats, now);
        }
        Ok(())
    }

    /// This process recorded a heartbeat of `node`, leaving `beats` and
    /// `last_seen` in its row: its silence starts now.
    fn heard(&self, node: &str, beats: i64, last_seen: i64) {
        let now = self.cfg.clock.instant();
        self.silence().wrote(node, (beats, last_seen), now);
    }

    fn silence(&self) -> MutexGuard<'_, Silence<(i64, i64)>> {
        self.silence.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bring back the endpoints liveness marked unhealthy.
    pub(crate) async fn revive(
        &self,
        conn: &mut SqliteConnection,
        rev: &mut u64,
        node: &str,
        what: &str,
    ) -> Result<usize> {
        let eps = self
            .node_endpoints(
                conn,
                node,
                "SELECT endpoint FROM endpoints WHERE node = ?1 AND suspended = 1",
                what,
            )
            .await?;
        let mut n = 0;
        for ep in eps {
            n += usize::from(
                self.upsert(conn, rev, ep.with_health(Health::Healthy), false)
                    .await?,
            );
        }
        Ok(n)
    }

    /// A heartbeat (`info: None`) or a node registration.
    pub(crate) async fn beat(&self, node: &str, info: Option<(&str, &str)>) -> Result<()> {
        let what = format!("heartbeat of node {node}");
        let now = millis(self.cfg.clock.now());
        let mut tx = self.write_tx(&what).await?;
        let res = self.beat_in(tx.conn(), node, info, now, &what).await;
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
        self.bump(rev);
        match known.as_deref() {
            None => tracing::info!(node, "node admitted"),
            Some("unhealthy") => tracing::info!(node, revived, "node is back"),
            _ => {}
        }
        Ok(())
    }

    /// One sweep, judging silence as of `now` on the monotonic clock
    /// (`None`: the configured clock's reading once the nodes are read).
    pub(crate) async fn sweep_at(&self, now: Option<Instant>) -> Result<SqliteSweepReport> {
        let what = "liveness sweep";
        let mut tx = self.write_tx(what).await?;
        let res = self.sweep_in(tx.conn(), now, what).await;
        let (report, rev) = tx.end(res, what).await?;
        self.bump(rev);
        if !report.is_empty() {
            tracing::info!(
                path = %self.cfg.path.display(),
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

    /// The work of [`Database::beat`] inside its transaction: the node's
    /// previous status, the endpoints revived, the new revision.
    async fn beat_in(
        &self,
        conn: &mut SqliteConnection,
        node: &str,
        info: Option<(&str, &str)>,
        now: i64,
        what: &str,
    ) -> Result<Option<(Option<String>, usize, u64)>> {
        let (start, floor) = self.counters(conn, what).await?;
        let known: Option<String> = sqlx::query_scalar("SELECT status FROM nodes WHERE id = ?1")
            .bind(node)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| self.map(e, what))?;
        if known.is_none() && info.is_none() {
            let owns: Option<i64> =
                sqlx::query_scalar("SELECT 1 FROM endpoints WHERE node = ?1 LIMIT 1")
                    .bind(node)
                    .fetch_optional(&mut *conn)
                    .await
                    .map_err(|e| self.map(e, what))?;
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
        let beats: i64 = q
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| self.map(e, what))?;
        self.heard(node, beats, now);
        let mut rev = start;
        let revived = self.revive(conn, &mut rev, node, what).await?;
        self.finish(conn, start, floor, rev, what).await?;
        Ok(Some((known, revived, rev)))
    }

    /// The work of [`Database::sweep_at`] inside its transaction: the report
    /// and the new revision.
    async fn sweep_in(
        &self,
        conn: &mut SqliteConnection,
        now: Option<Instant>,
        what: &str,
    ) -> Result<(SqliteSweepReport, u64)> {
        let mut report = SqliteSweepReport::default();
        let (start, floor) = self.counters(conn, what).await?;
        let mut rev = start;
        let rows: Vec<(String, String, i64, i64)> =
            sqlx::query_as("SELECT id, status, beats, last_seen FROM nodes ORDER BY id")
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| self.map(e, what))?;
        // A change is seen when the read that shows it has ended.
        let now = now.unwrap_or_else(|| self.cfg.clock.instant());
        {
            let mut silence = self.silence();
            let ids: BTreeSet<&str> = rows.iter().map(|r| r.0.as_str()).collect();
            silence.retain(|n| ids.contains(n));
            for (id, status, beats, last_seen) in &rows {
                let seen = silence.observe(id, (*beats, *last_seen), now);
                let healthy = status == "healthy";
                if seen.silent_for >= self.cfg.remove_after {
                    report.nodes.removed.push(id.clone());
                } else if seen.silent_for >= self.cfg.suspect_after {
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
                    .map_err(|e| self.map(e, &what))?;
            for (service, id) in keys {
                let key = EndpointKey::new(service, id);
                report.endpoints_removed += usize::from(self.remove(conn, &mut rev, &key).await?);
            }
            sqlx::query("DELETE FROM nodes WHERE id = ?1")
                .bind(node)
                .execute(&mut *conn)
                .await
                .map_err(|e| self.map(e, &what))?;
        }

        for node in &report.nodes.suspected {
            let what = format!("mark silent node {node} unhealthy");
            sqlx::query("UPDATE nodes SET status = 'unhealthy' WHERE id = ?1")
                .bind(node)
                .execute(&mut *conn)
                .await
                .map_err(|e| self.map(e, &what))?;
            let eps = self
                .node_endpoints(
                    conn,
                    node,
                    "SELECT endpoint FROM endpoints WHERE node = ?1 AND health = 'healthy'",
                    &what,
                )
                .await?;
            for ep in eps {
                let ep = ep.with_health(Health::Unhealthy);
                report.endpoints_changed +=
                    usize::from(self.upsert(conn, &mut rev, ep, true).await?);
            }
        }

        for node in &report.recovered {
            sqlx::query("UPDATE nodes SET status = 'healthy' WHERE id = ?1")
                .bind(node)
                .execute(&mut *conn)
                .await
                .map_err(|e| self.map(e, what))?;
            report.endpoints_changed += self.revive(conn, &mut rev, node, what).await?;
        }

        self.finish(conn, start, floor, rev, what).await?;
        Ok((report, rev))
    }

    pub(crate) async fn nodes(&self, only: Option<&str>) -> Result<Vec<NodeRecord>> {
        let what = "list nodes";
        let rows: Vec<(String, String, String, String, i64)> = match only {
            None => {
                sqlx::query_as("SELECT id, address, role, status, last_seen FROM nodes ORDER BY id")
                    .fetch_all(&self.readers)
            }
            Some(id) => sqlx::query_as(
                "SELECT id, address, role, status, last_seen FROM nodes WHERE id = ?1",
            )
            .bind(id)
            .fetch_all(&self.readers),
        }
        .await
        .map_err(|e| self.map(e, what))?;
        rows.into_iter()
            .map(|(id, address, role, status, last_seen)| {
                Ok(NodeRecord {
                    status: status
                        .parse()
                        .map_err(|e| corrupt(&self.cfg.path, &format!("read node {id}"), e))?,
                    id,
                    address,
                    role,
                    last_seen: from_millis(last_seen),
                })
            })
            .collect()
    }
}
