// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon's layers, as folders of `src/`, and the rule between them: a layer uses only
//! the layers below it (the device model never the ring or a transport, the ring never
//! a transport), and no two modules use each other, directly or round a loop.
//!
//! From the bottom: `protocol` (the wire format), `host` (files, SIGBUS, sandbox),
//! `device` (the model), `ring` (virtqueues to requests and back), the transports beside
//! each other: `vhost` (the vhost-user adapter) and `vfio` (the vfio-user one, a PCIe
//! function of its own), `supervisor` (the worker processes around either); `control` (the
//! control channel) stands on the model only. `cli`, `qemu_args`, `main` and `lib` tie them
//! together.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each layer and the layers it may use.
const RULES: &[(&str, &[&str])] = &[
    ("protocol", &[]),
    ("host", &["protocol"]),
    ("device", &["protocol", "host"]),
    ("ring", &["protocol", "host", "device"]),
    ("vhost", &["protocol", "host", "device", "ring"]),
    ("vfio", &["protocol", "host", "device", "ring"]),
    ("supervisor", &["protocol", "host", "vhost", "vfio"]),
    ("control", &["protocol", "host", "device"]),
];

/// Files above every layer.
const TOP: &[&str] = &["cli", "qemu_args", "main", "lib"];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file: src/device/state/mod.rs is ["device", "state"].
fn module_of(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    parts
}

/// The code of a file without its comments (doc links may name any layer).
fn code(file: &Path) -> String {
    std::fs::read_to_string(file)
        .unwrap()
        .lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module paths a file's code names: `crate::a::b::...` and `super::...`, each cut to
/// the longest prefix that is a module of the crate.
fn uses(file: &Path, modules: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let text = code(file);
    let here = module_of(file);
    // The module `super` means: the parent of this file's module (a mod.rs is its module).
    let parent: Vec<String> = here[..here.len().saturating_sub(1)].to_vec();
    let mut found = BTreeSet::new();
    for (prefix, base) in [("crate::", Vec::new()), ("super::", parent)] {
        let mut rest = text.as_str();
        while let Some(i) = rest.find(prefix) {
            let before = rest[..i].chars().last();
            rest = &rest[i + prefix.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let path: Vec<String> = rest
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .next()
                .unwrap_or("")
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            let mut full = base.clone();
            full.extend(path);
            while !full.is_empty() && !modules.contains(&full) {
                full.pop();
            }
            if !full.is_empty() {
                found.insert(full);
            }
        }
    }
    found
}

fn graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(f)).collect();
    files
        .iter()
        .map(|f| (module_of(f), uses(f, &modules)))
        .collect()
}

#[test]
fn every_file_of_src_is_in_a_layer() {
    for m in graph().keys() {
        let top = m[0].as_str();
        assert!(
            TOP.contains(&top) || RULES.iter().any(|(l, _)| *l == top),
            "src/{} is in no layer: put it in one of the folders (tests/layers.rs)",
            m.join("/")
        );
    }
}

type Graph = BTreeMap<Vec<String>, BTreeSet<Vec<String>>>;

/// Uses that break the layer rule.
fn violations(g: &Graph) -> Vec<String> {
    let mut wrong = Vec::new();
    for (m, used) in g {
        let Some((_, allowed)) = RULES.iter().find(|(l, _)| *l == m[0]) else {
            continue;
        };
        for u in used {
            if u[0] != m[0] && !allowed.contains(&u[0].as_str()) {
                wrong.push(format!("{} uses {}", m.join("::"), u.join("::")));
            }
        }
    }
    wrong
}

