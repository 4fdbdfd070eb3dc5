//! The documentation's names hold: every relative link and every file path
//! in the Markdown exists, and every `--flag` that the registrar's pages
//! and `deploy/` name is one the `registrar` binary accepts.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::deploy::repo;

/// Every file under `dir` whose name ends with one of `exts`, skipping
/// build output and hidden directories.
fn files(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" && name != "node_modules" {
                files(&path, exts, out);
            }
        } else if exts.iter().any(|e| name.ends_with(e)) {
            out.push(path);
        }
    }
}

/// The text of `md` outside fenced code blocks.
fn prose(md: &str) -> String {
    let mut fenced = false;
    let mut out = String::new();
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The targets of the Markdown links `[text](target)` in `text`.
fn link_targets(text: &str) -> Vec<String> {
    text.match_indices("](")
        .filter_map(|(i, _)| {
            let rest = &text[i + 2..];
            let end = rest.find([')', ' ', '\n'])?;
            Some(rest[..end].to_string())
        })
        .collect()
}

#[test]
fn every_relative_link_in_the_markdown_exists() {
    let root = repo();
    let mut mds = Vec::new();
    files(&root, &[".md"], &mut mds);
    let mut broken = Vec::new();
    for md in &mds {
        let text = prose(&std::fs::read_to_string(md).unwrap());
        for target in link_targets(&text) {
            let path = target.split('#').next().unwrap_or_default();
            if path.is_empty() || path.contains("://") || path.starts_with("mailto:") {
                continue;
            }
            if !md.parent().unwrap().join(path).exists() {
                broken.push(format!(
                    "{}: {target}",
                    md.strip_prefix(&root).unwrap().display()
                ));
            }
        }
    }
    assert!(mds.len() > 20, "found only {} Markdown files", mds.len());
    assert!(
        broken.is_empty(),
        "links to nothing:\n{}",
        broken.join("\n")
    );
}

/// Code spans in `text` that name a file of the repository by its path
/// from the root (`registry-api/src/lib.rs`, `deploy/Dockerfile`).
fn repo_paths(text: &str, tops: &BTreeSet<String>) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| {
            !span.contains(' ')
                && span.contains('/')
                && tops.contains(span.split('/').next().unwrap_or_default())
        })
        .map(|span| span.trim_end_matches([':', ',', '.']).to_string())
        .collect()
}

#[test]
fn every_repository_path_the_markdown_names_exists() {
    let root = repo();
    // Paths are recognised by their first component: a top-level entry.
    let tops: BTreeSet<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.') && n != "target")
        .collect();
    let mut mds = Vec::new();
    files(&root, &[".md"], &mut mds);
    let mut missing = Vec::new();
    for md in &mds {
        let text = prose(&std::fs::read_to_string(md).unwrap());
        // Directories the page names: paths may be relative to one of them.
        let dirs: Vec<std::path::PathBuf> = repo_paths(&text, &tops)
            .into_iter()
            .map(|d| root.join(d))
            .filter(|d| d.is_dir())
            .collect();
        for path in repo_paths(&text, &tops) {
            // A glob or a placeholder names no one file.
            if path.contains(['*', '<', '{']) {
                continue;
            }
            // From the root, or from the crate or directory the page is in
            // or names.
            let found = root.join(&path).exists()
                || md.parent().unwrap().join(&path).exists()
                || tops.iter().any(|top| root.join(top).join(&path).exists())
                || dirs.iter().any(|d| d.join(&path).exists());
            if !found {
                missing.push(format!(
                    "{}: {path}",
                    md.strip_prefix(&root).unwrap().display()
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "paths to nothing:\n{}",
        missing.join("\n")
    );
}

const BIN: &str = env!("CARGO_BIN_EXE_registrar");
const COMMANDS: [&str; 6] = [
    "serve",
    "ls",
    "watch",
    "register",
    "heartbeat",
    "deregister",
];

/// Flags of cargo that the pages name beside the registrar's.
const CARGO: [&str; 4] = [
    "--all-features",
    "--features",
    "--no-default-features",
    "--release",
];

/// The `--flags` in `text`: those opening a code span, and those on lines
/// that run the registrar or set its container's arguments.
fn flags_in(text: &str, yaml: bool) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut take = |s: &str| {
        let flag: String = s
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        // `--tls-*` names a family; cargo's flags are cargo's.
        let family = flag.ends_with('-');
        if flag.len() > 3 && flag.starts_with("--") && !family && !CARGO.contains(&flag.as_str()) {
            out.insert(flag);
        }
    };
    for span in text.split('`').skip(1).step_by(2) {
        if span.starts_with("--") {
            take(span);
        }
    }
    for line in text.lines() {
        let runs = line.contains("registrar serve")
            || line.trim_start().starts_with("registrar ")
            || (yaml && line.trim_start().starts_with("- --"));
        if runs {
            for (i, _) in line.match_indices("--") {
                take(&line[i..]);
            }
        }
    }
    out
}

/// The `--help` of every command of the binary, one after the other.
pub(super) fn all_help() -> String {
    let mut help = String::new();
    for cmd in COMMANDS {
        let out = Command::new(BIN).args([cmd, "--help"]).output().unwrap();
        assert!(out.status.success(), "registrar {cmd} --help failed");
        help.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    help
}

/// Whether some command of the binary accepts `flag` (hidden ones too):
/// given with `--help`, only an unknown flag is an unexpected argument.
/// `help` is [`all_help`].
pub(super) fn accepted(flag: &str, help: &str) -> bool {
    if help.contains(&format!("{flag} ")) || help.contains(&format!("{flag}\n")) {
        return true;
    }
    COMMANDS.iter().any(|cmd| {
        let out = Command::new(BIN)
            .args([cmd, flag, "--help"])
            .output()
            .unwrap();
        !String::from_utf8_lossy(&out.stderr).contains("unexpected argument")
    })
}

#[test]
fn every_flag_the_registrar_docs_and_manifests_name_is_accepted() {
    let root = repo();
    let help = all_help();
    let mut sources = vec![
        root.join("registrar/README.md"),
        root.join("registrar-server/README.md"),
        root.join("deploy/README.md"),
    ];
    files(&root.join("docs/registrar"), &[".md"], &mut sources);
    files(
        &root.join("deploy"),
        &[".yaml", ".yml", "Dockerfile"],
        &mut sources,
    );
    let mut unknown = Vec::new();
    let mut checked = 0;
    for file in &sources {
        let yaml = !file.to_string_lossy().ends_with(".md");
        for flag in flags_in(&std::fs::read_to_string(file).unwrap(), yaml) {
            checked += 1;
            if !accepted(&flag, &help) {
                unknown.push(format!(
                    "{}: {flag}",
                    file.strip_prefix(&root).unwrap().display()
                ));
            }
        }
    }
    assert!(
        checked > 30,
        "found only {checked} flags: is the search broken?"
    );
    assert!(
        unknown.is_empty(),
        "flags the registrar does not accept:\n{}",
        unknown.join("\n")
    );
}
