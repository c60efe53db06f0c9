#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
#
# The libvirt examples for real: Debian's libvirt daemon defines and starts the
# domains of libvirt/cxl-accel-one.xml and libvirt/cxl-accel-two.xml (their
# placeholders filled in) with the project's guest kernel, driver and demo, and
# the guest runs the demo on every device; the console is judged as
# ci/run-guest.sh judges it. Everything is cleaned up afterwards: the domains
# destroyed and undefined, the daemons and (when this script started them)
# libvirtd and virtlogd stopped.
#
# Usage: ci/libvirt-demo.sh [options]
#   --example one|two   only this example (default: both, one after the other)
#   --timeout SECS      per guest (default 300)
#   --results DIR       KTAP, JUnit and (after a failure) logs per example in
#                       DIR/one and DIR/two (as ci/run-guest.sh --results)
#   --keep              keep the work directory
#   --quiet             do not print the demo's output
#
# Installs libvirt-daemon-system and libvirt-clients when missing (from the
# host's own apt sources). When no libvirtd runs, it starts one (and virtlogd)
# in a mount namespace of its own, in which the cached trixie root that holds
# QEMU is also mounted where libvirt's QEMU user (libvirt-qemu) can reach it:
# $CACHE is usually under /root. The daemons run as root with --socket-group
# set to that user's group (kvm on Debian); see README.md for a real set-up.
#
# Needs the set-up of ci/setup.sh and a release build of the daemon.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=ci/lib.sh
. "$HERE/lib.sh"
# shellcheck source=ci/verdict.sh
. "$HERE/verdict.sh"
cd "$ROOT"

usage() {
    script_help "$0" 3
    exit "${1:-0}"
}

EXAMPLES=(one two)
TIMEOUT=300
RESULTS_BASE=
KEEP=0
QUIET=0
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help) usage 0 ;;
    --example)
        case "${2:-}" in one | two) EXAMPLES=("$2") ;; *) die "libvirt-demo: --example one|two" ;; esac
        shift 2
        ;;
    --timeout) TIMEOUT=${2:?--timeout needs seconds}; shift 2 ;;
    --results) RESULTS_BASE=${2:?--results needs a directory}; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --quiet) QUIET=1; shift ;;
    *) echo "libvirt-demo: unknown argument $1" >&2; usage 2 ;;
    esac
done
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "libvirt-demo: --timeout wants seconds"

DAEMON=${CXL_ACCEL_DAEMON:-$ROOT/target/release/cxl-accel}
[ -x "$DAEMON" ] || die "libvirt-demo: $DAEMON not found; build it (cargo build --release)"
install_missing "libvirt-demo" libvirt-daemon-system libvirt-clients
load_env
[ -x "$QEMU" ] || die "libvirt-demo: QEMU=$QEMU not executable; rerun ci/setup.sh"
log "building the driver and the demo program"
build_driver "$ROOT"
make -s -C tests/guest/progs >/dev/null

