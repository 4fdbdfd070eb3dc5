//! Endpoint reads and writes: batches of ops applied in one transaction,
//! listing and snapshots, and the single-row writes liveness makes to the
//! endpoints of a node it judges.

use std::collections::{BTreeMap, BTreeSet};

use sqlx::sqlite::SqliteConnection;
use waypost::{Endpoint, EndpointKey, Op, Result, Snapshot, Version};

use crate::database::Database;
use crate::layout::{
    decode, delete_rows, encode, load_rows, log_rows, store_rows, EpRow, EpRowSuspended,
};
use crate::nodes::seen;

/// Apply validated ops in one transaction; returns the new version.
///
/// Set-based, so that a batch costs a few statements per few hundred
/// ops: the touched keys are read at once, every op is applied in
/// order in memory (each real change gets the next revision and a log
/// entry, as a single write would), then the final rows and the log
/// entries are written with multi-row statements.
pub(crate) async fn commit_ops(db: &Database, ops: Vec<Op>, what: &str) -> Result<Version> {
    let mut tx = db.write_tx(what).await?;
    let res = apply_ops(db, tx.conn(), ops, what).await;
    let (start, rev) = tx.end(res, what).await?;
    db.bump(rev);
    tracing::debug!(path = %db.cfg.path.display(), revision = rev, changes = rev - start, "{what}");
    Ok(Version(rev))
}

/// The work of [`commit_ops`] inside its transaction: the
/// revisions before and after.
async fn apply_ops(
    db: &Database,
    conn: &mut SqliteConnection,
    ops: Vec<Op>,
    what: &str,
) -> Result<(u64, u64)> {
    let (start, floor) = db.counters(conn, what).await?;
    let keys: BTreeSet<EndpointKey> = ops.iter().map(Op::key).collect();
    let mut state = load_rows(conn, &db.cfg.path, &keys, what).await?;
    // A node that registers an endpoint is alive: liveness tracks it
    // from now on, heartbeat or not.
    let nodes: BTreeSet<String> = ops
        .iter()
        .filter_map(|op| match op {
            Op::Register(e) if !e.node.is_empty() => Some(e.node.clone()),
            _ => None,
        })
        .collect();
    let mut rev = start;
    let mut log: Vec<(u64, &'static str, EndpointKey, Option<String>)> = Vec::new();
    let mut dirty: BTreeMap<EndpointKey, u64> = BTreeMap::new();
    for op in ops {
        let key = op.key();
        let slot = state.entry(key.clone()).or_insert(None);
        match op {
            Op::Register(ep) => {
                let kind = match slot {
                    Some((old, suspended)) if *old == ep => {
                        if *suspended {
                            // The owner now vouches for this value.
                            *suspended = false;
                            dirty.entry(key).or_insert(start);
                        }
                        continue;
                    }
                    Some(_) => "updated",
                    None => "added",
                };
                rev += 1;
                let json = encode(&ep)?;
                log.push((rev, kind, key.clone(), Some(json)));
                *slot = Some((ep, false));
            }
            Op::Deregister(_) => {
                if slot.is_none() {
                    continue;
                }
                rev += 1;
                log.push((rev, "removed", key.clone(), None));
                *slot = None;
            }
        }
        dirty.insert(key, rev);
    }
    seen(db, conn, &nodes, what).await?;
    let mut gone = Vec::new();
    let mut rows = Vec::new();
    for (key, at) in dirty {
        match state.remove(&key).flatten() {
            None => gone.push(key),
            Some((ep, suspended)) => rows.push((ep, suspended, at)),
        }
    }
    delete_rows(conn, &db.cfg.path, &gone, what).await?;
    store_rows(conn, &db.cfg.path, &rows, what).await?;
    log_rows(conn, &db.cfg.path, &log, what).await?;
    db.finish(conn, start, floor, rev, what).await?;
    Ok((start, rev))
}

pub(crate) async fn list(db: &Database, service: &str) -> Result<Vec<Endpoint>> {
    let rows: Vec<EpRow> =
        sqlx::query_as("SELECT endpoint FROM endpoints WHERE service = ?1 ORDER BY id")
            .bind(service)
            .fetch_all(&db.readers)
            .await
            .map_err(|e| db.map(e, &format!("list {service}")))?;
    rows.into_iter().map(|r| decode(&db.cfg.path, r)).collect()
}

pub(crate) async fn snapshot(db: &Database) -> Result<Snapshot> {
    let what = "read a snapshot";
    // Both reads see the same state: one read transaction.
    let mut tx = db.read_tx(what).await?;
    let res = async {
        let (rev, _) = db.counters(tx.conn(), what).await?;
        let rows: Vec<EpRow> = sqlx::query_as("SELECT endpoint FROM endpoints")
            .fetch_all(tx.conn())
            .await
            .map_err(|e| db.map(e, what))?;
        Ok((rev, rows))
    }
    .await;
    let (rev, rows) = tx.end(res, what).await?;
    let eps = rows
        .into_iter()
        .map(|r| decode(&db.cfg.path, r))
        .collect::<Result<Vec<_>>>()?;
    Ok(Snapshot::from_endpoints(Version(rev), eps))
}

/// The stored endpoint with `key` and its `suspended` flag.
async fn get(
    db: &Database,
    conn: &mut SqliteConnection,
    key: &EndpointKey,
    what: &str,
) -> Result<Option<(Endpoint, bool)>> {
    let row: Option<EpRowSuspended> =
        sqlx::query_as("SELECT endpoint, suspended FROM endpoints WHERE service = ?1 AND id = ?2")
            .bind(&key.service)
            .bind(&key.id)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| db.map(e, what))?;
    row.map(|(json, susp)| Ok((decode(&db.cfg.path, (json,))?, susp != 0)))
        .transpose()
}

