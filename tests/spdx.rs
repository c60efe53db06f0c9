// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Licences: every tracked source file names its licence in an `SPDX-License-Identifier`
//! line near its top, with an identifier that fits where it lives (the driver and the
//! guest-side tests are GPL-2.0, everything else the crate's `Apache-2.0 OR BSD-3-Clause`),
//! and the licence texts those identifiers refer to are in the repository.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::repo;

/// How many lines from the top the identifier may be found in (a shebang, an editor or
/// shellcheck line may come first).
const HEAD_LINES: usize = 5;

/// The crate's licence, as `Cargo.toml` declares it.
const CRATE_LICENSE: &str = "Apache-2.0 OR BSD-3-Clause";

/// Directories whose files run in or against the Linux kernel: GPL.
const GPL_DIRS: &[&str] = &["guest-driver/", "samples/", "tests/guest/", "tests/kernel/"];
const GPL_IDS: &[&str] = &[
    "GPL-2.0",
    "GPL-2.0 WITH Linux-syscall-note",
    "GPL-2.0 OR BSD-3-Clause",
    "(GPL-2.0 OR BSD-3-Clause)",
];

/// Source files by name: these extensions, these file names, and executables.
const SOURCE_EXTS: &[&str] = &[
    "rs", "c", "h", "sh", "py", "config", "service", "sysusers", "xml",
];
const SOURCE_NAMES: &[&str] = &["Makefile", "Kbuild", "dkms.conf"];

/// Tracked files that are data, not source, even if they match the rules above.
const NOT_SOURCE: &[&str] = &["fuzz/corpus/"];

/// The tracked files (`git ls-files`) with whether git records them executable; outside a
/// git checkout (a crate tarball), every file under the root but build output.
fn tracked_files(root: &Path) -> Vec<(String, bool)> {
    let out = Command::new("git")
        .args(["ls-files", "-s", "-z"])
        .current_dir(root)
        .output();
    if let Ok(out) = out {
        if out.status.success() && !out.stdout.is_empty() {
            return out
                .stdout
                .split(|&b| b == 0)
                .filter(|e| !e.is_empty())
                .filter_map(|e| {
                    // "<mode> <object> <stage>\t<path>"
                    let e = String::from_utf8_lossy(e);
                    let (meta, path) = e.split_once('\t')?;
                    Some((path.to_string(), meta.starts_with("100755")))
                })
                .collect();
        }
    }
    let mut files = Vec::new();
    walk(root, root, &mut files);
    files
}

fn walk(root: &Path, dir: &Path, files: &mut Vec<(String, bool)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().to_string();
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            if !matches!(name.as_str(), "target" | ".git" | "results") {
                walk(root, &p, files);
            }
        } else if meta.is_file() {
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().to_string();
            files.push((rel, meta.permissions().mode() & 0o111 != 0));
        }
    }
}

fn is_source(path: &str, executable: bool) -> bool {
    if NOT_SOURCE.iter().any(|d| path.starts_with(d)) {
        return false;
    }
    let name = path.rsplit('/').next().unwrap_or(path);
    let ext = name.rsplit_once('.').map(|(_, e)| e);
    executable || SOURCE_NAMES.contains(&name) || ext.is_some_and(|e| SOURCE_EXTS.contains(&e))
}

/// The identifier expression of the first `SPDX-License-Identifier:` line in the head of
/// `text`, without comment closers.
fn spdx_of(text: &str) -> Option<String> {
    text.lines().take(HEAD_LINES).find_map(|l| {
        let (_, id) = l.split_once("SPDX-License-Identifier:")?;
        let id = id
            .trim()
            .trim_end_matches("-->")
            .trim_end_matches("*/")
            .trim();
        Some(id.to_string())
    })
}

