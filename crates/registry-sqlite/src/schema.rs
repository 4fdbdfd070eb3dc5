//! The schema, as an ordered list of migrations applied on open.
//!
//! `schema_version` holds the number of every migration applied. A
//! migration is never edited once released; a change is a new entry.

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
