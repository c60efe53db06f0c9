#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Boot a cxl-accel guest: N vhost-user daemons + QEMU + the Debian guest kernel
# with a busybox initramfs, run a script in the guest and judge its output.
#
# Usage: ci/run-guest.sh [options]
#   --devices N          cxl-accel devices (one daemon each; default 1, 0 = none)
#   --devmem-size SIZE   device memory per device (default 256M)
#   --guest-ram SIZE     guest RAM (default 1G)
#   --ram-node SIZE      a second, CPU-less NUMA node of plain RAM (node 1): a
#                        move_pages() target next to the device (shmem, bar)
#   --socket-mode M      server (daemon listens, default) or client (QEMU listens and
#                        the daemons connect: a restarted daemon reconnects)
#   --attach MODE        how device memory reaches the guest: shmem (a BAR of the virtio
#                        function itself; QEMU >= 11.1), bar (BAR2 of an ivshmem-plain
#                        sibling; QEMU 10.2), numa (a CPU-less NUMA node), cxl (a PCIe
#                        function of the daemon's own over vfio-user, a CXL Type-2
#                        endpoint under a CXL host bridge; QEMU >= 10.2, the CXL
#                        regions need Linux 7.3) or auto (default: shmem when the
#                        QEMU has it, else bar)
#   --cxl-host-bridges one|each
#                        with --attach cxl: every device under one CXL host bridge
#                        (default), or each under one of its own
#   --cxl-mem-bar        with --attach cxl and a QEMU built with qemu/patches
#                        (ci/setup.sh --qemu-cxl): the CXL regions reach device
#                        memory (the daemons get --qemu-cxl-mem-bar, the guest
#                        cxlaccel.region=backed)
#   --accel tcg|kvm      default tcg (kvm only on hosts with a real /dev/kvm); the
#                        CPU model is max under TCG (CXL_ACCEL_TCG_CPU overrides it,
#                        e.g. max,erms=off), host under KVM
#   --smp N              guest CPUs (default 2)
#   --timeout SECS       wall-clock limit, QEMU is killed after it (default 300; 0 = none)
#   --script FILE        host script (or static binary) run in the guest as /cxl/run
#   --interactive        shell on the guest console (Ctrl-A X quits QEMU); no script
#   --add SRC:DEST       extra file for the guest (repeatable; see ci/mkinitramfs.sh)
#   --insmod SRC:DEST    extra .ko for the guest, loaded by /init (repeatable)
#   --module NAME        guest kernel module to load (repeatable)
#   --add-root ROOT:PATH a program of another root (with its libraries) for the
#                        guest (repeatable; see ci/mkinitramfs.sh); with --attach
#                        cxl the CXL tool of the set-up's trixie root (cxl list) is
#                        added by itself when it is there
#   --append ARGS        extra guest kernel command line
#   --qemu-arg ARG       extra QEMU argument (repeatable)
#   --monitor PATH       QMP monitor on the unix socket PATH (QEMU listens; HMP
#                        commands go through QMP's human-monitor-command)
#   --hotplug            put each device's slot behind a pcie-root-port of its own
#                        (id cxlaccN-port), so that "device_del cxlaccN" unplugs it:
#                        q35's pcie.0 takes no hot-unplug. device_del of function 0
#                        (cxlaccN) ejects the whole slot, cxlaccN-bar included
#   --switch             put every device behind one PCIe switch (a root port, an
#                        x3130 upstream port, an xio3130 downstream port per device):
#                        the topology in which the kernel's PCI P2PDMA lets two
#                        devices reach each other by bus address (7.x)
#   --daemon PATH        daemon binary (default: target/release/cxl-accel)
#   --daemon-arg ARG     extra daemon argument (repeatable)
#   --control DIR        give daemon i a control socket, DIR/ctl<i>.sock
#                        (--control-socket; `cxl-accel ctl --control-socket
#                        DIR/ctl0.sock ...` talks to device 0's daemon)
#   --control-devices L  only these daemons get one (comma-separated indices;
#                        default: all)
#   --only NAME          run only the guest tests NAME (repeatable, or
#                        comma-separated): a test ("hmm.migrate",
#                        "copy_roundtrip") or a suite ("hmm", "dmabuf"); passed
#                        to the guest script as cxlaccel.only= (run-all.sh)
#   --device-arg N:ARG   extra argument for device N's daemon only (repeatable)
#   --log FILE           also save the console (then the daemon logs) to FILE
#   --results DIR        write the verdict for CI systems into DIR: results.ktap
#                        (KTAP), junit.xml (JUnit, suite named after DIR) and
#                        summary; after a failure also the console, kernel,
#                        QEMU and daemon logs
#   --console FILE       write the guest console to FILE while the guest runs (for
#                        host-side scripts that act on what the guest prints)
#   --keep               keep the work directory (sockets, devmem files, logs)
#   --quiet              do not stream the guest console to stdout
#
# Guest scripts print one line per test: "RESULT <name> PASS|FAIL|SKIP [detail]".
# The run fails when a test fails, the end marker is missing (crash, timeout),
# the script's exit code is non-zero, a daemon dies, or the guest kernel log
# has WARNING:/BUG:/Oops/Call Trace/Kernel panic. The last line is
# "N passed, N failed, N skipped".
#
# Needs the set-up of ci/setup.sh ("$CACHE/env.sh", or CXL_ACCEL_ENV).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=ci/lib.sh
. "$HERE/lib.sh"
# shellcheck source=ci/verdict.sh
. "$HERE/verdict.sh"

