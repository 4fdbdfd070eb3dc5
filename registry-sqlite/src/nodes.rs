//! Node records: the rows of the `nodes` table, how a node is noted as
//! seen (its `beats` count grows, its `last_seen` moves, and this process
//! starts timing its silence), and reading them back. Judging silence is
//! [`crate::liveness`]'s.

use std::collections::BTreeSet;
use std::sync::MutexGuard;
use std::time::SystemTime;

use sqlx::sqlite::SqliteConnection;
use waypost::backend::Silence;
use waypost::{Health, Result};

use crate::database::Database;
use crate::error::corrupt;
use crate::layout::{from_millis, millis};

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

/// Record that `nodes` were seen now: new ones are admitted healthy; a
/// known one keeps its status (an unhealthy one recovers at the next
/// sweep, which revives its endpoints).
pub(crate) async fn seen(
    db: &Database,
    conn: &mut SqliteConnection,
    nodes: &BTreeSet<String>,
    what: &str,
) -> Result<()> {
    let now = millis(db.cfg.clock.now());
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
        .map_err(|e| db.map(e, what))?;
        heard(db, node, beats, now);
    }
    Ok(())
}

/// This process recorded a heartbeat of `node`, leaving `beats` and
/// `last_seen` in its row: its silence starts now.
pub(crate) fn heard(db: &Database, node: &str, beats: i64, last_seen: i64) {
    let now = db.cfg.clock.instant();
    silence(db).wrote(node, (beats, last_seen), now);
}

pub(crate) fn silence(db: &Database) -> MutexGuard<'_, Silence<(i64, i64)>> {
    db.silence.lock().unwrap_or_else(|p| p.into_inner())
}

/// Every node in the `nodes` table ordered by id, or only the one with
/// the id `only`.
pub(crate) async fn records(db: &Database, only: Option<&str>) -> Result<Vec<NodeRecord>> {
    let what = "list nodes";
    let rows: Vec<(String, String, String, String, i64)> = match only {
        None => {
            sqlx::query_as("SELECT id, address, role, status, last_seen FROM nodes ORDER BY id")
                .fetch_all(&db.readers)
        }
        Some(id) => {
            sqlx::query_as("SELECT id, address, role, status, last_seen FROM nodes WHERE id = ?1")
                .bind(id)
                .fetch_all(&db.readers)
        }
    }
    .await
    .map_err(|e| db.map(e, what))?;
    rows.into_iter()
        .map(|(id, address, role, status, last_seen)| {
            Ok(NodeRecord {
                status: status
                    .parse()
                    .map_err(|e| corrupt(&db.cfg.path, &format!("read node {id}"), e))?,
                id,
                address,
                role,
                last_seen: from_millis(last_seen),
            })
        })
        .collect()
}
