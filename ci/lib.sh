# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Shared helpers for the ci/ scripts (sourced, not executed).
# shellcheck shell=bash

# shellcheck disable=SC2034 # used by the scripts that source this
CACHE="${CXL_ACCEL_CACHE:-$HOME/.cache/cxl-accel}"
# The guest set-up (QEMU, guest kernel, its headers and modules) that
# ci/setup.sh wrote; CXL_ACCEL_ENV picks another one, e.g. the debug
# kernel's of ci/debug-kernel.sh.
ENV_FILE="${CXL_ACCEL_ENV:-$CACHE/env.sh}"

# A script's --help: its comment block from line FIRST up to "set -euo".
script_help() { # script first-line
    sed -n "$2,/^set -euo/p" "$1" | sed '$d; s/^# \{0,1\}//'
}

die() {
    echo "$*" >&2
    exit 1
}

log() {
    echo "[$(date +%H:%M:%S)] $*" >&2
}

# Source the guest set-up (exports QEMU, GUEST_KERNEL, KDIR, ...); with
# CXL_ACCEL_QEMU_ENV, that file's QEMU instead (e.g. "$CACHE/qemu-10.2.env").
load_env() {
    [ -f "$ENV_FILE" ] || die "$ENV_FILE is missing: run ci/setup.sh first"
    # shellcheck source=/dev/null
    . "$ENV_FILE"
    if [ -n "${CXL_ACCEL_QEMU_ENV:-}" ]; then
        [ -f "$CXL_ACCEL_QEMU_ENV" ] || die "$CXL_ACCEL_QEMU_ENV is missing: run ci/setup.sh --qemu-floor first"
        # shellcheck source=/dev/null
        . "$CXL_ACCEL_QEMU_ENV"
    fi
}

# Run a long command with its output in a log, saying every 10 s that it
# still works (with the log's last line). Returns the command's status.
with_progress() { # what logfile command...
    local what=$1 logf=$2 t0 pid
    shift 2
    t0=$(now)
    "$@" >"$logf" 2>&1 &
    pid=$!
    wait_progress "$what" "$logf" "$pid" "$t0"
}

# Wait for background process PID, saying every 10 s that it still works.
wait_progress() { # what logfile pid t0
    local what=$1 logf=$2 pid=$3 t0=$4 i last
    while :; do
        for ((i = 0; i < 100; i++)); do
            kill -0 "$pid" 2>/dev/null || break 2
            sleep 0.1
        done
        last=$(tail -n 1 "$logf" 2>/dev/null | tr -d '\r' | cut -c1-70)
        log "$what: ${last:+$last, }$(elapsed "$t0")s so far"
    done
    wait "$pid"
}

# ci/setup.sh with ARGS, its output (but progress) hidden, without the
# variables of a loaded set-up: it would take them as overrides.
run_setup() {
    env -u QEMU -u QEMU_FIRMWARE_ARGS -u GUEST_KERNEL -u GUEST_KVER -u KDIR \
        -u GUEST_MODULES -u KMAKE "$(dirname "${BASH_SOURCE[0]}")/setup.sh" "$@" >/dev/null
}

# Build the guest driver for the loaded guest kernel (KMAKE: make, or make in
# the trixie root for Debian's 7.3 kernel).
build_driver() { # repo
    # shellcheck disable=SC2086 # KMAKE is a command with its arguments
    ${KMAKE:-make} -s -C "$1/guest-driver" KDIR="$KDIR" -j2 >/dev/null
}

# The Rust toolchain the crate needs: cargo on PATH, at least Cargo.toml's
# rust-version (one line saying what to do otherwise).
need_cargo() { # script-name repo
    local want have
    want=$(sed -n 's/^rust-version = "\([0-9.]*\)"/\1/p' "$2/Cargo.toml")
    command -v cargo >/dev/null ||
        die "$1: cargo not found; install a Rust toolchain (rustup, cargo >= $want) first"
    have=$(cargo --version | awk '{print $2}')
    [ "$(printf '%s\n%s\n' "$want" "${have%%-*}" | sort -V | head -n 1)" = "$want" ] ||
        die "$1: cargo $have is older than the $want this crate needs (Cargo.toml rust-version); rustup update, or install cargo >= $want"
}

