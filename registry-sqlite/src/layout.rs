//! The on-disk layout: the file's owner mark and schema (an ordered list
//! of migrations, checked and applied on open), and how rows encode
//! endpoints and changes.
//!
//! `schema_version` holds the number of every migration applied. A
//! migration is never edited once released; a change is a new entry.
//! The crate README describes the tables for people reading the file.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sqlx::sqlite::SqliteConnection;
use sqlx::AssertSqlSafe;
use waypost::{Endpoint, EndpointKey, Error, Event, Result, Version};

use crate::error::{corrupt, map_sqlx};

/// `PRAGMA application_id` of every waypost-sqlite file: `0x72677374`,
/// "rgst" in ASCII. Set on open in a file that has none (a new file, or
/// one written by a release from before it was set); a file with another
/// id is another application's and is refused.
pub(crate) const APPLICATION_ID: i32 = 0x7267_7374;

/// Tables every waypost-sqlite file has had since the first release: a
/// file with these and `application_id` 0 is ours, written by a release
/// that did not set the id.
pub(crate) const OUR_TABLES: &[&str] = &["meta", "schema_version"];

/// A write that changes nothing: run inside a write transaction, it fails
/// with `READONLY` when SQLite will not write the file (a connection
/// SQLite had to open read-only), and with an error when `meta` is
/// missing or unreadable. It affects exactly one row.
pub(crate) const TOUCH_META: &str = "UPDATE meta SET value = value WHERE key = 'revision'";

/// Run [`TOUCH_META`]: the write check of `probe` and of the open.
pub(crate) async fn touch_meta(conn: &mut SqliteConnection, path: &Path, what: &str) -> Result<()> {
    let done = sqlx::query(TOUCH_META)
        .execute(conn)
        .await
        .map_err(|e| map_sqlx(e, path, what))?;
    match done.rows_affected() {
        1 => Ok(()),
        _ => Err(corrupt(path, what, "meta.revision is missing")),
    }
}

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
    // 2: a count of each node's recorded heartbeats, by whose changes
    // liveness judges silence (on each process's own monotonic clock).
    r#"
    ALTER TABLE nodes ADD COLUMN beats INTEGER NOT NULL DEFAULT 0;
    "#,
];

/// The most problems `PRAGMA quick_check` reports at open. The check
/// reads every page (its cost grows with the file, a few milliseconds per
/// megabyte), but stops collecting problems at this many; one is enough
/// to refuse the file.
pub(crate) const QUICK_CHECK_LIMIT: u32 = 100;

/// What a database file says about its owner.
pub(crate) struct Found {
    application_id: i32,
    /// Its tables, SQLite's own (`sqlite_…`) left out.
    tables: Vec<String>,
}

impl Found {
    pub(crate) async fn read(conn: &mut SqliteConnection, path: &Path, what: &str) -> Result<Self> {
        let application_id: i32 = sqlx::query_scalar("PRAGMA application_id")
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| map_sqlx(e, path, what))?;
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_master WHERE type = 'table' \
             AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name",
        )
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| map_sqlx(e, path, what))?;
        Ok(Self {
            application_id,
            tables,
        })
    }

    /// Whether the file is ours; `Ok(true)` when it still has to be
    /// marked (an empty database, or one written by a release before
    /// `application_id` was set), `Ok(false)` when it is marked already.
    /// Another application's database is refused, naming the path.
    pub(crate) fn check_ours(&self, path: &Path) -> Result<bool> {
        let p = path.display();
        match self.application_id {
            APPLICATION_ID => Ok(false),
            0 if self.tables.is_empty() => Ok(true),
            0 if OUR_TABLES
                .iter()
                .all(|t| self.tables.iter().any(|have| have == t)) =>
            {
                Ok(true)
            }
            0 => {
                let mut shown = self.tables.iter().take(5).cloned().collect::<Vec<_>>();
                if self.tables.len() > shown.len() {
                    shown.push("…".into());
                }
                Err(Error::invalid(
                    "path",
                    format!(
                        "{p} is another application's SQLite database (its tables: {}; no \
                         waypost-sqlite schema); the file was left untouched",
                        shown.join(", ")
                    ),
                ))
            }
            other => Err(Error::invalid(
                "path",
                format!(
                    "{p} belongs to another application (its application_id is {other:#010x}, \
                     waypost-sqlite files have {APPLICATION_ID:#010x}); the file was left \
                     untouched"
                ),
            )),
        }
    }
}

