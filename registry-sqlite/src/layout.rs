//! The on-disk layout: the schema, as an ordered list of migrations
//! applied on open, and how rows encode endpoints and changes.
//!
//! `schema_version` holds the number of every migration applied. A
//! migration is never edited once released; a change is a new entry.
//! The crate README describes the tables for people reading the file.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use registry_api::{Endpoint, EndpointKey, Error, Event, Result, Version};
use sqlx::sqlite::SqliteConnection;
use sqlx::AssertSqlSafe;

use crate::error::{corrupt, map_sqlx};

/// `PRAGMA application_id` of every registry-sqlite file: `0x72677374`,
/// "rgst" in ASCII. Set on open in a file that has none (a new file, or
/// one written by a release from before it was set); a file with another
/// id is another application's and is refused.
pub(crate) const APPLICATION_ID: i32 = 0x7267_7374;

/// Tables every registry-sqlite file has had since the first release: a
/// file with these and `application_id` 0 is ours, written by a release
/// that did not set the id.
pub(crate) const OUR_TABLES: &[&str] = &["meta", "schema_version"];

/// A write that changes nothing: run inside a write transaction, it fails
/// with `READONLY` when SQLite will not write the file (a connection
/// SQLite had to open read-only), and with an error when `meta` is
/// missing or unreadable. It affects exactly one row.
pub(crate) const TOUCH_META: &str = "UPDATE meta SET value = value WHERE key = 'revision'";

/// Migration `i + 1` is `MIGRATIONS[i]`.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: endpoints, nodes, the change log and its counters.
    r#"
    CREATE TABLE meta (
        key   TEXT PRIMARY KEY,
        value INTEGER NOT NULL
    ) WITHOUT ROWID;
    -- revision: the version of the latest change (never decreases).
    -- log_floor: every change with a revision above it is in `changes`.
    INSERT INTO meta (key, value) VALUES ('revision', 0), ('log_floor', 0);

    CREATE TABLE endpoints (
        service   TEXT NOT NULL,
        id        TEXT NOT NULL,
        address   TEXT NOT NULL,
        port      INTEGER NOT NULL,
        protocol  TEXT NOT NULL,
        cluster   TEXT NOT NULL,
        node      TEXT NOT NULL,
        health    TEXT NOT NULL,
        endpoint  TEXT NOT NULL,            -- the whole endpoint as JSON, labels included
        suspended INTEGER NOT NULL DEFAULT 0, -- 1: marked unhealthy by liveness
        revision  INTEGER NOT NULL,         -- revision of its last change
        PRIMARY KEY (service, id)
    ) WITHOUT ROWID;
    CREATE INDEX endpoints_by_node ON endpoints (node);

    CREATE TABLE nodes (
        id        TEXT PRIMARY KEY,
        address   TEXT NOT NULL DEFAULT '',
        role      TEXT NOT NULL DEFAULT 'compute',
        status    TEXT NOT NULL,            -- healthy | unhealthy
        last_seen INTEGER NOT NULL          -- milliseconds since the Unix epoch
    ) WITHOUT ROWID;

    CREATE TABLE changes (
        revision INTEGER PRIMARY KEY,
        kind     TEXT NOT NULL,             -- added | updated | removed
        service  TEXT NOT NULL,
        id       TEXT NOT NULL,
        endpoint TEXT                       -- JSON; NULL for removed
    );
    "#,
];

/// The endpoint columns written on every change. Reads take only
/// `endpoint` (the whole endpoint as JSON): decoding one column is several
/// times cheaper than nine; the others are there for SQL queries (by node,
/// by health) and for people reading the file.
macro_rules! ep_cols {
    () => {
        "service, id, address, port, protocol, cluster, node, health, endpoint"
    };
}
pub(crate) use ep_cols;

/// `endpoint` (JSON).
pub(crate) type EpRow = (String,);

/// `endpoint` (JSON), `suspended`.
pub(crate) type EpRowSuspended = (String, i64);

/// `revision, kind, service, id, endpoint` of the change log.
pub(crate) type ChangeRow = (i64, String, String, String, Option<String>);

/// Rows per multi-row statement (at most 11 parameters each, well under
/// SQLite's limit of 32 766).
pub(crate) const CHUNK: usize = 400;

/// `(?, ?), (?, ?), …`: `rows` groups of `cols` placeholders.
pub(crate) fn placeholders(rows: usize, cols: usize) -> String {
    let one = format!("({})", vec!["?"; cols].join(", "));
    vec![one; rows].join(", ")
}

/// The JSON stored in `endpoints.endpoint` and `changes.endpoint`.
pub(crate) fn encode(ep: &Endpoint) -> Result<String> {
    serde_json::to_string(ep).map_err(|e| Error::internal(format!("encode {}: {e}", ep.key())))
}

/// An endpoint back from its JSON.
pub(crate) fn decode(path: &Path, row: EpRow) -> Result<Endpoint> {
    serde_json::from_str(&row.0).map_err(|e| corrupt(path, "read an endpoint", e))
}