usage() {
    sed -n '3,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit "${1:-0}"
}

DEVICES=1
DEVMEM=256M
RAM=1G
RAM_NODE=
ATTACH=auto
CXL_HBS=one
CXL_MEM_BAR=0
SOCKET_MODE=server
ACCEL=tcg
SMP=2
TIMEOUT=300
SCRIPT=
INTERACTIVE=0
APPEND=
DAEMON=${CXL_ACCEL_DAEMON:-$REPO/target/release/cxl-accel}
LOGFILE=
RESULTS=
CONSOLE=
KEEP=0
QUIET=0
MONITOR=
HOTPLUG=0
SWITCH=0
MK_ARGS=()
QEMU_EXTRA=()
DAEMON_EXTRA=()
CONTROL_DIR=
CONTROL_DEVICES=
ONLY=
DEVICE_EXTRA=()

need() { [ $# -ge 2 ] || { echo "run-guest: $1 needs a value" >&2; usage 2; }; }
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help) usage 0 ;;
    --devices) need "$@"; DEVICES=$2; shift 2 ;;
    --devmem-size) need "$@"; DEVMEM=$2; shift 2 ;;
    --guest-ram) need "$@"; RAM=$2; shift 2 ;;
    --ram-node) need "$@"; RAM_NODE=$2; shift 2 ;;
    --attach) need "$@"; ATTACH=$2; shift 2 ;;
    --cxl-host-bridges) need "$@"; CXL_HBS=$2; shift 2 ;;
    --cxl-mem-bar) CXL_MEM_BAR=1; shift ;;
    --socket-mode) need "$@"; SOCKET_MODE=$2; shift 2 ;;
    --accel) need "$@"; ACCEL=$2; shift 2 ;;
    --smp) need "$@"; SMP=$2; shift 2 ;;
    --timeout) need "$@"; TIMEOUT=$2; shift 2 ;;
    --script) need "$@"; SCRIPT=$2; shift 2 ;;
    --interactive) INTERACTIVE=1; shift ;;
    --add | --insmod | --module | --add-root) need "$@"; MK_ARGS+=("$1" "$2"); shift 2 ;;
    --append) need "$@"; APPEND="$APPEND $2"; shift 2 ;;
    --qemu-arg) need "$@"; QEMU_EXTRA+=("$2"); shift 2 ;;
    --monitor) need "$@"; MONITOR=$2; shift 2 ;;
    --hotplug) HOTPLUG=1; shift ;;
    --switch) SWITCH=1; shift ;;
    --daemon) need "$@"; DAEMON=$2; shift 2 ;;
    --daemon-arg) need "$@"; DAEMON_EXTRA+=("$2"); shift 2 ;;
    --control) need "$@"; CONTROL_DIR=$2; shift 2 ;;
    --control-devices) need "$@"; CONTROL_DEVICES=$2; shift 2 ;;
    --only) need "$@"; ONLY="${ONLY:+$ONLY,}$2"; shift 2 ;;
    --device-arg) need "$@"; DEVICE_EXTRA+=("$2"); shift 2 ;;
    --log) need "$@"; LOGFILE=$2; shift 2 ;;
    --results) need "$@"; RESULTS=$2; shift 2 ;;
    --console) need "$@"; CONSOLE=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --quiet) QUIET=1; shift ;;
    *) echo "run-guest: unknown argument $1" >&2; usage 2 ;;
    esac
