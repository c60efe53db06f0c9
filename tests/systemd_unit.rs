// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `systemd/cxl-accel@.service`: systemd accepts it (`systemd-analyze verify`, where
//! installed), and its command lines work. systemd need not be running here (CI machines
//! and containers often have another PID 1; `ci/systemd-check.sh` boots a systemd container
//! for the real thing), so the test runs the unit's `ExecStart=` by hand as systemd would
//! for instance `0`: `%i` and the unit's variables expanded, an
//! `/etc/cxl-accel/0.conf` read, the runtime directory given to the service's user; as
//! root, under another user with no capabilities and no new privileges (what
//! `User=`, `CapabilityBoundingSet=` and `NoNewPrivileges=` give), the daemon's
//! own seccomp filter on. Then `ExecStartPost=` must see the socket, QEMU's user (the
//! group) must be able to reach socket and memory, and SIGTERM must stop it cleanly.

mod common;

use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{is_root, repo, TempDir};

const UNIT: &str = "systemd/cxl-accel@.service";
const INSTALLED_BINARY: &str = "/usr/local/bin/cxl-accel";
const RUNTIME: &str = "/run/cxl-accel/";
const CONF_DIR: &str = "/etc/cxl-accel/";

fn unit_text() -> String {
    std::fs::read_to_string(repo().join(UNIT)).unwrap()
}

/// `Key=value` settings of the `[Service]` section, in order, with `%i` expanded.
fn service_settings(instance: &str) -> Vec<(String, String)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for line in unit_text().lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line.to_string();
        } else if section == "[Service]" && !line.starts_with('#') {
            if let Some((k, v)) = line.split_once('=') {
                out.push((k.to_string(), v.replace("%i", instance)));
            }
        }
    }
    out
}

fn unquote(s: &str) -> &str {
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s)
}

/// systemd's expansion of a command line: `${VAR}` is one word, `$VAR` is split at blanks.
fn expand(cmd: &str, env: &HashMap<String, String>) -> Vec<String> {
    let mut words = Vec::new();
    for w in cmd.split_whitespace() {
        if let Some(name) = w.strip_prefix("${").and_then(|w| w.strip_suffix('}')) {
            words.push(env.get(name).cloned().unwrap_or_default());
        } else if let Some(name) = w.strip_prefix('$') {
            if let Some(v) = env.get(name) {
                words.extend(v.split_whitespace().map(String::from));
            }
        } else {
            words.push(w.to_string());
        }
    }
    words
}

/// The id of group `name`, if this host has it.
fn group_id(name: &str) -> Option<u32> {
    let group = std::fs::read_to_string("/etc/group").ok()?;
    group.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == name).then(|| f.nth(1)?.parse().ok())?
    })
}

#[test]
fn unit_is_accepted_by_systemd_analyze() {
    let Ok(v) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze not installed: unit syntax not checked");
        return;
    };
    assert!(v.status.success());
    // verify checks that ExecStart= exists: the unit as installed, pointing at this build.
    let d = TempDir::new();
    let text = unit_text().replace(INSTALLED_BINARY, env!("CARGO_BIN_EXE_cxl-accel"));
    std::fs::write(d.0.join("cxl-accel@.service"), text).unwrap();
    std::os::unix::fs::symlink("cxl-accel@.service", d.0.join("cxl-accel@0.service")).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(d.0.join("cxl-accel@0.service"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.trim().is_empty(),
        "systemd-analyze verify: {err}"
    );
}