/// A loop of modules that use each other, if any. A child may use its parent module (the
/// items it lives among) and the parent its children: that is no loop.
fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    let related = |a: &[String], b: &[String]| a.starts_with(b) || b.starts_with(a);
    let edges: BTreeMap<&Vec<String>, Vec<&Vec<String>>> = g
        .iter()
        .map(|(m, used)| (m, used.iter().filter(|u| !related(m, u)).collect()))
        .collect();
    // Depth-first search for a back edge: 1 = on the stack, 2 = done.
    fn visit<'a>(
        m: &'a Vec<String>,
        edges: &BTreeMap<&'a Vec<String>, Vec<&'a Vec<String>>>,
        state: &mut BTreeMap<&'a Vec<String>, u8>,
        stack: &mut Vec<&'a Vec<String>>,
    ) -> Option<Vec<String>> {
        state.insert(m, 1);
        stack.push(m);
        for &n in edges.get(m).map(|v| v.as_slice()).unwrap_or(&[]) {
            match state.get(n).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| *s == n).unwrap_or(0);
                    let mut cycle: Vec<String> = stack[at..].iter().map(|s| s.join("::")).collect();
                    cycle.push(n.join("::"));
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(n, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(m, 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in edges.keys() {
        if state.get(m).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(m, &edges, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// The types a file's code defines (struct, enum, union, type alias, trait).
fn defined_types(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let mut t = line.trim_start();
        if let Some(rest) = t.strip_prefix("pub") {
            // pub, pub(crate), pub(super), pub(in path)
            t = match rest.strip_prefix('(') {
                Some(r) => r.split_once(')').map_or("", |(_, r)| r),
                None => rest,
            }
            .trim_start();
        }
        for kw in ["struct ", "enum ", "union ", "type ", "trait "] {
            if let Some(rest) = t.strip_prefix(kw) {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        }
    }
    out
}

/// The self types of a file's inherent `impl` blocks (`impl Name {`, `impl<T> a::Name<T>
/// {`), by their last path segment. Trait impls (`impl Trait for Type`) add nothing a
/// lower layer could call, and `impl Trait` in argument position is no block.
fn inherent_impls(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let t = t.strip_prefix("unsafe ").unwrap_or(t);
        let Some(mut rest) = t.strip_prefix("impl") else {
            continue;
        };
        if !rest.starts_with(['<', ' ']) {
            continue;
        }
        // The header up to its `{`, over a few lines at most.
        let mut header = rest.to_string();
        for next in lines.iter().skip(i + 1).take(4) {
            if header.contains('{') {
                break;
            }
            header.push(' ');
            header.push_str(next.trim());
        }
        let header = header.split('{').next().unwrap_or("");
        rest = header.trim_start();
        // Generic parameters of the impl itself.
        if rest.starts_with('<') {
            let mut depth = 0;
            let mut end = rest.len();
            for (k, c) in rest.char_indices() {
                match c {
                    '<' => depth += 1,
                    '>' => {
                        depth -= 1;
                        if depth == 0 {
                            end = k + 1;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            rest = rest[end..].trim_start();
        }
        if rest.split_whitespace().any(|w| w == "for") {
            continue;
        }
        let path: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        if let Some(name) = path.rsplit("::").next().filter(|n| !n.is_empty()) {
            out.push(name.to_string());
        }
    }
    out
}

/// Inherent impl blocks written in another layer than their type's: methods a lower
/// layer's type gets from above, which its callers reach without naming the upper layer.
fn impl_violations(files: &[(Vec<String>, String)]) -> Vec<String> {
    let mut defined: BTreeMap<String, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (m, text) in files {
        for t in defined_types(text) {
            defined.entry(t).or_default().insert(m.clone());
        }
    }
    let mut wrong = Vec::new();
    for (m, text) in files {
        for t in inherent_impls(text) {
            let Some(homes) = defined.get(&t) else {
                continue;
            };
            if homes.iter().any(|h| h[0] == m[0]) {
                continue;
            }
            let home = homes
                .iter()
                .next()
                .map(|h| h.join("::"))
                .unwrap_or_default();
            wrong.push(format!(
                "{} implements {}::{}: write the impl in its type's layer",
                m.join("::"),
                home,
                t
            ));
        }
    }
    wrong
}

fn sources() -> Vec<(Vec<String>, String)> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files.iter().map(|f| (module_of(f), code(f))).collect()
}

#[test]
fn impl_blocks_are_in_their_types_layer() {
    let wrong = impl_violations(&sources());
    assert!(wrong.is_empty(), "layer rule broken:\n{}", wrong.join("\n"));
}

#[test]
fn the_impl_check_catches_a_method_added_from_above() {
    let file = |m: &str, code: &str| (path(m), code.to_string());
    let files = [
        file("device::state", "pub struct StateFile {\n}\nimpl StateFile {\n}\n"),
        file("device::state::alloc_log", "impl StateFile {\n    fn a() {}\n}\n"),
        file(
            "ring::journal",
            "pub struct Journal;\nimpl<'a> Journal<'a> {\n}\nimpl crate::device::state::StateFile {\n}\n\
             impl std::fmt::Debug for StateFile {\n}\nfn f(x: impl Fn()) {\n}\n",
        ),
    ];
    assert_eq!(
        impl_violations(&files),
        ["ring::journal implements device::state::StateFile: write the impl in its type's layer"]
    );
}

#[test]
fn a_layer_uses_only_the_layers_below_it() {
    let wrong = violations(&graph());
    assert!(wrong.is_empty(), "layer rule broken:\n{}", wrong.join("\n"));
}

#[test]
fn no_two_modules_use_each_other() {
    if let Some(c) = find_cycle(&graph()) {
        panic!("modules use each other: {}", c.join(" -> "));
    }
}

fn path(s: &str) -> Vec<String> {
    s.split("::").map(str::to_string).collect()
}

#[test]
fn the_checks_catch_a_model_that_uses_a_transport_and_a_loop() {
    let mut g = Graph::new();
    g.insert(path("device::state"), [path("ring::journal")].into());
    g.insert(path("ring::journal"), [path("device::state")].into());
    g.insert(path("device::mod_child"), [path("device")].into());
    assert_eq!(violations(&g), ["device::state uses ring::journal"]);
    let cycle = find_cycle(&g).expect("the loop is found");
    assert_eq!(cycle.first(), cycle.last());
    // A child using its own module is no loop.
    g.remove(&path("ring::journal"));
    assert_eq!(find_cycle(&g), None);
}

#[test]
fn comments_may_name_any_layer() {
    let dir = std::env::temp_dir().join(format!("cxla-layers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("x.rs");
    std::fs::write(
        &f,
        "use crate::vhost::server; // see crate::ring\n/// [`crate::ring`]\n",
    )
    .unwrap();
    let text = code(&f);
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(text.contains("crate::vhost") && !text.contains("crate::ring"));
}
