//! Fault-injection helpers shared by the fault tests: a small tmpfs
//! mounted for one test, the immutable attribute set for one test, page
//! surgery on a closed database file. Every guard undoes its fault when
//! dropped, also when the test panics.

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use registry_sqlite::SqliteConfig;
use sha2::{Digest, Sha256};

/// Settings for fault tests: no background sweep, short busy timeout,
/// a fast log poller.
pub fn cfg(path: &Path) -> SqliteConfig {
    SqliteConfig::new(path)
        .with_sweep_interval(None)
        .with_busy_timeout(Duration::from_millis(200))
        .with_poll_interval(Duration::from_millis(20))
}

/// Run a command; `Err` with its output when it fails or cannot start.
pub fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd} could not start: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd} {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A tmpfs of a given size mounted on a fresh temporary directory,
/// unmounted (lazily if still busy) when dropped.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mount a tmpfs of `size` (`mount -o size=…` syntax); `Err` with the
    /// reason where this process may not mount.
    pub fn mount(size: &str) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let target = dir.path().to_string_lossy().into_owned();
        run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tmpfs",
                &target,
            ],
        )?;
        Ok(Self { dir })
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Remount read-only (`Err` if the kernel refuses, e.g. a file is
    /// open for writing) or read-write.
    pub fn remount(&self, read_only: bool) -> Result<(), String> {
        let target = self.dir.path().to_string_lossy().into_owned();
        let mode = if read_only {
            "remount,ro"
        } else {
            "remount,rw"
        };
        run("mount", &["-o", mode, &target])
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let target = self.dir.path().to_string_lossy().into_owned();
        if run("umount", &[&target]).is_err() {
            let _ = run("umount", &["-l", &target]);
        }
    }
}

/// Fill the file system holding `path` by writing `path` until the disk
/// is full; returns how many bytes were written.
pub fn fill(path: &Path) -> u64 {
    let mut f = std::fs::File::create(path).expect("create the ballast file");
    let mut written = 0u64;
    for chunk in [64 * 1024, 4096, 512, 1] {
        let buf = vec![0xa5u8; chunk];
        loop {
            match f.write_all(&buf) {
                Ok(()) => written += chunk as u64,
                Err(e) => {
                    assert_eq!(
                        e.kind(),
                        std::io::ErrorKind::StorageFull,
                        "filling {}: {e}",
                        path.display()
                    );
                    break;
                }
            }
        }
    }
    let _ = f.sync_all();
    written
}

/// The immutable attribute (`chattr +i`) on some files, removed when
/// dropped.
pub struct Immutable {
    files: Vec<PathBuf>,
}

impl Immutable {
    /// Make `files` immutable; `Err` with the reason where `chattr` fails
    /// (not root, a file system without the attribute).
    pub fn set(files: &[PathBuf]) -> Result<Self, String> {
        let mut guard = Self { files: Vec::new() };
        for f in files {
            run("chattr", &["+i", &f.to_string_lossy()])?;
            guard.files.push(f.clone());
        }
        Ok(guard)
    }

    /// Remove the attribute now.
    pub fn clear(mut self) {
        self.clear_all();
    }

    fn clear_all(&mut self) {
        for f in self.files.drain(..) {
            let _ = run("chattr", &["-i", &f.to_string_lossy()]);
        }
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        self.clear_all();
    }
}

/// Whether the file system holding `dir` enforces the immutable attribute
/// on files that are already open for writing (ext4 does; tmpfs only
/// refuses new opens). `Err` with the reason when it does not, or when
/// `chattr` is not possible.
pub fn immutable_blocks_open_writers(dir: &Path) -> Result<(), String> {
    let probe = dir.join("immutable-probe");
    let mut f = std::fs::File::create(&probe).map_err(|e| format!("create probe: {e}"))?;
    let guard = Immutable::set(std::slice::from_ref(&probe))?;
    let refused = f.write_all(b"x").and_then(|()| f.sync_all()).is_err();
    guard.clear();
    let _ = std::fs::remove_file(&probe);
    if refused {
        Ok(())
    } else {
        Err(format!(
            "the file system of {} lets an already open file be written after chattr +i",
            dir.display()
        ))
    }
}

/// `path` with `suffix` appended (`registry.db` + `-wal`).
pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// SHA-256 of a file's bytes.
pub fn sha256(path: &Path) -> Vec<u8> {
    let bytes = std::fs::read(path).expect("read the file");
    Sha256::digest(&bytes).to_vec()
}