/// Inside the open's write transaction: `PRAGMA quick_check`, the
/// ownership check again under the lock, the migrations the file lacks, a
/// no-op write to `meta` (`BEGIN IMMEDIATE` alone succeeds on a file SQLite
/// could only open read-only), and our `application_id` on an unmarked
/// file.
pub(crate) async fn prepare(conn: &mut SqliteConnection, path: &Path, what: &str) -> Result<()> {
    let checking = format!("{what}: PRAGMA quick_check({QUICK_CHECK_LIMIT})");
    let problems: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
        "PRAGMA quick_check({QUICK_CHECK_LIMIT})"
    )))
    .fetch_all(&mut *conn)
    .await
    .map_err(|e| map_sqlx(e, path, &checking))?;
    if problems != ["ok"] {
        let shown: Vec<&str> = problems.iter().take(3).map(String::as_str).collect();
        return Err(Error::internal(format!(
            "{checking} on {}: the file is corrupt: {} problem(s) found: {}; restore it from \
             a backup (nothing was written)",
            path.display(),
            problems.len(),
            shown.join("; ")
        )));
    }
    let owner = format!("{what}: check who owns the file");
    let unmarked = Found::read(conn, path, &owner).await?.check_ours(path)?;
    migrate(conn, path).await?;
    // BEGIN IMMEDIATE alone succeeds on a file SQLite had to open
    // read-only (an immutable file, a read-only mount); a write does not.
    touch_meta(conn, path, &format!("{what}: a no-op write to meta")).await?;
    if unmarked {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "PRAGMA application_id = {APPLICATION_ID}"
        )))
        .execute(&mut *conn)
        .await
        .map_err(|e| map_sqlx(e, path, what))?;
        tracing::info!(path = %path.display(), application_id = APPLICATION_ID, "marked the file as a waypost-sqlite database");
    }
    Ok(())
}

/// Apply every migration the file lacks.
async fn migrate(conn: &mut SqliteConnection, path: &Path) -> Result<()> {
    let what = "migrate the schema";
    let err = |e| map_sqlx(e, path, what);
    sqlx::query("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY)")
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    let have: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM schema_version")
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?;
    let known = MIGRATIONS.len() as i64;
    if have > known {
        return Err(Error::internal(format!(
            "{}: schema version {have} was written by a newer waypost-sqlite (this one knows \
             up to {known})",
            path.display()
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(have as usize) {
        sqlx::raw_sql(*sql).execute(&mut *conn).await.map_err(err)?;
        sqlx::query("INSERT INTO schema_version (version) VALUES (?1)")
            .bind(i as i64 + 1)
            .execute(&mut *conn)
            .await
            .map_err(err)?;
        tracing::info!(path = %path.display(), version = i + 1, "applied schema migration");
    }
    Ok(())
}

/// The endpoint columns written on every change. Reads take only
/// `endpoint` (the whole endpoint as JSON): decoding one column is several
/// times cheaper than nine; the others are there for SQL queries (by node,
/// by health) and for people reading the file.
macro_rules! ep_cols {
    () => {
        "service, id, address, port, protocol, cluster, node, health, endpoint"
    };
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership() {
        let p = Path::new("/x/r.db");
        assert!(!found(APPLICATION_ID, &["anything"])
            .check_ours(p)
            .expect("ours"));
        assert!(found(0, &[]).check_ours(p).expect("empty"));
        let previous = ["changes", "endpoints", "meta", "nodes", "schema_version"];
        assert!(found(0, &previous).check_ours(p).expect("previous release"));
        let err = found(0, &["invoices", "meta"])
            .check_ours(p)
            .expect_err("foreign");
        assert!(err.to_string().contains("/x/r.db") && err.to_string().contains("invoices"));
        let err = found(0x1234, &previous)
            .check_ours(p)
            .expect_err("marked by another");
        assert!(err.to_string().contains("0x00001234"), "{err}");
    }

    fn found(id: i32, tables: &[&str]) -> Found {
        Found {
            application_id: id,
            tables: tables.iter().map(|t| t.to_string()).collect(),
        }
    }
}
