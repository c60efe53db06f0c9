// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! Packaging: the Rust version the crate declares is the one the README and the scripts
//! ask for and no dependency in Cargo.lock needs more; `cargo package` takes the daemon's
//! files and the documents a packager needs, and leaves the driver, CI and fuzzing out.

mod common;

use std::process::Command;

use common::repo;

/// What `cargo ARGS` prints, run in the repository; it must succeed.
fn cargo(args: &[&str]) -> String {
    let out = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run cargo");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cargo {}: {err}", args.join(" "));
    String::from_utf8(out.stdout).unwrap()
}

fn rust_version() -> String {
    let manifest = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    manifest
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("Cargo.toml declares rust-version")
        .to_string()
}

fn version(v: &str) -> Vec<u32> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

#[test]
fn readme_asks_for_the_declared_rust_version() {
    let want = rust_version();
    assert_eq!(version(&want)[..2], [1, 87], "is_multiple_of needs 1.87");
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let mentions: Vec<&str> = readme
        .match_indices("cargo >= ")
        .map(|(i, m)| {
            let rest = &readme[i + m.len()..];
            let end = rest
                .find(|c: char| !c.is_ascii_digit() && c != '.')
                .unwrap_or(rest.len());
            rest[..end].trim_end_matches('.')
        })
        .collect();
    assert!(!mentions.is_empty(), "the README names no cargo version");
    for m in mentions {
        assert_eq!(
            m, want,
            "README says cargo >= {m}, Cargo.toml rust-version {want}"
        );
    }
    // The scripts read it from Cargo.toml (ci/lib.sh need_cargo) instead of repeating it.
    for script in ["ci/test.sh", "ci/demo.sh"] {
        let text = std::fs::read_to_string(repo().join(script)).unwrap();
        assert!(
            text.contains("need_cargo "),
            "{script} does not check cargo's version"
        );
    }
}

#[test]
fn no_locked_dependency_needs_a_newer_rust() {
    let json = cargo(&[
        "metadata",
        "--locked",
        "--format-version",
        "1",
        "--filter-platform",
        "x86_64-unknown-linux-gnu",
    ]);
    let ours = version(&rust_version());
    // Every package (and only packages) has a "manifest_path"; its Cargo.toml, as published
    // (normalized), names the package's rust-version on a line of its own.
    let mut newer = Vec::new();
    let mut seen = 0;
    for chunk in json.split("\"manifest_path\":\"").skip(1) {
        let path = chunk.split('"').next().unwrap();
        let manifest = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        seen += 1;
        let field = |key: &str| {
            manifest.lines().find_map(|l| {
                l.strip_prefix(key).map(|v| {
                    v.trim_start()
                        .trim_start_matches('=')
                        .trim()
                        .trim_matches('"')
                })
            })
        };
        if let Some(rv) = field("rust-version") {
            if version(rv) > ours {
                newer.push(format!("{} needs {rv}", field("name").unwrap_or(path)));
            }
        }
    }
    assert!(seen > 10, "found only {seen} packages in cargo metadata");
    assert!(
        newer.is_empty(),
        "Cargo.lock holds packages newer than rust-version {}: {} (CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback cargo update -p NAME)",
        rust_version(),
        newer.join(", ")
    );
}

#[test]
fn cargo_package_takes_the_daemon_and_its_documents() {
    let list = cargo(&["package", "--list", "--allow-dirty"]);
    let files: Vec<&str> = list.lines().collect();
    for want in [
        "Cargo.toml",
        "Cargo.lock",
        "README.md",
        "LICENSE",
        "LICENSE-APACHE",
        "LICENSE-BSD-3-Clause",
        "src/main.rs",
        "src/cli.rs",
        "docs/man/cxl-accel.1",
        "docs/completions/cxl-accel.bash",
        "docs/completions/_cxl-accel",
        "docs/completions/cxl-accel.fish",
        "docs/device-spec.md",
        "systemd/cxl-accel@.service",
    ] {
        assert!(files.contains(&want), "the crate lacks {want}:\n{list}");
    }
    for f in &files {
        for not in [
            "guest-driver/",
            "ci/",
            ".ci/",
            "fuzz/",
            "tests/",
            "target/",
            "results/",
        ] {
            assert!(!f.starts_with(not), "the crate should not carry {f}");
        }
    }
}

#[test]
fn dkms_package_is_the_crates_version() {
    let manifest = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let version = manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap();
    let conf = std::fs::read_to_string(repo().join("guest-driver/dkms.conf")).unwrap();
    let field = |k: &str| {
        conf.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=\"")))
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or_else(|| panic!("dkms.conf lacks {k}"))
            .to_string()
    };
    assert_eq!(field("PACKAGE_NAME"), "cxl-accel");
    assert_eq!(
        field("PACKAGE_VERSION"),
        version,
        "dkms.conf and Cargo.toml versions"
    );
    assert_eq!(field("BUILT_MODULE_NAME[0]"), "cxl_accel");
    assert_eq!(field("AUTOINSTALL"), "yes");
    // What the operations guide tells users to copy to.
    let doc = std::fs::read_to_string(repo().join("docs/operations.md")).unwrap();
    assert!(
        doc.contains(&format!("/usr/src/cxl-accel-{version}")),
        "docs/operations.md's DKMS section names /usr/src/cxl-accel-{version}"
    );
}
