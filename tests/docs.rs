// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! The man page (`docs/man/cxl-accel.1`) and the shell completions (`docs/completions/`) are
//! generated from the daemon's clap definitions (`cxl_accel::cli::Args`); this test fails
//! when they are stale. Regenerate them with
//!
//! ```sh
//! CXL_ACCEL_REGEN_DOCS=1 cargo test --test docs
//! ```

mod common;

use std::path::Path;

use clap::CommandFactory;
use clap_complete::Shell;
use cxl_accel::cli::Args;

use common::repo;

const REGEN: &str = "CXL_ACCEL_REGEN_DOCS";

/// Sections clap does not know, in roff, after the generated ones.
const MAN_EXTRA: &str = r#".SH EXAMPLES
Start a device with 256 MiB of memory, then ask it for the QEMU arguments that attach it:
.PP
.nf
.RS
mkdir \-p \-m 0700 /run/cxl\-accel
cxl\-accel \-\-socket\-path /run/cxl\-accel/cxl0.sock \e
    \-\-memory\-path /dev/shm/cxl\-accel0 \-\-memory\-size 256M &
cxl\-accel \-\-socket\-path /run/cxl\-accel/cxl0.sock \e
    \-\-memory\-path /dev/shm/cxl\-accel0 \-\-memory\-size 256M \-\-print\-qemu\-args
.RE
.fi
.PP
A second device takes \fB\-\-index 1\fR, its own socket and memory file, and
\fB\-\-guest\-ram none\fR when printing its QEMU arguments (the first device's carry the
shared guest RAM).
.SH ENVIRONMENT
.TP
\fBRUST_LOG\fR
Log level: \fBinfo\fR (default), \fBdebug\fR, \fBwarn\fR or \fBerror\fR; the log goes to
standard error.
.SH EXIT STATUS
0 after \fB\-\-print\-qemu\-args\fR, \fB\-\-print\-capabilities\fR, \fB\-\-help\fR,
\fB\-\-version\fR or SIGTERM; 1 with a one\-line error otherwise; 2 for a command line clap
refuses.
.SH FILES
.TP
\fB/etc/cxl\-accel/\fIINSTANCE\fB.conf\fR
Flags of the systemd unit \fBcxl\-accel@\fIINSTANCE\fB.service\fR (one device per instance).
.TP
\fB/run/cxl\-accel/\fR
Where the unit puts the sockets and device memory files.
.SH SEE ALSO
\fBqemu\-system\-x86_64\fR(1), \fBsystemd.exec\fR(5), \fBvirsh\fR(1); README.md of the
cxl\-accel sources for the guest driver, the device specification and the tests.
"#;

fn man_page() -> Vec<u8> {
    let mut out = Vec::new();
    clap_mangen::Man::new(Args::command())
        .render(&mut out)
        .expect("render the man page");
    out.extend_from_slice(MAN_EXTRA.as_bytes());
    out
}

fn completion(shell: Shell) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Args::command(), "cxl-accel", &mut out);
    out
}

/// Every generated file: path in the repository, contents.
fn generated() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("docs/man/cxl-accel.1", man_page()),
        ("docs/completions/cxl-accel.bash", completion(Shell::Bash)),
        ("docs/completions/_cxl-accel", completion(Shell::Zsh)),
        ("docs/completions/cxl-accel.fish", completion(Shell::Fish)),
    ]
}

#[test]
fn man_page_and_completions_are_current() {
    let regen = std::env::var_os(REGEN).is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for (rel, want) in generated() {
        let path = repo().join(rel);
        if regen {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &want).unwrap_or_else(|e| panic!("{rel}: {e}"));
            eprintln!("wrote {rel}");
        } else if std::fs::read(&path).ok().as_deref() != Some(want.as_slice()) {
            stale.push(rel);
        }
    }
    assert!(
        stale.is_empty(),
        "stale (or missing) generated files: {}; regenerate them with \
         {REGEN}=1 cargo test --test docs",
        stale.join(", ")
    );
}

#[test]
fn generated_files_cover_every_flag() {
    let man = String::from_utf8(man_page()).unwrap();
    let bash = String::from_utf8(completion(Shell::Bash)).unwrap();
    for arg in Args::command().get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if arg.is_hide_set() {
            // Internal flags (--worker-fd, --resume) are not for users.
            assert!(!man.contains(&format!("\\-\\-{}", long.replace('-', "\\-"))));
            continue;
        }
        assert!(
            man.contains(&format!("\\-\\-{}", long.replace('-', "\\-"))),
            "man page lacks --{long}"
        );
        assert!(
            bash.contains(&format!("--{long}")),
            "bash completion lacks --{long}"
        );
    }
}

/// groff, where installed, reads the page without a warning.
#[test]
fn man_page_renders() {
    let page = repo().join("docs/man/cxl-accel.1");
    if !Path::new("/usr/bin/groff").exists() || !page.exists() {
        eprintln!("groff or the page missing: not rendered");
        return;
    }
    let out = std::process::Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-z"])
        .arg(&page)
        .output()
        .expect("run groff");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.trim().is_empty(),
        "groff: {err}"
    );
}
