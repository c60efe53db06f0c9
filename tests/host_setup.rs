// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The set-up and the host: `ci/setup.sh --check-host` knows Debian 12 and 13 and says in
//! one line what to install by hand elsewhere (Ubuntu's and Fedora's packages), and
//! `ci/etc-apt-check.sh` notices any change to the apt configuration it watches (ci/test.sh
//! runs it around everything, so the set-up cannot change /etc/apt unnoticed).

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{repo, TempDir};

/// `ci/setup.sh --check-host` on a host whose /etc/os-release says `os_release`.
fn check_host(d: &Path, os_release: &str, overrides: bool) -> Output {
    let f = d.join("os-release");
    std::fs::write(&f, os_release).unwrap();
    let mut c = Command::new(repo().join("ci/setup.sh"));
    c.arg("--check-host")
        .env("CXL_ACCEL_OS_RELEASE", &f)
        .env("CXL_ACCEL_CACHE", d.join("cache"))
        .env_remove("QEMU")
        .env_remove("GUEST_KERNEL")
        .env_remove("KDIR");
    if overrides {
        c.env("QEMU", "/usr/bin/qemu-system-x86_64")
            .env("GUEST_KERNEL", "/boot/vmlinuz")
            .env("KDIR", "/lib/modules/x/build");
    }
    c.output().unwrap()
}

#[test]
fn debian_12_and_13_are_known() {
    let d = TempDir::new();
    for v in ["12", "13"] {
        let out = check_host(&d.0, &format!("ID=debian\nVERSION_ID=\"{v}\"\n"), false);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "Debian {v}: {err}");
        assert!(err.contains(&format!("host: Debian {v}")), "{err}");
    }
}

#[test]
fn other_hosts_get_one_line_with_what_to_install() {
    let d = TempDir::new();
    for os in [
        "ID=ubuntu\nVERSION_ID=\"24.04\"\n",
        "NAME=\"Fedora Linux\"\nID=fedora\nVERSION_ID=42\n",
        "ID=debian\nVERSION_ID=\"11\"\n",
        "ID=arch\n",
        "",
    ] {
        let out = check_host(&d.0, os, false);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{os:?}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{os:?}: one line, got {err}");
        let line = lines[0];
        for want in [
            "Debian 12 and 13",
            "QEMU >= 10.2",
            "QEMU=, GUEST_KERNEL= and KDIR=",
            "Ubuntu: apt install qemu-system-x86 busybox-static",
            "linux-headers-generic",
            "Fedora: dnf install qemu-system-x86-core busybox",
            "kernel-devel",
        ] {
            assert!(line.contains(want), "{os:?}: no '{want}' in {line}");
        }
    }
    // With everything given, any host will do.
    let out = check_host(&d.0, "ID=ubuntu\nVERSION_ID=\"24.04\"\n", true);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("as given"), "{err}");
}

#[test]
fn etc_apt_check_sees_every_change() {
    let d = TempDir::new();
    let apt = d.0.join("apt");
    std::fs::create_dir_all(apt.join("sources.list.d")).unwrap();
    std::fs::write(
        apt.join("sources.list"),
        "deb http://example.invalid/debian bookworm main\n",
    )
    .unwrap();
    let run = |cmd: &str| {
        Command::new(repo().join("ci/etc-apt-check.sh"))
            .args(["sh", "-c", cmd])
            .env("CXL_ACCEL_ETC_APT", &apt)
            .current_dir(&d.0)
            .output()
            .unwrap()
    };
    let ok = run("true");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("unchanged"));
    // A command's own failure is passed on, the check still made.
    assert_eq!(run("exit 3").status.code(), Some(3));
    for change in [
        "echo 'deb http://example.invalid/debian sid main' >apt/sources.list.d/x.list",
        "echo changed >>apt/sources.list",
        "chmod 600 apt/sources.list",
        "ln -s /dev/null apt/preferences",
        "rmdir apt/sources.list.d",
    ] {
        let out = run(change);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{change}: not noticed: {err}");
        assert!(err.contains("changed while running"), "{change}: {err}");
        // Back to the start for the next change.
        let _ = std::fs::remove_dir_all(&apt);
        std::fs::create_dir_all(apt.join("sources.list.d")).unwrap();
        std::fs::write(
            apt.join("sources.list"),
            "deb http://example.invalid/debian bookworm main\n",
        )
        .unwrap();
    }
}