/// The page size and the root page of `table`, read with a plain
/// connection from a closed, checkpointed database file.
pub async fn root_page(path: &Path, table: &str) -> (u64, u64) {
    use sqlx::Connection;
    let url = format!("sqlite://{}?mode=ro", path.display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("connect to read the schema");
    let page_size: i64 = sqlx::query_scalar("PRAGMA page_size")
        .fetch_one(&mut conn)
        .await
        .expect("page size");
    let root: i64 = sqlx::query_scalar("SELECT rootpage FROM sqlite_master WHERE name = ?1")
        .bind(table)
        .fetch_one(&mut conn)
        .await
        .expect("root page");
    conn.close().await.expect("close");
    (page_size as u64, root as u64)
}

/// Overwrite page `page` (1-based) of the file at `path` with `bytes`
/// (garbage, or the page's saved content); returns what was there.
pub fn swap_page(path: &Path, page_size: u64, page: u64, bytes: Option<&[u8]>) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open the database file");
    let at = (page - 1) * page_size;
    let mut old = vec![0u8; page_size as usize];
    f.seek(SeekFrom::Start(at)).expect("seek");
    f.read_exact(&mut old).expect("read the page");
    let garbage: Vec<u8> = (0..page_size)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
        .collect();
    f.seek(SeekFrom::Start(at)).expect("seek");
    f.write_all(bytes.unwrap_or(&garbage))
        .expect("write the page");
    f.sync_all().expect("sync");
    old
}

/// `PRAGMA application_id` and `journal_mode` of a closed database file,
/// read with a plain read-only connection.
pub async fn header_of(path: &Path) -> (i32, String) {
    use sqlx::Connection;
    let url = format!("sqlite://{}?mode=ro", path.display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("connect to read the header");
    let id: i32 = sqlx::query_scalar("PRAGMA application_id")
        .fetch_one(&mut conn)
        .await
        .expect("application_id");
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut conn)
        .await
        .expect("journal_mode");
    conn.close().await.expect("close");
    (id, mode)
}

/// Run `sql` on the file at `path` with a plain read-write connection
/// that sets no pragma of its own (creating the file if needed).
pub async fn raw_exec(path: &Path, sql: &str) {
    use sqlx::Connection;
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("connect to write");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(&mut conn)
        .await
        .expect("run the SQL");
    conn.close().await.expect("close");
}

/// The names in a directory, sorted.
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list the directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// One row of `sql`, run on the file at `path` with a plain connection.
pub async fn raw_query<T>(path: &Path, sql: &str) -> T
where
    T: for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow> + Send + Unpin,
{
    use sqlx::Connection;
    let url = format!("sqlite://{}", path.display());
    let mut conn = sqlx::SqliteConnection::connect(&url)
        .await
        .expect("connect to query");
    let row: T = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(&mut conn)
        .await
        .expect("run the query");
    conn.close().await.expect("close");
    row
}

/// A file made read-only for this process, undone when dropped: immutable
/// (`chattr +i`) where that is possible, else mode 0444 where that stops
/// this process from opening it for writing (not root).
pub enum ReadOnlyFile {
    /// `chattr +i`.
    Immutable(Immutable),
    /// `chmod 0444`; the mode to put back.
    Mode(PathBuf, std::fs::Permissions),
}

impl ReadOnlyFile {
    /// Make `path` read-only; `Err` with the reasons where neither way
    /// works.
    pub fn set(path: &Path) -> Result<Self, String> {
        use std::os::unix::fs::PermissionsExt;
        let why_not_immutable = match Immutable::set(&[path.to_path_buf()]) {
            Ok(g) => return Ok(Self::Immutable(g)),
            Err(why) => why,
        };
        let old = std::fs::metadata(path)
            .map_err(|e| format!("stat {}: {e}", path.display()))?
            .permissions();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o444))
            .map_err(|e| format!("chmod {}: {e}", path.display()))?;
        let guard = Self::Mode(path.to_path_buf(), old);
        match std::fs::OpenOptions::new().write(true).open(path) {
            Err(_) => Ok(guard),
            Ok(_) => Err(format!(
                "{why_not_immutable}; and mode 0444 does not stop this process (root) from \
                 writing"
            )),
        }
    }

    /// Undo it now.
    pub fn clear(self) {}
}

impl Drop for ReadOnlyFile {
    fn drop(&mut self) {
        if let Self::Mode(path, old) = self {
            // SQLite gives the `-wal` and `-shm` it creates the mode of
            // the main file: those are made writable again too.
            for suffix in ["", "-wal", "-shm"] {
                let f = with_suffix(path, suffix);
                if f.exists() {
                    let _ = std::fs::set_permissions(&f, old.clone());
                }
            }
        }
    }
}
