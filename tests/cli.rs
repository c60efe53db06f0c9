// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The `cxl-accel` binary as an operator meets it: flags, one-line errors, signals.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> Command {
    common::daemon()
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cxl-accel-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

use common::fails_with_one_line;

#[test]
fn help_explains_every_flag() {
    let out = bin().arg("--help").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--socket-path",
        "--memory-path",
        "--memory-size",
        "--virtio-id",
        "--queue-size",
        "--dma-threads",
        "--print-qemu-args",
        "--print-capabilities",
        "--fd",
        "--socket-group",
        "RUST_LOG",
    ] {
        assert!(text.contains(flag), "--help does not mention {flag}");
    }
}

#[test]
fn print_qemu_args_is_complete_and_touches_nothing() {
    let d = temp_dir("print");
    let mem = d.join("mem");
    let print = |attach: &str| {
        let out = bin()
            .args(["--socket-path", "/tmp/x.sock", "--memory-path"])
            .arg(&mem)
            .args([
                "--memory-size",
                "64M",
                "--print-qemu-args",
                "--attach",
                attach,
            ])
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let common = [
        "memory-backend-memfd,id=cxl-guest-ram,size=1G,share=on",
        "-chardev socket,id=cxlacc0-sock,path=/tmp/x.sock",
        "vhost-user-test-device-pci,id=cxlacc0,chardev=cxlacc0-sock,virtio-id=21,num_vqs=5",
        "config_size=64",
    ];
    // Shared memory (QEMU 11.1): one function; QEMU gets the memory file from the daemon.
    let text = print("shmem");
    for piece in common.iter().chain(&["bus=pcie.0,addr=0x10.0"]) {
        assert!(text.contains(piece), "missing {piece} in:\n{text}");
    }
    for absent in ["multifunction", "memory-backend-file", "ivshmem"] {
        assert!(!text.contains(absent), "{absent} in:\n{text}");
    }
    // ivshmem sibling (QEMU 10.2).
    let text = print("bar");
    for piece in common.iter().chain(&[
        "addr=0x10.0,multifunction=on",
        "memory-backend-file,id=cxlacc0-mem",
        "size=64M,share=on",
        "ivshmem-plain,id=cxlacc0-bar,memdev=cxlacc0-mem,bus=pcie.0,addr=0x10.1",
    ]) {
        assert!(text.contains(piece), "missing {piece} in:\n{text}");
    }
    assert!(
        !mem.exists(),
        "printing arguments must not create the memory file"
    );
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn clear_errors_instead_of_panics() {
    let d = temp_dir("errors");
    let mem = d.join("mem");
    std::fs::write(&mem, vec![0u8; 4096]).unwrap();
    let sock = d.join("s.sock");
    let (m, s) = (mem.to_str().unwrap(), sock.to_str().unwrap());
    let e = fails_with_one_line(&[
        "--socket-path",
        s,
        "--memory-path",
        m,
        "--memory-size",
        "64M",
    ]);
    assert!(
        e.contains("is 4096 bytes but --memory-size asks for 67108864"),
        "{e}"
    );
    let e = fails_with_one_line(&[
        "--socket-path",
        "/nonexistent/dir/s.sock",
        "--memory-path",
        d.join("m2").to_str().unwrap(),
        "--memory-size",
        "4M",
    ]);
    assert!(
        e.contains("cannot listen on /nonexistent/dir/s.sock"),
        "{e}"
    );
    let e = fails_with_one_line(&[
        "--socket-path",
        s,
        "--memory-path",
        m,
        "--memory-size",
        "3M",
        "--attach",
        "bar",
    ]);
    assert!(e.contains("multiple of 2 MiB"), "{e}");
    let e = fails_with_one_line(&[
        "--socket-path",
        s,
        "--memory-path",
        m,
        "--memory-size",
        "12Q",
    ]);
    assert!(e.contains("unknown size suffix"), "{e}");
    let _ = std::fs::remove_dir_all(d);
}

fn wait_for(path: &std::path::Path) {
    let t = Instant::now();
    while !path.exists() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "daemon did not create its socket"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn stale_socket_is_replaced_live_one_is_refused_and_sigterm_exits_cleanly() {
    let d = temp_dir("socket");
    let sock = d.join("s.sock");
    // A stale socket file, as a crashed daemon leaves it.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(sock.exists());
    let args = |mem: &str| {
        vec![
            "--socket-path".to_string(),
            sock.to_str().unwrap().to_string(),
            "--memory-path".to_string(),
            d.join(mem).to_str().unwrap().to_string(),
            "--memory-size".to_string(),
            "4M".to_string(),
        ]
    };
    let mut daemon = bin()
        .args(args("m1"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&d.join("m1"));
    // Wait until it accepts connections.
    let t = Instant::now();
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(t.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(10));
    }
    let args2 = args("m2");
    let args2: Vec<&str> = args2.iter().map(|s| s.as_str()).collect();
    let e = fails_with_one_line(&args2);
    assert!(e.contains("in use by a running process"), "{e}");
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    let status = loop {
        if let Some(s) = daemon.try_wait().unwrap() {
            break s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "daemon ignored SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(status.success());
    assert!(!sock.exists(), "socket removed on shutdown");
    let _ = std::fs::remove_dir_all(d);
}

/// qemu-configs/ holds the documented command lines; they must be what the daemon prints.
#[test]
fn qemu_configs_match_print_qemu_args() {
    let print = |extra: &[&str]| -> String {
        let out = bin()
            .args(["--memory-size", "256M", "--print-qemu-args"])
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let dev0 = print(&[
        "--socket-path",
        "/run/cxl-accel/cxl0.sock",
        "--memory-path",
        "/dev/shm/cxl-accel0",
    ]);
    let dev1 = print(&[
        "--socket-path",
        "/run/cxl-accel/cxl1.sock",
        "--memory-path",
        "/dev/shm/cxl-accel1",
        "--index",
        "1",
        "--guest-ram",
        "none",
    ]);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("qemu-configs");
    let check = |name: &str, expect: String| {
        let file = std::fs::read_to_string(dir.join(name)).unwrap();
        assert_eq!(file, expect, "regenerate qemu-configs/{name}");
    };
    check("one-device.args", dev0.clone());
    check(
        "two-devices.args",
        format!("{} \\\n{dev1}", dev0.trim_end()),
    );
    // QEMU 10.2: the ivshmem sibling.
    let bar0 = print(&[
        "--socket-path",
        "/run/cxl-accel/cxl0.sock",
        "--memory-path",
        "/dev/shm/cxl-accel0",
        "--attach",
        "bar",
    ]);
    check("one-device-qemu-10.2.args", bar0);
}

/// Under the seccomp filter (the default) the daemon still serves a front-end and exits on
/// SIGTERM.
#[test]
fn sandboxed_daemon_serves_and_exits_cleanly() {
    use vhost::vhost_user::Frontend;
    use vhost::VhostBackend;
    let d = temp_dir("seccomp");
    let sock = d.join("s.sock");
    // No --seccomp: enforce is the default.
    let daemon = spawn_on(&mut bin(), &sock, &d);
    let t = Instant::now();
    let fe = loop {
        if let Ok(f) = Frontend::connect(&sock, 2) {
            break f;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "daemon did not listen"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    fe.set_owner().unwrap();
    assert_ne!(fe.get_features().unwrap() & (1 << 32), 0);
    drop(fe);
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let out = daemon.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("seccomp filter installed (Enforce)"), "{err}");
    assert!(!err.contains("refused system call"), "{err}");
    let _ = std::fs::remove_dir_all(d);
}

/// The supervisor: SIGTERM stops it and its worker and removes both sockets; after a
/// SIGKILL of everything, the stale socket, worker socket and state file are taken over.
#[test]
fn supervised_daemon_stops_cleanly_and_recovers_from_a_crash() {
    let d = temp_dir("supervise");
    let sock = d.join("s.sock");
    let worker_sock = d.join("s.sock.worker");
    let state = d.join("mem.state");
    let mem = d.join("mem");
    let args = [
        "--supervise",
        "--socket-path",
        sock.to_str().unwrap(),
        "--memory-path",
        mem.to_str().unwrap(),
        "--memory-size",
        "4M",
    ];
    let wait_connectable = || {
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            assert!(t.elapsed() < Duration::from_secs(10), "no socket");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let sup = bin().args(args).stderr(Stdio::piped()).spawn().unwrap();
    wait_connectable();
    // A connection starts a worker; the state file is locked meanwhile.
    let conn = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let worker = common::wait_for_child(sup.id(), None) as i32;
    assert!(state.exists() && worker_sock.exists());
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(sup.id() as i32, libc::SIGTERM) };
    let out = sup.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!sock.exists() && !worker_sock.exists(), "sockets removed");
    let t = Instant::now();
    // SAFETY: signal 0 only checks whether the process exists.
    while unsafe { libc::kill(worker, 0) } == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "worker outlived SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(conn);

    // A crash of both processes leaves the sockets and the state file behind.
    let mut sup = bin().args(args).stderr(Stdio::null()).spawn().unwrap();
    wait_connectable();
    let conn = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    let worker = common::wait_for_child(sup.id(), None) as i32;
    // SAFETY: kill(2) on our own child and its child.
    unsafe {
        libc::kill(worker, libc::SIGKILL);
        libc::kill(sup.id() as i32, libc::SIGKILL);
    }
    sup.wait().unwrap();
    drop(conn);
    assert!(sock.exists() && state.exists());
    let mut sup = bin().args(args).stderr(Stdio::piped()).spawn().unwrap();
    // The socket is connectable a moment before the line is logged: wait for the line, or
    // a SIGTERM in between would end the supervisor before it says where it serves.
    let mut stderr = std::io::BufReader::new(sup.stderr.take().unwrap());
    let mut log = String::new();
    while !log.contains("supervising on") {
        let n = std::io::BufRead::read_line(&mut stderr, &mut log).unwrap();
        assert_ne!(n, 0, "supervisor exited: {log}");
    }
    wait_connectable();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(sup.id() as i32, libc::SIGTERM) };
    std::io::Read::read_to_string(&mut stderr, &mut log).unwrap();
    let status = sup.wait().unwrap();
    assert!(status.success(), "{status:?}: {log}");
    let _ = std::fs::remove_dir_all(d);
}

/// The daemon command, under `--supervise` or not.
fn daemon_cmd(supervise: bool) -> Command {
    let mut cmd = bin();
    if supervise {
        cmd.arg("--supervise");
    }
    cmd
}

/// A front-end's first exchange: the daemon answers with VERSION_1 offered.
fn greet(fe: vhost::vhost_user::Frontend) {
    use vhost::VhostBackend;
    fe.set_owner().unwrap();
    assert_ne!(fe.get_features().unwrap() & (1 << 32), 0);
}

/// SIGTERM; the daemon must exit successfully and never have met its seccomp filter.
fn stop_cleanly(daemon: std::process::Child) {
    // SAFETY: plain kill(2) on our own child.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let out = daemon.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("refused system call"), "{err}");
}

/// Starts the daemon with 4 MiB of device memory in `dir` on socket `sock`, its log piped.
fn spawn_on(
    cmd: &mut Command,
    sock: &std::path::Path,
    dir: &std::path::Path,
) -> std::process::Child {
    cmd.args(["--memory-size", "4M", "--socket-path"])
        .arg(sock)
        .arg("--memory-path")
        .arg(dir.join("mem"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A test directory and a socket listening in it (the front-end's, or one to hand over).
fn listening(name: &str) -> (PathBuf, PathBuf, std::os::unix::net::UnixListener) {
    let d = temp_dir(name);
    let sock = d.join("given.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    (d, sock, listener)
}

/// In client socket mode the sandboxed daemon connects to the front-end's socket, and
/// again when the connection drops.
#[test]
fn sandboxed_client_mode_daemon_connects_and_reconnects() {
    for supervise in [false, true] {
        let (d, sock, listener) = listening(if supervise { "client-sup" } else { "client" });
        let mut cmd = daemon_cmd(supervise);
        cmd.args(["--socket-mode", "client"]);
        let mut daemon = spawn_on(&mut cmd, &sock, &d);
        for _ in 0..2 {
            let (stream, _) = listener.accept().unwrap();
            greet(vhost::vhost_user::Frontend::from_stream(stream, 2));
        }
        assert!(daemon.try_wait().unwrap().is_none());
        stop_cleanly(daemon);
        let _ = std::fs::remove_dir_all(d);
    }
}

/// vhost-user backend program conventions: --print-capabilities prints JSON and ignores
/// everything else.
#[test]
fn print_capabilities_prints_json_and_ignores_the_rest() {
    for args in [
        vec!["--print-capabilities"],
        vec![
            "--memory-size",
            "12Q",
            "--print-capabilities",
            "--no-such-flag",
        ],
    ] {
        let out = bin().args(&args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert_eq!(text.trim(), r#"{"type": "cxl-accel", "features": []}"#);
    }
}

/// vhost-user backend program conventions: --fd serves a listening socket handed over by
/// the caller (as libvirt does), with or without the supervisor, and refuses anything else.
#[test]
fn a_listening_socket_handed_over_with_fd_is_served() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    for supervise in [false, true] {
        let (d, sock, listener) = listening(if supervise { "fd-sup" } else { "fd" });
        let fd = listener.as_raw_fd();
        let mut cmd = daemon_cmd(supervise);
        cmd.args([
            "--memory-size",
            "4M",
            "--fd",
            &fd.to_string(),
            "--memory-path",
        ])
        .arg(d.join("mem"))
        .stderr(Stdio::piped());
        // SAFETY: fcntl between fork and exec, on a descriptor the child inherits.
        unsafe {
            cmd.pre_exec(move || {
                libc::fcntl(fd, libc::F_SETFD, 0);
                Ok(())
            });
        }
        let daemon = cmd.spawn().unwrap();
        drop(listener);
        for _ in 0..2 {
            greet(vhost::vhost_user::Frontend::connect(&sock, 2).unwrap());
        }
        stop_cleanly(daemon);
        // The socket is the caller's: the daemon leaves it.
        assert!(sock.exists());
        let _ = std::fs::remove_dir_all(d);
    }
    let d = temp_dir("fd-bad");
    let e = fails_with_one_line(&[
        "--fd",
        "0",
        "--memory-size",
        "4M",
        "--memory-path",
        d.join("mem").to_str().unwrap(),
    ]);
    assert!(e.contains("is not a listening unix stream socket"), "{e}");
    let _ = std::fs::remove_dir_all(d);
}