done

[[ "$DEVICES" =~ ^[0-9]+$ ]] || die "run-guest: --devices wants a number"
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "run-guest: --timeout wants seconds"
[ "$HOTPLUG$SWITCH" != 11 ] || die "run-guest: --hotplug and --switch exclude each other"
case "$ATTACH" in auto | shmem | bar | numa | cxl) ;; *) die "run-guest: --attach must be auto, shmem, bar, numa or cxl" ;; esac
case "$CXL_HBS" in one | each) ;; *) die "run-guest: --cxl-host-bridges must be one or each" ;; esac
case "$ACCEL" in
tcg) CPU=${CXL_ACCEL_TCG_CPU:-max} ;;
kvm) CPU=host ;;
*) die "run-guest: --accel must be tcg or kvm" ;;
esac
if [ "$INTERACTIVE" = 1 ] && [ -n "$SCRIPT" ]; then
    die "run-guest: --interactive and --script exclude each other"
fi
if [ "$INTERACTIVE" = 0 ] && [ -z "$SCRIPT" ]; then
    die "run-guest: give --script FILE or --interactive"
fi
[ -z "$SCRIPT" ] || [ -f "$SCRIPT" ] || die "run-guest: script $SCRIPT not found"

load_env
[ -x "$QEMU" ] || die "run-guest: QEMU=$QEMU not executable; rerun ci/setup.sh"
[ -f "$GUEST_KERNEL" ] || die "run-guest: GUEST_KERNEL=$GUEST_KERNEL missing; rerun ci/setup.sh"
if [ "$DEVICES" -gt 0 ] && [ ! -x "$DAEMON" ]; then
    die "run-guest: daemon $DAEMON not found; build it (cargo build --release) or use --devices 0"
fi
[ "$ATTACH" != auto ] || ATTACH=$(default_attach "$QEMU")
if [ "$ATTACH" = shmem ] && ! version_ge "$(qemu_version "$QEMU")" 11.1; then
    die "run-guest: --attach shmem needs QEMU >= 11.1; $QEMU is $(qemu_version "$QEMU")"
fi
if [ "$CXL_MEM_BAR" = 1 ]; then
    [ "$ATTACH" = cxl ] || die "run-guest: --cxl-mem-bar needs --attach cxl"
    "$QEMU" $QEMU_FIRMWARE_ARGS -device vfio-user-pci,help 2>/dev/null | grep -q x-cxl-mem-bar ||
        die "run-guest: --cxl-mem-bar needs a QEMU with qemu/patches (ci/setup.sh --qemu-cxl); $QEMU has no x-cxl-mem-bar"
    APPEND="$APPEND cxlaccel.region=backed"
fi
# The root of the kernel's CXL topology, which nothing loads by itself.
if [ "$ATTACH" = cxl ] && [ -f "${GUEST_MODULES:-}/modules.dep" ] &&
    grep -q '/cxl_acpi\.ko' "$GUEST_MODULES/modules.dep"; then
    MK_ARGS+=(--module cxl_acpi)
fi
# The CXL tool a developer lists the topology with (ndctl's cxl, Debian's
# package cxl in the trixie root ci/setup.sh --kernel 7.3 makes).
if [ "$ATTACH" = cxl ] && [ -x "$CACHE/trixie/root/usr/bin/cxl" ]; then
    MK_ARGS+=(--add-root "$CACHE/trixie/root:/usr/bin/cxl")