/// What is wrong with one file's licence line, if anything.
fn problem(path: &str, text: &str) -> Option<String> {
    let Some(id) = spdx_of(text) else {
        return Some(format!(
            "{path}: no SPDX-License-Identifier in its first {HEAD_LINES} lines"
        ));
    };
    let gpl = GPL_DIRS.iter().any(|d| path.starts_with(d));
    let ok = if gpl {
        GPL_IDS.contains(&id.as_str())
    } else {
        id == CRATE_LICENSE
    };
    (!ok).then(|| {
        let want = if gpl {
            GPL_IDS.join("\" or \"")
        } else {
            CRATE_LICENSE.to_string()
        };
        format!("{path}: SPDX-License-Identifier \"{id}\", expected \"{want}\"")
    })
}

#[test]
fn every_source_file_has_an_spdx_line() {
    let root = repo();
    let files = tracked_files(&root);
    assert!(
        files.iter().any(|(p, _)| p == "src/main.rs"),
        "found no source files under {}",
        root.display()
    );
    let mut checked = 0;
    let mut problems = Vec::new();
    for (path, exec) in &files {
        if !is_source(path, *exec) {
            continue;
        }
        // A tracked file deleted in the work tree is not there to check.
        let Ok(bytes) = std::fs::read(root.join(path)) else {
            continue;
        };
        checked += 1;
        if let Some(p) = problem(path, &String::from_utf8_lossy(&bytes)) {
            problems.push(p);
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {checked} source files lack a fitting licence line (add \
         \"SPDX-License-Identifier: {CRATE_LICENSE}\", or GPL-2.0 in {}):\n  {}",
        problems.len(),
        GPL_DIRS.join(", "),
        problems.join("\n  ")
    );
    eprintln!("{checked} source files checked");
}

#[test]
fn the_check_finds_what_it_should() {
    assert!(problem("src/x.rs", "//! no licence\nfn main() {}\n").is_some());
    assert!(problem("src/x.rs", "// SPDX-License-Identifier: GPL-2.0\n").is_some());
    assert!(problem(
        "src/x.rs",
        "// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause\n"
    )
    .is_none());
    assert!(problem(
        "ci/x.sh",
        "#!/bin/sh\n# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause\n"
    )
    .is_none());
    assert!(problem(
        "guest-driver/uapi/x.h",
        "/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */\n"
    )
    .is_none());
    assert!(problem(
        "libvirt/x.xml",
        "<!-- SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause -->\n"
    )
    .is_none());
    // Too far down does not count.
    let late = format!(
        "{}// SPDX-License-Identifier: {CRATE_LICENSE}\n",
        "//\n".repeat(HEAD_LINES)
    );
    assert!(problem("src/x.rs", &late).is_some());
    assert!(is_source("ci/new-script", true));
    assert!(is_source("guest-driver/Kbuild", false));
    assert!(!is_source("README.md", false));
    assert!(!is_source("fuzz/corpus/chain/seed.rs", false));
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn licence_texts_match_what_the_identifiers_name() {
    let manifest = read("Cargo.toml");
    assert!(
        manifest.contains(&format!("license = \"{CRATE_LICENSE}\"")),
        "Cargo.toml must declare license = \"{CRATE_LICENSE}\""
    );
    let apache = read("LICENSE-APACHE");
    assert!(apache.contains("Apache License") && apache.contains("Version 2.0, January 2004"));
    assert!(apache.contains("END OF TERMS AND CONDITIONS"));
    let bsd = read("LICENSE-BSD-3-Clause");
    assert!(bsd.contains("the cxl-accel project"));
    assert!(bsd.contains("3. Neither the name of the copyright holder"));
    let summary = read("LICENSE");
    for f in [
        "LICENSE-APACHE",
        "LICENSE-BSD-3-Clause",
        "guest-driver/COPYING",
    ] {
        assert!(summary.contains(f), "LICENSE does not point to {f}");
    }
    let copying = read("guest-driver/COPYING");
    assert!(
        copying.contains("GNU GENERAL PUBLIC LICENSE") && copying.contains("Version 2, June 1991")
    );
    assert!(copying.contains("NOTE! This copyright does *not* cover user programs"));
    assert!(copying.contains("SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note"));
    // The module says GPL to the kernel, as its files say GPL-2.0.
    assert!(read("guest-driver/main.c").contains("MODULE_LICENSE(\"GPL\")"));
}