VIRSH=(virsh -q -c qemu:///system)
BASE=$(mktemp -d "${TMPDIR:-/tmp}/cxl-accel-libvirt.XXXXXX")
chmod 755 "$BASE"
TAG=${BASE##*.}
LIBVIRTD_PID=
BIND_ROOT=
EMULATOR=$QEMU
DOMAINS=()
DAEMON_PIDS=()
SHM_FILES=()

stop_pid() { # politely, then not
    local pid=$1 i
    kill "$pid" 2>/dev/null || return 0
    for ((i = 0; i < 25; i++)); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.2
    done
    kill -9 "$pid" 2>/dev/null || true
}

cleanup() {
    local rc=$? d p
    trap - EXIT INT TERM
    for d in "${DOMAINS[@]}"; do
        "${VIRSH[@]}" destroy "$d" >/dev/null 2>&1 || true
        "${VIRSH[@]}" undefine "$d" >/dev/null 2>&1 || true
        rm -f "/var/log/libvirt/qemu/$d.log"
    done
    for p in "${DAEMON_PIDS[@]}"; do stop_pid "$p"; done
    if [ -n "$LIBVIRTD_PID" ]; then
        stop_pid "$LIBVIRTD_PID"
        p=$(cat "$BASE/virtlogd.pid" 2>/dev/null || true)
        [ -z "$p" ] || stop_pid "$p"
    fi
    for p in "${SHM_FILES[@]}"; do rm -f "$p" "$p.state"; done
    # libvirt's probe of our temporary emulator (named after its path)
    [ -z "$BIND_ROOT" ] || rm -f "/var/cache/libvirt/qemu/capabilities/$(printf %s "$EMULATOR" | sha256sum | cut -d' ' -f1).xml"
    if [ "$KEEP" = 1 ]; then
        echo "libvirt-demo: kept $BASE" >&2
    else
        rm -rf "$BASE"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ------------------------------------------------------------- libvirtd

# The user libvirt runs QEMU as (qemu.conf "user", Debian's default
# libvirt-qemu) and its group, which gets the daemons' sockets and memory.
QEMU_USER=$(sed -n 's/^[[:space:]]*user[[:space:]]*=[[:space:]]*"\(.*\)"/\1/p' /etc/libvirt/qemu.conf 2>/dev/null | tail -n 1)
QEMU_USER=${QEMU_USER:-libvirt-qemu}
QEMU_GROUP=$(id -gn "$QEMU_USER") || die "libvirt-demo: libvirt's QEMU user $QEMU_USER does not exist"

# The emulator as libvirt's QEMU user can run it: QEMU itself when that user
# can, else the cached trixie root mounted at $BASE/trixie in libvirtd's mount
# namespace, run through a wrapper there.
FIRMWARE=$QEMU_FIRMWARE_ARGS
if ! runuser -u "$QEMU_USER" -- "$QEMU" --version >/dev/null 2>&1; then
    [ "$QEMU" = "$CACHE/trixie/qemu-system-x86_64" ] ||
        die "libvirt-demo: $QEMU_USER cannot run QEMU=$QEMU; use a QEMU it can run"
    BIND_ROOT=$(cd "$CACHE/trixie/root" && pwd -P)
    mkdir -p "$BASE/trixie"
    write_qemu_wrapper "$BASE/qemu-system-x86_64" "$BASE/trixie"
    EMULATOR=$BASE/qemu-system-x86_64
    FIRMWARE=${FIRMWARE//$BIND_ROOT/$BASE/trixie}
    FIRMWARE=${FIRMWARE//$CACHE\/trixie\/root/$BASE/trixie}
fi

if "${VIRSH[@]}" list --all >/dev/null 2>&1; then
    [ -z "$BIND_ROOT" ] ||
        die "libvirt-demo: a libvirtd already runs, and $QEMU_USER cannot run QEMU=$QEMU (under $CACHE); stop that libvirtd or set QEMU= to a QEMU it can run"
    log "using the running libvirtd"
else
    log "starting libvirtd and virtlogd"
    # A /dev/kvm that QEMU's user cannot open (0600 without udev's rule) makes
    # libvirt 9 find its probe of QEMU outdated at every look-up (KVM "no
    # longer available") and probe again, a minute per domain start. Then
    # libvirtd gets a /dev of its own without kvm (a bind mount over the node
    # breaks libvirt's own /dev for QEMU), and the guests run under TCG, as
    # the domains ask.
    HIDE_KVM=0
    if [ -e /dev/kvm ] && ! runuser -u "$QEMU_USER" -- test -r /dev/kvm -a -w /dev/kvm; then
        HIDE_KVM=1
    fi
    # shellcheck disable=SC2016 # expanded by the inner sh
    unshare --mount --propagation private -- sh -c '
        set -e
        [ -z "$1" ] || mount --bind "$1" "$2/trixie"
        if [ "$3" = 1 ]; then
            # The host /dev detached (its mounts would still be listed under a
            # new one, and libvirt moves every /dev mount it finds into QEMU
            # /dev), a tmpfs with the usual nodes, the host pts and shm.
            mkdir -p "$2/pts" "$2/shm"
            mount --rbind /dev/pts "$2/pts"
            mount --rbind /dev/shm "$2/shm"
            umount -l /dev
            mount -t tmpfs -o mode=0755,nosuid devtmp /dev
            printf "%s\n" "null 1 3" "zero 1 5" "full 1 7" "random 1 8" "urandom 1 9" "tty 5 0" |
                while read -r node major minor; do
                    mknod -m 666 "/dev/$node" c "$major" "$minor"
                done
            mkdir /dev/pts /dev/shm
            mount --move "$2/pts" /dev/pts
            mount --move "$2/shm" /dev/shm
            ln -s pts/ptmx /dev/ptmx
            ln -s /proc/self/fd /dev/fd
        fi
        virtlogd --daemon --pid-file "$2/virtlogd.pid"
        exec libvirtd --pid-file "$2/libvirtd.pid"' sh "$BIND_ROOT" "$BASE" "$HIDE_KVM" \
        >"$BASE/libvirtd.log" 2>&1 &
    LIBVIRTD_PID=$!
    for ((i = 0; i < 100; i++)); do
        "${VIRSH[@]}" list --all >/dev/null 2>&1 && break
        kill -0 "$LIBVIRTD_PID" 2>/dev/null ||
            { tail -n 20 "$BASE/libvirtd.log" >&2; die "libvirt-demo: libvirtd exited at start"; }
        sleep 0.1
    done
    "${VIRSH[@]}" list --all >/dev/null 2>&1 ||
        { tail -n 20 "$BASE/libvirtd.log" >&2; die "libvirt-demo: libvirtd does not answer after 10 s"; }
fi
# libvirt probes the emulator (a few seconds; its QEMU driver may still be
# starting).
for ((i = 0; i < 30; i++)); do
    "${VIRSH[@]}" domcapabilities --emulatorbin "$EMULATOR" --machine q35 --virttype qemu \
        >"$BASE/domcaps.xml" 2>&1 && grep -q '<machine>pc-q35' "$BASE/domcaps.xml" && break
    sleep 1
done
grep -q '<machine>pc-q35' "$BASE/domcaps.xml" ||
    { tail -n 5 "$BASE/domcaps.xml" >&2; die "libvirt-demo: libvirt cannot use $EMULATOR (virsh domcapabilities failed)"; }
log "libvirt $(libvirtd --version | awk '{print $NF}') uses $EMULATOR ($("$QEMU" --version | head -n 1 | awk '{print $4}')); QEMU runs as $QEMU_USER:$QEMU_GROUP"

# -------------------------------------------------------------- examples

xml_escape() { sed -e 's/&/\&amp;/g' -e "s/'/\&apos;/g" -e 's/</\&lt;/g'; }

# One example: its daemons, its domain, the guest's verdict.
run_example() { # one|two
    local ex=$1 n name work i sock mem sed_args=() peers fw_args='' a t0 last state
    case "$ex" in one) n=1 ;; two) n=2 ;; esac
    name=cxl-accel-ci-$TAG-$ex
    work=$BASE/$ex
    mkdir -p "$work"
    chmod 755 "$work"

    "$HERE/mkinitramfs.sh" "$work/initramfs.cpio.gz" \
        --insmod guest-driver/cxl_accel.ko:/lib/modules/extra/ \
        --add tests/guest/progs/out/cxl-accel-demo:/bin/ \
        --add tests/guest/scripts/demo-all-guest.sh:/cxl/run 2>/dev/null
    cp "$GUEST_KERNEL" "$work/vmlinuz"
    chmod 644 "$work/vmlinuz" "$work/initramfs.cpio.gz"

    local pids=()
    for ((i = 0; i < n; i++)); do
        sock=$work/cxl$i.sock
        mem=/dev/shm/$name-mem$i
        SHM_FILES+=("$mem")
        peers=()
        [ "$n" = 1 ] || peers=(--peer-memory-path "/dev/shm/$name-mem$((1 - i))")
        "$DAEMON" --socket-path "$sock" --memory-path "$mem" --memory-size 256M --index "$i" --attach bar \
            --socket-group "$QEMU_GROUP" "${peers[@]}" >"$work/daemon$i.log" 2>&1 &
        pids+=($!)
        DAEMON_PIDS+=($!)
        for ((t = 0; t < 100; t++)); do
            [ -S "$sock" ] && break
            kill -0 "${pids[$i]}" 2>/dev/null ||
                { tail -n 20 "$work/daemon$i.log" >&2; die "libvirt-demo: daemon $i exited at start"; }
            sleep 0.1
        done
        [ -S "$sock" ] || die "libvirt-demo: daemon $i did not create $sock within 10 s"
        sed_args+=(-e "s|@SOCKET$i@|$(printf '%s' "$sock" | xml_escape)|g" -e "s|@SHMEM$i@|$name-mem$i|g")
    done

    # QEMU's firmware when it is not where QEMU looks by itself (the trixie root).
    for a in $FIRMWARE; do
        fw_args+="    <qemu:arg value='$(printf '%s' "$a" | xml_escape)'/>\n"
    done
    sed -e "s|@NAME@|$name|g" -e "s|@EMULATOR@|$(printf '%s' "$EMULATOR" | xml_escape)|g" \
        -e "s|@KERNEL@|$work/vmlinuz|g" -e "s|@INITRD@|$work/initramfs.cpio.gz|g" \
        -e "s|@CMDLINE@|console=ttyS0 quiet panic=-1 cxlaccel.run=/cxl/run cxlaccel.devices=$n|g" \
        -e "s|@CONSOLE_LOG@|$work/console.log|g" "${sed_args[@]}" \
        -e "s|^  </qemu:commandline>|$fw_args  </qemu:commandline>|" \
        "libvirt/cxl-accel-$ex.xml" >"$work/domain.xml"
    local left
    left=$(sed '/<!--/,/-->/d' "$work/domain.xml" | grep -o '@[A-Z0-9_]*@' | sort -u | tr '\n' ' ' || true)
    [ -z "$left" ] || die "libvirt-demo: placeholders left in $work/domain.xml: $left"

    log "== libvirt: $n device(s): virsh define, start ($name)"
    "${VIRSH[@]}" define "$work/domain.xml" >/dev/null
    DOMAINS+=("$name")
    CONSOLE=$work/console.log
    t0=$(now)
    "${VIRSH[@]}" start "$name" >/dev/null ||
        { tail -n 20 "/var/log/libvirt/qemu/$name.log" >&2; die "libvirt-demo: virsh start $name failed"; }
    local qpid
    qpid=$(cat "/run/libvirt/qemu/$name.pid" 2>/dev/null || true)
    [ -z "$qpid" ] || log "QEMU (pid $qpid) runs as $(ps -o user= -p "$qpid" 2>/dev/null || echo '?')"

    TIMED_OUT=0
    DEAD_DAEMONS=()
    last=$(now)
    while :; do
        state=$("${VIRSH[@]}" domstate "$name" 2>/dev/null || echo gone)
        [ "$state" = running ] || break
        if awk -v e="$(elapsed "$t0")" -v t="$TIMEOUT" 'BEGIN { exit !(t > 0 && e > t) }'; then
            TIMED_OUT=1
            break
        fi
        for ((i = 0; i < n; i++)); do
            if [ -z "${DEAD_DAEMONS[$i]:-}" ] && ! kill -0 "${pids[$i]}" 2>/dev/null; then
                DEAD_DAEMONS[i]=1
                echo "libvirt-demo: daemon $i exited while the guest was running" >&2
            fi
        done
        if awk -v e="$(elapsed "$last")" 'BEGIN { exit !(e >= 10) }'; then
            log "libvirt: $name $state, $(elapsed "$t0")s so far: $(tail -n 1 "$CONSOLE" 2>/dev/null | tr -d '\r' | cut -c1-60)"
            last=$(now)
        fi
        sleep 0.5
    done
    WALL=$(elapsed "$t0")
    QEMU_RC="libvirt: $("${VIRSH[@]}" domstate --reason "$name" 2>/dev/null || echo gone)"
    "${VIRSH[@]}" destroy "$name" >/dev/null 2>&1 || true
    cp "/var/log/libvirt/qemu/$name.log" "$work/qemu.log" 2>/dev/null || true
    WORK=$work
    RESULTS=${RESULTS_BASE:+$RESULTS_BASE/$ex}
    [ "$QUIET" = 1 ] || grep -E '^DEMO\| ' "$CONSOLE" | tr -d '\r' | sed 's/^DEMO| /  /'
    guest_verdict libvirt-demo "$n device(s) under libvirt," >"$work/verdict.txt" || true
    cat "$work/verdict.txt"
    TOTALS+=("$(tail -n 1 "$work/verdict.txt")")
}

TOTALS=()
for ex in "${EXAMPLES[@]}"; do run_example "$ex"; done

P=0 F=0 S=0
for t in "${TOTALS[@]}"; do
    read -r p _ f _ s _ <<<"${t//,/}"
    P=$((P + p)) F=$((F + f)) S=$((S + s))
done
[ -z "$RESULTS_BASE" ] || echo "$P passed, $F failed, $S skipped" >"$RESULTS_BASE/summary"
echo "$P passed, $F failed, $S skipped"
[ "$F" = 0 ]