fi
# For guest scripts that check how the devices look.
APPEND="$APPEND cxlaccel.attach=$ATTACH"
[ "$ATTACH" != cxl ] || APPEND="$APPEND cxlaccel.hostbridges=$CXL_HBS"
if [ -n "$ONLY" ]; then
    [[ "$ONLY" =~ ^[A-Za-z0-9_.,-]+$ ]] || die "run-guest: --only takes test names (letters, digits, . _ -)"
    APPEND="$APPEND cxlaccel.only=$ONLY"
fi
if [ -n "$CONTROL_DIR" ]; then
    [ -d "$CONTROL_DIR" ] || die "run-guest: --control $CONTROL_DIR is not a directory"
    CONTROL_DIR=$(cd "$CONTROL_DIR" && pwd)
    [[ "$CONTROL_DEVICES" =~ ^[0-9,]*$ ]] || die "run-guest: --control-devices wants indices like 0,1"
fi

# ------------------------------------------------------------- cleanup

WORK=$(mktemp -d "${TMPDIR:-/tmp}/cxl-accel-run.XXXXXX")
DAEMON_PIDS=()
QEMU_PID=
TAIL_PID=

stop_pid() { # politely, then not
    local pid=$1 i
    kill "$pid" 2>/dev/null || return 0
    for i in 1 2 3 4 5 6 7 8 9 10; do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

save_log() {
    [ -n "$LOGFILE" ] || return 0
    {
        cat "${CONSOLE:-$WORK/console.log}" 2>/dev/null || true
        local f
        for f in "$WORK"/daemon*.log "$WORK/qemu.log"; do
            [ -s "$f" ] || continue
            echo "===== $(basename "$f")"
            cat "$f"
        done
    } >"$LOGFILE"
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    [ -z "$QEMU_PID" ] || stop_pid "$QEMU_PID"
    local p
    for p in "${DAEMON_PIDS[@]}"; do stop_pid "$p"; done
    [ -z "$TAIL_PID" ] || stop_pid "$TAIL_PID"
    save_log
    if [ "$KEEP" = 1 ]; then
        echo "run-guest: kept $WORK" >&2
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ----------------------------------------------------------- initramfs

GUEST_RUN=/cxl/run
if [ -n "$SCRIPT" ]; then
    # Every guest script sources the shared helpers (result lines, KTAP).
    MK_ARGS+=(--add "$SCRIPT:$GUEST_RUN" --add "$REPO/tests/guest/scripts/guest-lib.sh:/cxl/guest-lib.sh")
fi
"$HERE/mkinitramfs.sh" "$WORK/initramfs.cpio.gz" "${MK_ARGS[@]}"

# ------------------------------------------------------------- daemons

# Turns the daemon's shell-pasteable "--print-qemu-args" output into one
# argument per NUL-terminated item, without evaluating it as shell code.
split_args() {
    python3 -c '
import shlex, sys
text = (sys.stdin.read() + "\n").replace("\\\n", " ")
sys.stdout.write("".join(a + "\0" for a in shlex.split(text)))'
}

DEV_ARGS=()
start_daemon() {
    local i=$1 sock=$WORK/cxl$1.sock mem=$WORK/devmem$1 pid t
    local common=(--socket-path "$sock" --memory-path "$mem" --memory-size "$DEVMEM" --index "$i"
        --attach "$ATTACH" --socket-mode "$SOCKET_MODE")
    if [ "$ATTACH" = cxl ]; then
        common+=(--cxl-host-bridge "$([ "$CXL_HBS" = each ] && echo "$i" || echo 0)")
        [ "$CXL_MEM_BAR" = 0 ] || common+=(--qemu-cxl-mem-bar)
    fi
    # Every other device's memory is a peer: copies to it count as peer-to-peer.
    local peers=() j
    for ((j = 0; j < DEVICES; j++)); do
        [ "$j" = "$i" ] || peers+=(--peer-memory-path "$WORK/devmem$j")
    done
    local control=()
    if [ -n "$CONTROL_DIR" ] && { [ -z "$CONTROL_DEVICES" ] || [[ ",$CONTROL_DEVICES," == *",$i,"* ]]; }; then
        control=(--control-socket "$CONTROL_DIR/ctl$i.sock")
        echo "run-guest: daemon $i control socket $CONTROL_DIR/ctl$i.sock" >&2
    fi
        local mine=() d
    for d in "${DEVICE_EXTRA[@]}"; do
        [ "${d%%:*}" = "$i" ] && mine+=("${d#*:}")
    done
    "$DAEMON" "${common[@]}" "${peers[@]}" "${control[@]}" "${DAEMON_EXTRA[@]}" "${mine[@]}" >"$WORK/daemon$i.log" 2>&1 &
    pid=$!
    DAEMON_PIDS+=("$pid")
    # Wait for the listening socket; a daemon that dies early is reported. In client mode
    # the socket is QEMU's, created later: the daemon only has to be up.
    for ((t = 0; t < 100; t++)); do
        [ "$SOCKET_MODE" = client ] && [ "$t" -ge 3 ] && break
        [ -S "$sock" ] && break
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 20 "$WORK/daemon$i.log" >&2
            die "run-guest: daemon $i exited at start (log above)"
        fi
        sleep 0.1
    done
    [ "$SOCKET_MODE" = client ] || [ -S "$sock" ] ||
        die "run-guest: daemon $i did not create $sock within 10 s"

    # Only device 0 declares the (shared) guest RAM backend and the machine (with
    # --attach cxl: the windows of every CXL host bridge).
    local ram=none out machine=()
    [ "$i" = 0 ] && ram=$RAM
    [ "$i" = 0 ] && [ -n "$RAM_NODE" ] && machine+=(--ram-node "$RAM_NODE")
    if [ "$i" = 0 ] && [ "$ATTACH" = cxl ] && [ "$CXL_HBS" = each ]; then
        machine=(--cxl-host-bridges "$DEVICES")
    fi
    out=$("$DAEMON" "${common[@]}" "${mine[@]}" "${machine[@]}" --guest-ram "$ram" --print-qemu-args) ||
        die "run-guest: '$DAEMON ... --print-qemu-args' failed"
    local args=()
    mapfile -d '' args < <(printf '%s' "$out" | split_args)
    [ "${#args[@]}" -gt 0 ] || die "run-guest: daemon $i printed no QEMU arguments"
    [ "$HOTPLUG" = 0 ] || hotplug_slot "$i" args
    [ "$SWITCH" = 0 ] || switch_port "$i" args
    DEV_ARGS+=("${args[@]}")
}

# --switch: moves the functions of device i from its slot of pcie.0 to
# downstream port cxlacc<i>-down of one switch (made before the first device).
switch_port() { # i name-of-args-array
    local i=$1 k done='' re='bus=pcie\.0,addr=(0x[0-9a-fA-F]+)\.([0-7])'
    local -n a=$2
    for k in "${!a[@]}"; do
        if [[ "${a[$k]}" =~ $re ]]; then
            a[k]=${a[$k]/"${BASH_REMATCH[0]}"/bus=cxlacc$i-down,addr=0x0.${BASH_REMATCH[2]}}
            done=y
        fi
    done
    [ -n "$done" ] || die "run-guest: --switch: no bus=pcie.0,addr=... in daemon $i's QEMU arguments"
    a=(-device "xio3130-downstream,id=cxlacc$i-down,bus=cxl-switch-up,chassis=$((20 + i)),slot=$((i + 1))"
        "${a[@]}")
    if [ "$i" = 0 ]; then
        a=(-device "pcie-root-port,id=cxl-switch-rp,bus=pcie.0,addr=0xf.0,chassis=19,slot=0"
            -device "x3130-upstream,id=cxl-switch-up,bus=cxl-switch-rp" "${a[@]}")
    fi
}

# --hotplug: moves the functions of device i from slot S of pcie.0 (which
# takes no hot-unplug on q35) to slot 0 behind a pcie-root-port at S, named
# cxlacc<i>-port, placed before them. The device ids stay as printed.
hotplug_slot() { # i name-of-args-array
    local i=$1 k slot='' re='bus=pcie\.0,addr=(0x[0-9a-fA-F]+)\.([0-7])'
    local -n a=$2
    for k in "${!a[@]}"; do
        if [[ "${a[$k]}" =~ $re ]]; then
            slot=${BASH_REMATCH[1]}
            a[k]=${a[$k]/"${BASH_REMATCH[0]}"/bus=cxlacc$i-port,addr=0x0.${BASH_REMATCH[2]}}
        fi
    done
    [ -n "$slot" ] || die "run-guest: --hotplug: no bus=pcie.0,addr=... in daemon $i's QEMU arguments"
    a=(-device "pcie-root-port,id=cxlacc$i-port,bus=pcie.0,addr=$slot.0,chassis=$((i + 1)),slot=$((i + 1))"
        "${a[@]}")
}

for ((i = 0; i < DEVICES; i++)); do start_daemon "$i"; done
if [ "$ATTACH" = numa ] && [ "$DEVICES" -gt 1 ]; then
    # NUMA nodes make up all of RAM: guest RAM plus every device's memory.
    TOTAL=$(($(numfmt --from=iec "$RAM") + DEVICES * $(numfmt --from=iec "$DEVMEM")))
    DEV_ARGS+=(-m "$((TOTAL >> 20))M")
fi

# ---------------------------------------------------------------- QEMU

CMDLINE="console=ttyS0 quiet panic=-1"
# A TCG vCPU that a loaded host starves can miss the IO-APIC timer check at boot, and the
# kernel then panics ("IO-APIC + timer doesn't work"); the check proves nothing under TCG.
[ "$ACCEL" = tcg ] && CMDLINE="$CMDLINE no_timer_check"
[ -n "$SCRIPT" ] && CMDLINE="$CMDLINE cxlaccel.run=$GUEST_RUN"
CMDLINE="$CMDLINE$APPEND"

# shellcheck disable=SC2206 # QEMU_FIRMWARE_ARGS is a word list by design
QEMU_CMD=("$QEMU" $QEMU_FIRMWARE_ARGS
    -accel "$ACCEL" -cpu "$CPU" -smp "$SMP" -m "$RAM" -machine q35
    -nodefaults -no-reboot -display none
    -kernel "$GUEST_KERNEL" -initrd "$WORK/initramfs.cpio.gz" -append "$CMDLINE"
    "${DEV_ARGS[@]}" "${QEMU_EXTRA[@]}")
[ -z "$MONITOR" ] || QEMU_CMD+=(-qmp "unix:$MONITOR,server=on,wait=off")

if [ "$INTERACTIVE" = 1 ]; then
    echo "run-guest: interactive guest; 'exit' powers it off, Ctrl-A X kills QEMU" >&2
    "${QEMU_CMD[@]}" -serial mon:stdio
    exit $?
fi

CONSOLE=${CONSOLE:-$WORK/console.log}
: >"$CONSOLE"
T0=$(now)
"${QEMU_CMD[@]}" -monitor none -serial "file:$CONSOLE" </dev/null >"$WORK/qemu.log" 2>&1 &
QEMU_PID=$!
if [ "$QUIET" = 0 ]; then
    tail -n +1 -f "$CONSOLE" &
    TAIL_PID=$!
fi

TIMED_OUT=0
DEAD_DAEMONS=()
while kill -0 "$QEMU_PID" 2>/dev/null; do
    if [ "$TIMEOUT" -gt 0 ] && awk -v e="$(elapsed "$T0")" -v t="$TIMEOUT" 'BEGIN { exit !(e > t) }'; then
        TIMED_OUT=1
        stop_pid "$QEMU_PID"
        break
    fi
    for ((i = 0; i < ${#DAEMON_PIDS[@]}; i++)); do
        if [ -z "${DEAD_DAEMONS[$i]:-}" ] && ! kill -0 "${DAEMON_PIDS[$i]}" 2>/dev/null; then
            DEAD_DAEMONS[i]=1
            echo "run-guest: daemon $i exited while the guest was running" >&2
        fi
    done
    sleep 0.2
done
QEMU_RC=0
wait "$QEMU_PID" || QEMU_RC=$?
QEMU_PID=
WALL=$(elapsed "$T0")
if [ -n "$TAIL_PID" ]; then
    sleep 0.3 # let tail print the last lines
    stop_pid "$TAIL_PID"
    TAIL_PID=
fi

# ------------------------------------------------------------- verdict

guest_verdict run-guest "devices=$DEVICES accel=$ACCEL"