now() {
    date +%s.%N
}

# Elapsed seconds since $1 (from `now`), one decimal.
elapsed() {
    awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'
}

# apt-get install, from the host's own apt sources and with progress lines,
# those of the packages that are not installed yet. WHO starts the messages.
install_missing() { # who package...
    local who=$1 missing=() p
    shift
    for p in "$@"; do
        pkg_installed "$p" || missing+=("$p")
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        log "all host packages present"
        return 0
    fi
    [ "$(id -u)" = 0 ] || die "$who: need root to install ${missing[*]}; rerun as root or install them yourself"
    mkdir -p "$CACHE"
    log "apt-get update"
    with_progress "apt-get update" "$CACHE/apt-update.log" apt-get update -q ||
        { tail -n 20 "$CACHE/apt-update.log" >&2; die "$who: apt-get update failed (see $CACHE/apt-update.log); fix the apt sources or network"; }
    log "installing: ${missing[*]}"
    with_progress "apt-get install" "$CACHE/apt-install.log" \
        env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" ||
        { tail -n 20 "$CACHE/apt-install.log" >&2; die "$who: cannot install host packages (${missing[*]}); see $CACHE/apt-install.log"; }
}

# A qemu-system-x86_64 wrapper at OUT running the QEMU of the Debian root
# ROOT with that root's dynamic loader and libraries (no chroot: every host
# path stays visible).
write_qemu_wrapper() { # out root
    local out=$1 root=$2
    cat >"$out.tmp" <<EOF
#!/bin/sh
# Written by ci/setup.sh: Debian trixie's QEMU with the trixie root's libraries.
exec env QEMU_MODULE_DIR="$root/usr/lib/x86_64-linux-gnu/qemu" \\
    "$root/lib64/ld-linux-x86-64.so.2" \\
    --library-path "$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu" \\
    "$root/usr/bin/qemu-system-x86_64" "\$@"
EOF
    chmod 755 "$out.tmp"
    mv "$out.tmp" "$out"
}

# /etc/apt (CXL_ACCEL_ETC_APT: another directory, for tests) as one line per
# entry: path, mode, owner, and content hash, link target or type. Equal
# listings before and after mean the set-up left the host's apt alone.
etc_apt_state() {
    local d=${CXL_ACCEL_ETC_APT:-/etc/apt}
    [ -d "$d" ] || { echo "(no $d)"; return 0; }
    (cd "$d" && find . -print0 | LC_ALL=C sort -z | while IFS= read -r -d '' p; do
        local what
        if [ -L "$p" ]; then
            what="-> $(readlink "$p")"
        elif [ -f "$p" ]; then
            what=$(sha256sum <"$p" | cut -d' ' -f1)
        else
            what=$(stat -c %F "$p")
        fi
        printf '%s %s %s\n' "$p" "$(stat -c '%a %U:%G' "$p")" "$what"
    done)
}

# "install ok installed" is the only state that means a usable package
# ("unknown ok not-installed" is what dpkg reports for removed ones).
# Prints "major.minor.patch" of a qemu binary, or nothing.
qemu_version() {
    "$1" --version 2>/dev/null | head -n 1 | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -n 1 || true
}

version_ge() { # $1 >= $2 ?
    [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" = "$2" ]
}

# How device memory reaches the guest with this QEMU: as a VIRTIO shared memory
# region of the virtio function (QEMU >= 11.1) or as the BAR of an ivshmem-plain
# sibling (10.2).
default_attach() { # qemu
    if version_ge "$(qemu_version "$1")" 11.1; then echo shmem; else echo bar; fi
}

pkg_installed() {
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" = "install ok installed" ]
}
