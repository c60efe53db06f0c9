// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The READMEs are true where a program can tell: the files and scripts they name exist, the
//! flag table lists every flag the daemon accepts (repeatable ones and the size suffixes as
//! the code takes them), and every shell block either runs in CI (`ci/readme-check.sh`, a
//! stage of `ci/test.sh`) or says why not.

mod common;

use std::path::{Path, PathBuf};

use clap::CommandFactory;
use cxl_accel::cli::{parse_size, Args};

use common::repo;

const READMES: &[&str] = &[
    "README.md",
    "ci/README.md",
    "guest-driver/README.md",
    "docs/operations.md",
    "docs/device-and-driver.md",
    "docs/faults.md",
    "docs/reliability.md",
    "docs/testing.md",
];

/// Where the flag table is.
const FLAGS_DOC: &str = "docs/operations.md";

/// Directories a path named in a README may start with (relative to the repository).
const TOP: &str =
    "ci/ tests/ guest-driver/ libvirt/ systemd/ doc/ docs/ src/ qemu-configs/ fuzz/ benches/ .ci/";

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap()
}

/// Build output and examples that name files which need not exist in a checkout.
fn made_later(p: &str) -> bool {
    p.starts_with("tests/guest/progs/out/")
        || p.ends_with(".ko")
        || p.contains("NAME")
        || p.contains('*')
        || p.contains('<')
        || p.contains("INSTANCE")
}

/// Paths in `code spans` and in (links) of a markdown text, as written.
fn named_paths(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (open, close) in [('`', '`'), ('(', ')')] {
        let mut rest = text;
        while let Some(i) = rest.find(open) {
            let after = &rest[i + 1..];
            let Some(j) = after.find(close) else { break };
            for word in after[..j].split_whitespace() {
                let w = word.trim_matches(|c: char| ",;:'\"`()".contains(c));
                let w = w.split(':').next().unwrap_or(w);
                if w.contains('/') || w.starts_with("LICENSE") {
                    out.push(w.to_string());
                }
            }
            rest = &after[j + 1..];
        }
    }
    out
}

/// The anchor GitHub gives a Markdown heading: lower case, spaces to dashes,
/// punctuation but dashes and underscores dropped.
fn heading_anchor(line: &str) -> Option<String> {
    let title = line.trim_start_matches('#');
    if title.len() == line.len() || !title.starts_with(' ') {
        return None;
    }
    Some(
        title
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect(),
    )
}

#[test]
fn files_the_readmes_name_exist() {
    let mut missing = Vec::new();
    let mut checked = 0;
    for readme in READMES {
        let dir = Path::new(readme).parent().unwrap();
        for p in named_paths(&read(readme)) {
            // From the repository (as commands are written) or relative to the README (links).
            let from_root = TOP.split(' ').any(|t| p.starts_with(t)) || p.starts_with("LICENSE");
            let from_dir = p.starts_with("../");
            if !(from_root || from_dir) || made_later(&p) {
                continue;
            }
            let path = if from_dir {
                repo().join(dir).join(&p)
            } else {
                repo().join(&p)
            };
            checked += 1;
            // A link may name a heading of the file: it must exist too.
            let (path, anchor) = match path.to_str().and_then(|s| s.split_once('#')) {
                Some((file, anchor)) => (PathBuf::from(file), Some(anchor.to_string())),
                None => (path, None),
            };
            if !path.exists() {
                missing.push(format!("{readme}: {p}"));
            } else if let Some(anchor) = anchor {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                if !text
                    .lines()
                    .any(|l| heading_anchor(l).as_deref() == Some(&anchor))
                {
                    missing.push(format!("{readme}: {p} (no such heading)"));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} paths found: the scan is broken"
    );
    assert!(
        missing.is_empty(),
        "the READMEs name files that do not exist:\n  {}",
        missing.join("\n  ")
    );
}

/// The flag table: flag name (without dashes) -> the row.
fn flag_rows() -> Vec<(String, String)> {
    let doc = read(FLAGS_DOC);
    let table = doc
        .split("\n## Flags\n")
        .nth(1)
        .expect("the flags document has a Flags section");
    table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| {
            let cell = l.split('|').nth(1)?.trim();
            let flag = cell.strip_prefix("`--")?.split([' ', '`']).next()?;
            Some((flag.to_string(), l.to_string()))
        })
        .collect()
}

#[test]
fn flag_table_is_the_daemons_command_line() {
    let rows = flag_rows();
    let cmd = Args::command();
    let visible: Vec<_> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long().map(|l| (l.to_string(), a)))
        .filter(|(l, _)| l != "help" && l != "version")
        .collect();
    for (long, arg) in &visible {
        // --guest-ram and --reconnect-ms are documented with --print-qemu-args.
        if long == "guest-ram" || long == "reconnect-ms" {
            let row = &rows.iter().find(|(f, _)| f == "print-qemu-args").unwrap().1;
            assert!(
                row.contains(&format!("--{long}")),
                "--print-qemu-args row lacks --{long}"
            );
            continue;
        }
        let row = &rows
            .iter()
            .find(|(f, _)| f == long)
            .unwrap_or_else(|| panic!("{FLAGS_DOC}: the flag table lacks --{long}"))
            .1;
        let repeatable = matches!(arg.get_action(), clap::ArgAction::Append);
        assert_eq!(
            row.contains("repeatable"),
            repeatable,
            "--{long}: {FLAGS_DOC} must say 'repeatable' exactly for repeatable flags: {row}"
        );
    }
    for (flag, _) in &rows {
        assert!(
            visible.iter().any(|(l, _)| l == flag),
            "{FLAGS_DOC}: the flag table lists --{flag}, which the daemon does not have"
        );
    }
}

#[test]
fn memory_size_suffixes_are_the_ones_the_code_takes() {
    let accepted: Vec<char> = ('A'..='Z')
        .filter(|c| parse_size(&format!("2{c}")).is_ok())
        .collect();
    for c in &accepted {
        let lower = c.to_ascii_lowercase();
        assert!(parse_size(&format!("2{lower}")).is_ok(), "{lower}");
    }
    let row = flag_rows()
        .into_iter()
        .find(|(f, _)| f == "memory-size")
        .unwrap()
        .1;
    let listed: Vec<char> = ('A'..='Z')
        .filter(|c| row.contains(&format!("`{c}`")))
        .collect();
    assert_eq!(
        listed, accepted,
        "--memory-size suffixes in the README vs. parse_size: {row}"
    );
    assert!(row.contains("either case"), "{row}");
}

#[test]
fn every_shell_block_runs_or_says_why_not() {
    for readme in READMES {
        let text = read(readme);
        let lines: Vec<&str> = text.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.trim() != "```sh" {
                continue;
            }
            let before = lines[..i]
                .iter()
                .rev()
                .find(|l| !l.trim().is_empty())
                .copied();
            if let Some(marker) = before.and_then(|b| b.trim().strip_prefix("<!-- readme-test:")) {
                let reason = marker
                    .trim()
                    .strip_prefix("skip:")
                    .unwrap_or_else(|| panic!("{readme}:{}: unknown marker {marker}", i + 1))
                    .trim_end_matches("-->")
                    .trim();
                assert!(
                    reason.len() > 10,
                    "{readme}:{}: a skipped block must say why",
                    i + 1
                );
            } else {
                // Run by ci/readme-check.sh: README.md and docs/ are run in CI.
                assert!(
                    *readme == "README.md" || readme.starts_with("docs/"),
                    "{readme}:{}: blocks outside README.md and docs/ are not run; mark it \
                     skipped with a reason",
                    i + 1
                );
            }
        }
    }
}
