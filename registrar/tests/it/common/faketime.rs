//! A child process's wall clock moved with libfaketime (`LD_PRELOAD`):
//! off by a fixed offset for its whole run, or stepped while it runs
//! through a file the library reads at every clock call. Its monotonic
//! clock (timers, `Instant`) is left alone, as an NTP step leaves it.

use std::path::{Path, PathBuf};

/// Where Debian's `libfaketime` package puts the library on x86_64.
const DEBIAN_LIBRARY: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The libfaketime library to preload: Debian's path, else wherever the
/// `libfaketime` package put it (`dpkg -L`), else any multiarch directory.
/// Panics with how to install it when there is none.
pub fn library() -> PathBuf {
    let debian = Path::new(DEBIAN_LIBRARY);
    if debian.is_file() {
        return debian.to_path_buf();
    }
    let listed = std::process::Command::new("dpkg")
        .args(["-L", "libfaketime"])
        .output()
        .ok()
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .find(|l| l.ends_with("/libfaketime.so.1"))
                .map(PathBuf::from)
        });
    let multiarch = || {
        std::fs::read_dir("/usr/lib")
            .ok()?
            .filter_map(Result::ok)
            .map(|d| d.path().join("faketime/libfaketime.so.1"))
            .find(|p| p.is_file())
    };
    listed
        .filter(|p| p.is_file())
        .or_else(multiarch)
        .unwrap_or_else(|| {
            panic!(
                "libfaketime not found (looked at {DEBIAN_LIBRARY}, `dpkg -L libfaketime` \
                 and /usr/lib/*/faketime/): install it with `apt-get install faketime` \
                 (scripts/test does)"
            )
        })
}

/// The clock of one child: the environment to start it with, and (when
/// steppable) the file that moves its clock.
pub struct FakeClock {
    env: Vec<(String, String)>,
    file: Option<PathBuf>,
    _dir: tempfile::TempDir,
}

/// libfaketime's spelling of an offset: `+12`, `-600` (seconds).
fn offset(secs: i64) -> String {
    format!("{secs:+}")
}

impl FakeClock {
    fn base() -> (Vec<(String, String)>, tempfile::TempDir) {
        let env = vec![
            ("LD_PRELOAD".into(), library().display().to_string()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ];
        (env, tempfile::tempdir().unwrap())
    }

    /// A wall clock `secs` seconds ahead (negative: behind) for the whole
    /// run.
    pub fn offset(secs: i64) -> FakeClock {
        let (mut env, dir) = Self::base();
        env.push(("FAKETIME".into(), offset(secs)));
        FakeClock {
            env,
            file: None,
            _dir: dir,
        }
    }

    /// A wall clock that starts right and moves with [`FakeClock::step`].
    pub fn steppable() -> FakeClock {
        let (mut env, dir) = Self::base();
        let file = dir.path().join("faketime");
        std::fs::write(&file, offset(0)).unwrap();
        env.push(("FAKETIME_TIMESTAMP_FILE".into(), file.display().to_string()));
        // Read the file at every clock call, so a step takes effect at once.
        env.push(("FAKETIME_NO_CACHE".into(), "1".into()));
        FakeClock {
            env,
            file: Some(file),
            _dir: dir,
        }
    }

    /// The environment variables to start the child with.
    pub fn env(&self) -> Vec<(&str, &str)> {
        self.env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    /// Set the child's wall clock to `secs` seconds off the real one (a
    /// steppable clock only). The file is replaced whole (written beside
    /// it, then renamed), so the child never reads half an offset.
    pub fn step(&self, secs: i64) {
        let file = self.file.as_ref().expect("a steppable clock");
        let next = file.with_extension("next");
        std::fs::write(&next, offset(secs)).unwrap();
        std::fs::rename(&next, file).unwrap();
    }
}