/// Store `ep` (with the `suspended` flag) and log the change; `false`
/// when nothing changed.
pub(crate) async fn upsert(
    db: &Database,
    conn: &mut SqliteConnection,
    rev: &mut u64,
    ep: Endpoint,
    suspended: bool,
) -> Result<bool> {
    let key = ep.key();
    let what = || format!("register {key}");
    let old = get(db, conn, &key, &what()).await?;
    let kind = match &old {
        Some((o, s)) if *o == ep => {
            if *s != suspended {
                sqlx::query("UPDATE endpoints SET suspended = ?3 WHERE service = ?1 AND id = ?2")
                    .bind(&key.service)
                    .bind(&key.id)
                    .bind(i64::from(suspended))
                    .execute(&mut *conn)
                    .await
                    .map_err(|e| db.map(e, &what()))?;
            }
            return Ok(false);
        }
        Some(_) => "updated",
        None => "added",
    };
    *rev += 1;
    let path = &db.cfg.path;
    let what = what();
    let json = encode(&ep)?;
    store_rows(conn, path, &[(ep, suspended, *rev)], &what).await?;
    log_rows(conn, path, &[(*rev, kind, key, Some(json))], &what).await?;
    Ok(true)
}

/// Remove `key` and log it; `false` when it did not exist.
pub(crate) async fn remove(
    db: &Database,
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
        .map_err(|e| db.map(e, &what()))?;
    if res.rows_affected() == 0 {
        return Ok(false);
    }
    *rev += 1;
    let entry = (*rev, "removed", key.clone(), None);
    log_rows(conn, &db.cfg.path, &[entry], &what()).await?;
    Ok(true)
}

/// Endpoints of `node` matching `filter` (an SQL condition chosen among
/// fixed strings).
pub(crate) async fn node_endpoints(
    db: &Database,
    conn: &mut SqliteConnection,
    node: &str,
    sql: &'static str,
    what: &str,
) -> Result<Vec<Endpoint>> {
    let rows: Vec<EpRow> = sqlx::query_as(sql)
        .bind(node)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| db.map(e, what))?;
    rows.into_iter().map(|r| decode(&db.cfg.path, r)).collect()
}