#[test]
fn unit_sandbox_keeps_what_the_daemon_needs() {
    let s = service_settings("0");
    let get = |k: &str| -> Vec<&str> {
        s.iter()
            .filter(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    // The options the issue asks for, on top of the daemon's own sandbox.
    for (k, v) in [
        ("ProtectSystem", "strict"),
        ("PrivateTmp", "yes"),
        ("NoNewPrivileges", "yes"),
        ("RestrictAddressFamilies", "AF_UNIX"),
        ("CapabilityBoundingSet", ""),
        ("SystemCallArchitectures", "native"),
        ("MemoryDenyWriteExecute", "yes"),
    ] {
        assert_eq!(get(k), [v], "{k}=");
    }
    // The daemon's own filter is installed with seccomp(2), which @system-service lacks.
    let filters = get("SystemCallFilter");
    assert!(
        filters
            .iter()
            .any(|f| !f.starts_with('~') && f.split_whitespace().any(|c| c == "seccomp")),
        "SystemCallFilter= must allow seccomp: {filters:?}"
    );
    // Its own user, in QEMU's group (DynamicUser= would hide the runtime directory under
    // /run/private, out of QEMU's reach); the user comes from the sysusers.d file.
    assert!(get("DynamicUser").is_empty());
    assert_eq!(get("User"), ["cxl-accel"]);
    let group = get("SupplementaryGroups")[0];
    let sysusers = std::fs::read_to_string(repo().join("systemd/cxl-accel.sysusers")).unwrap();
    assert!(sysusers.lines().any(|l| l.starts_with("u cxl-accel ")));
    assert!(sysusers
        .lines()
        .any(|l| l == format!("m cxl-accel {group}")));
    // The --socket-group is given with chown(2) and fchown(2), which @privileged holds.
    assert!(filters
        .last()
        .unwrap()
        .split_whitespace()
        .any(|c| c == "@chown"));
    // Socket and memory file live in the unit's runtime directory, the only writable place.
    assert_eq!(get("RuntimeDirectory"), ["cxl-accel/0"]);
    let exec = get("ExecStart")[0];
    assert!(exec.contains("--socket-path /run/cxl-accel/0/"));
    assert!(get("Environment")
        .iter()
        .any(|e| unquote(e).starts_with("CXL_ACCEL_MEMORY=/run/cxl-accel/0/")));
}

#[test]
fn exec_start_serves_under_the_units_conditions() {
    let dir = TempDir::new();
    let runtime = dir.0.join("run/cxl-accel/0");
    let conf_dir = dir.0.join("etc/cxl-accel");
    std::fs::create_dir_all(&runtime).unwrap();
    std::fs::create_dir_all(&conf_dir).unwrap();
    let run_in = |s: &str| {
        s.replace(RUNTIME, &format!("{}/run/cxl-accel/", dir.0.display()))
            .replace(CONF_DIR, &format!("{}/etc/cxl-accel/", dir.0.display()))
            .replace(INSTALLED_BINARY, env!("CARGO_BIN_EXE_cxl-accel"))
    };
    let settings: Vec<(String, String)> = service_settings("0")
        .into_iter()
        .map(|(k, v)| (k, run_in(&v)))
        .collect();
    let get = |k: &str| -> Vec<String> {
        settings
            .iter()
            .filter(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .collect()
    };

    // The unit's group for QEMU, if this host has it (kvm: any host with QEMU and udev).
    let unit_group = get("SupplementaryGroups")[0].clone();
    // As root: nobody, in that group (else nogroup); otherwise ourselves.
    let (uid, group) = if is_root() {
        (65534u32, group_id(&unit_group).unwrap_or(65534))
    } else {
        // SAFETY: getuid/getgid have no preconditions.
        unsafe { (libc::getuid(), libc::getgid()) }
    };

    // Environment=, then the instance's EnvironmentFile= (it overrides them).
    let mut env: HashMap<String, String> = HashMap::new();
    for e in get("Environment") {
        let (k, v) = unquote(&e).split_once('=').unwrap();
        env.insert(k.into(), v.into());
    }
    let default_args = env["CXL_ACCEL_ARGS"].clone();
    assert!(default_args.contains(&format!("--socket-group {unit_group}")));
    let conf_path = get("EnvironmentFile")[0]
        .trim_start_matches('-')
        .to_string();
    assert!(conf_path.ends_with("/etc/cxl-accel/0.conf"), "{conf_path}");
    std::fs::write(
        &conf_path,
        format!("# test\nCXL_ACCEL_ARGS=\"--memory-size 4M --socket-group {group}\"\n"),
    )
    .unwrap();
    for line in std::fs::read_to_string(&conf_path).unwrap().lines() {
        if let Some((k, v)) = line.split_once('=').filter(|_| !line.starts_with('#')) {
            env.insert(k.into(), unquote(v).into());
        }
    }

    // systemd creates RuntimeDirectory= for the service's user, RuntimeDirectoryMode=.
    let mode = u32::from_str_radix(&get("RuntimeDirectoryMode")[0], 8).unwrap();
    std::fs::set_permissions(&runtime, std::fs::Permissions::from_mode(mode)).unwrap();
    std::os::unix::fs::chown(&runtime, Some(uid), Some(uid)).unwrap();

    let argv = expand(&get("ExecStart")[0], &env);
    assert_eq!(argv[0], env!("CARGO_BIN_EXE_cxl-accel"));
    let sock = PathBuf::from(&argv[argv.iter().position(|a| a == "--socket-path").unwrap() + 1]);
    let mem = PathBuf::from(&env["CXL_ACCEL_MEMORY"]);
    let mut cmd = if is_root() {
        let mut c = Command::new("setpriv");
        c.arg(format!("--reuid={uid}"))
            .arg(format!("--regid={uid}"))
            .arg(format!("--groups={group}"))
            .arg("--inh-caps=-all")
            .arg("--bounding-set=-all")
            .arg("--no-new-privs")
            .args(&argv);
        c
    } else {
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..]);
        c
    };
    // UMask=0077
    // SAFETY: umask only changes this process's mask; the child inherits it.
    let old = unsafe { libc::umask(0o077) };
    let mut child = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ExecStart=");
    // SAFETY: as above.
    unsafe { libc::umask(old) };

    // ExecStartPost= waits for the socket.
    let post = get("ExecStartPost")[0].clone();
    let post_argv = shell_words(&post);
    let t0 = Instant::now();
    let status = Command::new(&post_argv[0])
        .args(&post_argv[1..])
        .status()
        .unwrap();
    if !status.success() {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!(
            "ExecStartPost= failed after {:?}; daemon: {}",
            t0.elapsed(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // QEMU's group reaches both; nobody else does.
    for p in [&sock, &mem] {
        let m = std::fs::metadata(p).unwrap();
        assert_eq!(
            (m.uid(), m.gid(), m.mode() & 0o777),
            (uid, group, 0o660),
            "{}",
            p.display()
        );
    }
    assert!(std::os::unix::net::UnixStream::connect(&sock).is_ok());
    // The same paths print QEMU's arguments.
    let qemu = Command::new(env!("CARGO_BIN_EXE_cxl-accel"))
        .arg("--socket-path")
        .arg(&sock)
        .arg("--memory-path")
        .arg(&mem)
        .args(["--memory-size", "4M", "--print-qemu-args"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&qemu.stdout).contains(&format!("path={}", sock.display())));

    // systemctl stop: SIGTERM (KillMode=mixed), a clean exit, the socket gone.
    assert_eq!(get("KillMode"), ["mixed"]);
    // SAFETY: kill with a pid we own.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    // At most 10 s (200 looks, 50 ms apart).
    let status = (0..200)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(50));
            child.try_wait().unwrap()
        })
        .expect("no exit 10 s after SIGTERM");
    let out = child.wait_with_output().unwrap();
    assert!(
        status.success(),
        "exit {status} after SIGTERM: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!Path::new(&sock).exists(), "socket left behind");
}

/// Splits `/bin/sh -c '...' ARG` as systemd does: single-quoted words stay whole.
fn shell_words(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in s.chars() {
        match c {
            '\'' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    words.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        words.push(cur);
    }
    words
}
