//! `docs/first-service.md` shows, file by file, the crate in
//! `examples/first-service`, which the workspace builds and tests: every
//! file shown is the file built (the manifest with published versions in
//! place of the workspace's paths), every file of the crate is shown, and
//! the CI job installs the packages that provide what the test and the
//! build run (`etcd`, `protoc`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the examples crate is in the workspace")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The files the page shows: (path after "File `…`:", the fenced block
/// that follows).
fn shown() -> Vec<(String, String)> {
    let page = read(&repo().join("docs/first-service.md"));
    let mut lines = page.lines();
    let mut files = Vec::new();
    while let Some(line) = lines.next() {
        let Some(path) = line
            .strip_prefix("File `")
            .and_then(|rest| rest.strip_suffix("`:"))
        else {
            continue;
        };
        let fence = lines
            .by_ref()
            .find(|l| l.starts_with("```"))
            .unwrap_or_else(|| panic!("no code block after the heading of {path}"));
        assert!(fence.len() > 3, "the block of {path} names no language");
        let mut body = String::new();
        for l in lines.by_ref().take_while(|l| *l != "```") {
            body.push_str(l);
            body.push('\n');
        }
        files.push((path.to_string(), body));
    }
    files
}

/// The manifest as a user writes it: published versions, not paths.
fn as_published(manifest: &str) -> String {
    let mut out = String::new();
    for line in manifest.lines() {
        let line = match (line.find("path = \""), line.find("version = \"0.1.0\"")) {
            (Some(p), Some(v)) if p < v => {
                format!("{}version = \"0.1\"{}", &line[..p], &line[v + 17..])
            }
            _ => line.to_string(),
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn crate_files(dir: &Path, under: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).expect("read the crate's directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            crate_files(&path, under, out);
        } else {
            let rel = path.strip_prefix(under).expect("under the crate");
            out.insert(rel.to_string_lossy().into_owned());
        }
    }
}

#[test]
fn the_page_shows_the_crate_that_is_built_file_by_file() {
    let dir = repo().join("examples/first-service");
    let shown = shown();
    for (path, body) in &shown {
        let real = read(&dir.join(path));
        let expected = if path == "Cargo.toml" {
            as_published(&real)
        } else {
            real
        };
        assert!(
            *body == expected,
            "docs/first-service.md shows {path} differently from examples/first-service/{path}"
        );
    }
    let shown: BTreeSet<String> = shown.into_iter().map(|(p, _)| p).collect();
    let mut files = BTreeSet::new();
    crate_files(&dir, &dir, &mut files);
    assert_eq!(
        shown, files,
        "the page must show every file of the crate, once"
    );
}

#[test]
fn the_ci_job_installs_what_the_test_and_the_build_run() {
    let yaml = read(&repo().join("examples/first-service/.github/workflows/ci.yml"));
    let runs: Vec<&str> = yaml
        .lines()
        .filter_map(|l| l.trim().strip_prefix("run: "))
        .collect();
    assert_eq!(
        runs.last(),
        Some(&"cargo test"),
        "the job ends by running the tests: {runs:?}"
    );
    let packages: BTreeSet<&str> = runs
        .iter()
        .filter_map(|r| r.split("apt-get install -y ").nth(1))
        .flat_map(|p| p.split_whitespace())
        .collect();
    assert_eq!(
        packages,
        BTreeSet::from(["etcd-server", "protobuf-compiler"])
    );
    // Where Debian's package database is at hand, those are the packages
    // that own the programs (the fixture runs `etcd`; waypost-etcd's build
    // runs `protoc`).
    for (program, package) in [("etcd", "etcd-server"), ("protoc", "protobuf-compiler")] {
        let Ok(found) = std::process::Command::new("sh")
            .args(["-c", &format!("dpkg -S \"$(command -v {program})\"")])
            .output()
        else {
            continue;
        };
        if !found.status.success() {
            eprintln!("skipped: dpkg does not know {program} here");
            continue;
        }
        let owner = String::from_utf8_lossy(&found.stdout);
        assert!(
            owner.starts_with(&format!("{package}:")),
            "{program} belongs to {owner}"
        );
    }
}