/// A change-log row as the event it records.
pub(crate) fn decode_change(path: &Path, row: ChangeRow) -> Result<Event> {
    let (revision, kind, service, id, endpoint) = row;
    let version = Version(to_u64(revision));
    let what = format!("read change {revision} of the log");
    let endpoint = || -> Result<Endpoint> {
        let json = endpoint
            .as_deref()
            .ok_or_else(|| corrupt(path, &what, "no endpoint"))?;
        serde_json::from_str(json).map_err(|e| corrupt(path, &what, e))
    };
    Ok(match kind.as_str() {
        "added" => Event::Added {
            version,
            endpoint: endpoint()?,
        },
        "updated" => Event::Updated {
            version,
            endpoint: endpoint()?,
        },
        "removed" => Event::Removed {
            version,
            key: EndpointKey::new(service, id),
        },
        other => return Err(corrupt(path, &what, format!("unknown kind {other:?}"))),
    })
}

/// The stored value of each of `keys` (`None` when absent).
pub(crate) async fn load_rows(
    conn: &mut SqliteConnection,
    path: &Path,
    keys: &BTreeSet<EndpointKey>,
    what: &str,
) -> Result<HashMap<EndpointKey, Option<(Endpoint, bool)>>> {
    let mut out: HashMap<EndpointKey, Option<(Endpoint, bool)>> =
        keys.iter().map(|k| (k.clone(), None)).collect();
    let keys: Vec<&EndpointKey> = keys.iter().collect();
    for chunk in keys.chunks(CHUNK) {
        let sql = format!(
            "SELECT endpoint, suspended FROM endpoints WHERE (service, id) IN (VALUES {})",
            placeholders(chunk.len(), 2)
        );
        let mut q = sqlx::query_as::<_, EpRowSuspended>(AssertSqlSafe(sql));
        for k in chunk {
            q = q.bind(&k.service).bind(&k.id);
        }
        let rows = q
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| map_sqlx(e, path, what))?;
        for (json, susp) in rows {
            let ep = decode(path, (json,))?;
            out.insert(ep.key(), Some((ep, susp != 0)));
        }
    }
    Ok(out)
}

/// Delete the endpoints with `keys` (multi-row statements).
pub(crate) async fn delete_rows(
    conn: &mut SqliteConnection,
    path: &Path,
    keys: &[EndpointKey],
    what: &str,
) -> Result<()> {
    for chunk in keys.chunks(CHUNK) {
        let sql = format!(
            "DELETE FROM endpoints WHERE (service, id) IN (VALUES {})",
            placeholders(chunk.len(), 2)
        );
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for k in chunk {
            q = q.bind(&k.service).bind(&k.id);
        }
        q.execute(&mut *conn)
            .await
            .map_err(|e| map_sqlx(e, path, what))?;
    }
    Ok(())
}

/// Store endpoints with their `suspended` flag and revision.
pub(crate) async fn store_rows(
    conn: &mut SqliteConnection,
    path: &Path,
    rows: &[(Endpoint, bool, u64)],
    what: &str,
) -> Result<()> {
    for chunk in rows.chunks(CHUNK) {
        let jsons = chunk
            .iter()
            .map(|(ep, _, _)| encode(ep))
            .collect::<Result<Vec<_>>>()?;
        let sql = format!(
            concat!(
                "INSERT OR REPLACE INTO endpoints (",
                ep_cols!(),
                ", suspended, revision) VALUES {}"
            ),
            placeholders(chunk.len(), 11)
        );
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for ((ep, suspended, at), json) in chunk.iter().zip(&jsons) {
            q = q
                .bind(&ep.service)
                .bind(&ep.id)
                .bind(&ep.address)
                .bind(i64::from(ep.port))
                .bind(ep.protocol.as_str())
                .bind(&ep.cluster)
                .bind(&ep.node)
                .bind(ep.health.as_str())
                .bind(json)
                .bind(i64::from(*suspended))
                .bind(to_i64(*at));
        }
        q.execute(&mut *conn)
            .await
            .map_err(|e| map_sqlx(e, path, what))?;
    }
    Ok(())
}

/// Append entries to the change log: `(revision, kind, key, JSON)`.
pub(crate) async fn log_rows(
    conn: &mut SqliteConnection,
    path: &Path,
    log: &[(u64, &'static str, EndpointKey, Option<String>)],
    what: &str,
) -> Result<()> {
    for chunk in log.chunks(CHUNK) {
        let sql = format!(
            "INSERT INTO changes (revision, kind, service, id, endpoint) VALUES {}",
            placeholders(chunk.len(), 5)
        );
        let mut q = sqlx::query(AssertSqlSafe(sql));
        for (rev, kind, key, json) in chunk {
            q = q
                .bind(to_i64(*rev))
                .bind(*kind)
                .bind(&key.service)
                .bind(&key.id)
                .bind(json.as_deref());
        }
        q.execute(&mut *conn)
            .await
            .map_err(|e| map_sqlx(e, path, what))?;
    }
    Ok(())
}

/// `nodes.last_seen`: milliseconds since the Unix epoch.
pub(crate) fn millis(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A duration in milliseconds, saturating.
pub(crate) fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The inverse of [`millis`].
pub(crate) fn from_millis(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// A stored revision as a [`Version`] number (negative: 0).
pub(crate) fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// A revision as stored, saturating.
pub(crate) fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
