//! File-system faults for tests, each undone when its guard is dropped
//! (also when the test panics): a small tmpfs, a full file system, the
//! immutable attribute, a read-only file. They need root (mount, chattr);
//! each returns `Err` with the reason where it is not possible, so a test
//! can print why it skips.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

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
