// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The daemon's files and socket on a host shared with other users: nobody else may read
//! device memory or state, hold the daemon's lock, or make it follow a symbolic link; a
//! mistyped socket path destroys nothing; the socket is never open to others, and
//! `--socket-group` opens it to exactly one group. The attacker's side runs as `nobody`.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

const SIZE: &str = "4M";

/// A test directory, removed when dropped.
struct Dir(PathBuf);

impl std::ops::Deref for Dir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(name: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("cxl-accel-host-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

/// A test directory for a test that acts as another user: None unless we are root.
fn root_dir(name: &str) -> Option<Dir> {
    is_root().then(|| dir(name))
}

fn args(sock: &Path, mem: &Path) -> Vec<String> {
    vec![
        "--socket-path".into(),
        sock.display().to_string(),
        "--memory-path".into(),
        mem.display().to_string(),
        "--memory-size".into(),
        SIZE.into(),
    ]
}

/// Runs the daemon for at most `limit`: a daemon that should have refused to start but
/// serves instead is killed, and its output shows it.
fn run_for(args: &[String], limit: Duration) -> Output {
    let mut child = daemon()
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// The one-line error of a daemon that must refuse to start.
fn refused(args: &[String]) -> String {
    let out = run_for(args, Duration::from_secs(5));
    assert!(
        out.status.code().is_some(),
        "the daemon started instead of refusing: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    one_line_error(out)
}

/// A daemon that is stopped (SIGTERM) when dropped, also when a test fails.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// Starts the daemon and waits until it accepts connections.
fn serving(args: &[String], sock: &Path) -> Running {
    let mut child = daemon().args(args).stderr(Stdio::piped()).spawn().unwrap();
    let t = Instant::now();
    while std::os::unix::net::UnixStream::connect(sock).is_err() {
        if let Some(s) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            panic!(
                "daemon exited ({s}): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "daemon did not listen"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Running(child)
}

/// Tries to open `path` read-only as `uid`/`gid`: whether it worked.
fn opens(uid: u32, gid: u32, path: &Path) -> bool {
    let c = cpath(path);
    as_user(uid, gid, || {
        // SAFETY: open(2) with a C string prepared before the fork.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_NONBLOCK) };
        (fd >= 0) as i32
    }) == 1
}

/// Tries to connect to the unix socket `path` as `uid`/`gid`: whether it worked.
fn connects(uid: u32, gid: u32, path: &Path) -> bool {
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr
        .sun_path
        .iter_mut()
        .zip(path.as_os_str().as_encoded_bytes())
    {
        *d = *s as libc::c_char;
    }
    as_user(uid, gid, || {
        // SAFETY: socket(2) and connect(2) with an address prepared before the fork.
        unsafe {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            (libc::connect(fd, &addr as *const _ as *const libc::sockaddr, len) == 0) as i32
        }
    }) == 1
}

#[test]
fn a_file_at_the_socket_path_is_never_deleted() {
    let d = dir("notsock");
    let sock = d.join("s.sock");
    std::fs::write(&sock, "a user's file").unwrap();
    let e = refused(&args(&sock, &d.join("mem")));
    assert!(e.contains("is not a socket"), "{e}");
    assert_eq!(std::fs::read_to_string(&sock).unwrap(), "a user's file");
    // Nor a link to one.
    let link = d.join("link.sock");
    std::os::unix::fs::symlink(&sock, &link).unwrap();
    let e = refused(&args(&link, &d.join("mem")));
    assert!(e.contains("is not a socket"), "{e}");
    assert!(std::fs::symlink_metadata(&link).is_ok());
}

#[test]
fn device_memory_and_state_are_private_to_the_daemon_user() {
    let d = dir("private");
    let (sock, mem) = (d.join("s.sock"), d.join("mem"));
    let state = d.join("mem.state");
    let child = serving(&args(&sock, &mem), &sock);
    for p in [&mem, &state, &sock] {
        let m = std::fs::metadata(p).unwrap();
        assert_eq!(m.mode() & 0o777, 0o600, "{}", p.display());
    }
    if is_root() {
        // Another user can neither read them nor, without an open file, hold their lock.
        assert!(
            !opens(NOBODY, NOBODY, &mem),
            "another user opened device memory"
        );
        assert!(
            !opens(NOBODY, NOBODY, &state),
            "another user opened the state file"
        );
        assert!(!connects(NOBODY, NOBODY, &sock));
    }
    drop(child);
}

#[test]
fn another_users_file_or_link_at_a_device_path_is_refused() {
    let Some(d) = root_dir("attacker") else {
        return;
    };
    std::os::unix::fs::chown(&*d, Some(NOBODY), Some(NOBODY)).unwrap();
    let victim = d.join("victim");
    std::fs::write(&victim, "the daemon user's data").unwrap();
    // The attacker's memory file: readable by them, full of what the guest will write.
    let theirs = d.join("theirs");
    let c = cpath(&theirs);
    let made = as_user(NOBODY, NOBODY, || {
        // SAFETY: open(2), ftruncate(2) and fchmod(2) on data prepared before the fork.
        unsafe {
            let fd = libc::open(c.as_ptr(), libc::O_CREAT | libc::O_RDWR, 0o666);
            (fd >= 0 && libc::ftruncate(fd, 4 << 20) == 0 && libc::fchmod(fd, 0o666) == 0) as i32
        }
    });
    assert_eq!(made, 1);
    let e = refused(&args(&d.join("a.sock"), &theirs));
    assert!(e.contains("belongs to uid 65534"), "{e}");
    // Links to the victim where the memory file and where the state file would be.
    for (mem, link) in [
        (d.join("m1"), d.join("m1")),
        (d.join("m2"), d.join("m2.state")),
    ] {
        let (target, at) = (cpath(&victim), cpath(&link));
        let linked = as_user(NOBODY, NOBODY, || {
            // SAFETY: symlink(2) with C strings prepared before the fork.
            (unsafe { libc::symlink(target.as_ptr(), at.as_ptr()) } == 0) as i32
        });
        assert_eq!(linked, 1);
        let e = refused(&args(&d.join("b.sock"), &mem));
        assert!(e.contains("symbolic link"), "{e}");
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "the daemon user's data",
            "the daemon wrote through a link"
        );
    }
}

#[test]
fn two_daemons_with_their_own_state_files_cannot_share_device_memory() {
    let d = dir("share");
    let mem = d.join("mem");
    let mut one = args(&d.join("1.sock"), &mem);
    one.extend([
        "--state-path".into(),
        d.join("1.state").display().to_string(),
    ]);
    let first = serving(&one, &d.join("1.sock"));
    let mut two = args(&d.join("2.sock"), &mem);
    two.extend([
        "--state-path".into(),
        d.join("2.state").display().to_string(),
    ]);
    let e = refused(&two);
    assert!(e.contains("locked by another running cxl-accel"), "{e}");
    drop(first);
}

/// A small tmpfs, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let c = cpath(&self.0);
        // SAFETY: umount2 with a valid C string.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

#[test]
fn a_full_tmpfs_is_an_error_at_start_not_a_sigbus_later() {
    let Some(d) = root_dir("tmpfs") else {
        return;
    };
    let mnt = d.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let (src, target) = (cpath(Path::new("tmpfs")), cpath(&mnt));
    let opts = std::ffi::CString::new("size=5M").unwrap();
    // SAFETY: mount(2) with valid C strings.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            src.as_ptr(),
            0,
            opts.as_ptr().cast(),
        )
    };
    if rc != 0 {
        eprintln!(
            "skipped: cannot mount a tmpfs ({})",
            std::io::Error::last_os_error()
        );
        return;
    }
    let _mounted = Tmpfs(mnt.clone());
    // 4 MiB of device memory and about 2.5 MiB of state do not fit in 5 MiB.
    let e = refused(&args(&d.join("s.sock"), &mnt.join("mem")));
    assert!(e.contains("No space left on device"), "{e}");
}

#[test]
fn the_socket_never_appears_with_a_wider_mode() {
    // With umask 0 a socket is created 0777; the daemon must not show it under its path
    // before its mode is right. Refusing chmod stops the daemon exactly there.
    use seccompiler::{SeccompAction, SeccompFilter, TargetArch};
    let d = dir("window");
    let (sock, mem) = (d.join("s.sock"), d.join("mem"));
    let rules = [
        libc::SYS_chmod,
        libc::SYS_fchmod,
        libc::SYS_fchmodat,
        452, // fchmodat2
    ]
    .into_iter()
    .map(|nr| (nr, Vec::new()))
    .collect();
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        TargetArch::try_from(std::env::consts::ARCH).unwrap(),
    )
    .unwrap();
    let prog: seccompiler::BpfProgram = filter.try_into().unwrap();
    let mut cmd = daemon();
    cmd.args(args(&sock, &mem)).stderr(Stdio::piped());
    // SAFETY: between fork and exec the closure only calls umask, prctl and seccomp
    // (through apply_filter), on a program built before the fork.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(move || {
            libc::umask(0);
            seccompiler::apply_filter(&prog).map_err(std::io::Error::other)
        });
    }
    let mut child = cmd.spawn().unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() && t.elapsed() < Duration::from_secs(5) {
        if let Ok(m) = std::fs::symlink_metadata(&sock) {
            assert_eq!(m.mode() & 0o777, 0o600, "socket visible with a wider mode");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    if let Ok(m) = std::fs::symlink_metadata(&sock) {
        assert_eq!(
            m.mode() & 0o777,
            0o600,
            "socket left with a wider mode: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn a_socket_group_may_connect_and_nobody_else() {
    let Some(d) = root_dir("group") else {
        return;
    };
    let (sock, mem) = (d.join("s.sock"), d.join("mem"));
    let mut a = args(&sock, &mem);
    a.extend(["--socket-group".into(), NOBODY.to_string()]);
    let child = serving(&a, &sock);
    for p in [&sock, &mem] {
        let m = std::fs::metadata(p).unwrap();
        assert_eq!(
            (m.mode() & 0o777, m.gid()),
            (0o660, NOBODY),
            "{}",
            p.display()
        );
    }
    let m = std::fs::metadata(d.join("mem.state")).unwrap();
    assert_eq!(m.mode() & 0o777, 0o600);
    // A QEMU running as another user in the group connects and opens device memory.
    let qemu = 12345;
    assert!(connects(qemu, NOBODY, &sock), "the group cannot connect");
    assert!(
        opens(qemu, NOBODY, &mem),
        "the group cannot open device memory"
    );
    assert!(!connects(qemu, qemu, &sock), "another group connected");
    assert!(!opens(qemu, qemu, &mem));
    drop(child);
}
