#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# The README's test command: set-up, Rust checks and tests, fuzzing, the
# README's command blocks, the guest runs (each one guest boot; every guest
# test one RESULT line), the driver through Debian's dkms, the systemd unit
# in a systemd container, and a check that /etc/apt is as it was.
# Usage: ci/test.sh [--list | --run NAME... | --skip-guest]
#   --list        the guest runs, one per line: name and what it does
#   --run NAME    only these guest runs (repeatable; set-up first, no cargo
#                 or fuzz stage), e.g. to spread the runs over machines
#   --skip-guest  cargo and fuzz only (daemon iteration, or the non-guest job
#                 of a CI matrix whose guest jobs use --run)
# Results: every guest run writes KTAP, JUnit XML and (when it failed) its
# logs into $CXL_ACCEL_RESULTS/NAME (default results/ in the repository).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=ci/lib.sh
. "$HERE/lib.sh"
cd "$ROOT"

# name | what it does | command (run from the repository, extra arguments
# for ci/run-guest.sh follow it)
RUNS=(
    "stall|a daemon frozen (SIGSTOP) for 6 s: timeouts, recovery, clean unload|tests/guest/host/run-stall.sh"
    "hmm-stall|migration and unload while the DMA engines stall (ctl stall)|tests/guest/host/run-hmm-stall.sh"
    "restart|daemon killed 15 times under load (--supervise)|tests/guest/host/run-restart.sh"
    "soak|60 s of commands, migration and DMA-BUF on two devices whose workers are killed|tests/guest/host/run-soak.sh"
    "restart-cxl|the restart run with --attach cxl on 7.3: the worker behind QEMU's vfio-user connection killed 15 times under load|env CXL_ACCEL_ENV=$CACHE/env-7.3.sh tests/guest/host/run-restart.sh --attach cxl"
    "soak-cxl|the soak with --attach cxl on 7.3 (its DMA-BUF imports through system memory: no P2PDMA path joins CXL host bridges)|env CXL_ACCEL_ENV=$CACHE/env-7.3.sh tests/guest/host/run-soak.sh --attach cxl"
    "unplug|hot-unplug under load|tests/guest/host/run-unplug.sh"
    "numa|NUMA attach mode, QEMU as the socket server|ci/guest-numa.sh"
    "suite-6.12|main suite on Debian's 6.12 kernel (coherent memory; a NUMA node of RAM beside, for move_pages() in the migration benchmark)|ci/guest-suite.sh --ram-node 256M"
    "suite-7.3|main suite on Debian's 7.3 kernel (coherent and private memory; devices behind a PCIe switch, where the kernel's P2PDMA joins them)|env CXL_ACCEL_ENV=$CACHE/env-7.3.sh ci/guest-suite.sh --switch"
    "hmm-6.12|6.12's own hmm-tests, unmodified, on 6.12|tests/kernel/run-hmm-tests.sh"
    "hmm-7.3|7.3's own hmm-tests, unmodified, on 7.3|env CXL_ACCEL_ENV=$CACHE/env-7.3.sh tests/kernel/run-hmm-tests.sh"
    "floor-10.2|main suite on QEMU 10.2, the documented minimum (ivshmem BAR)|env CXL_ACCEL_QEMU_ENV=$CACHE/qemu-10.2.env ci/guest-suite.sh"
    "libvirt|Debian's libvirt starts the libvirt/ examples (1 and 2 devices), the demo runs in them|ci/libvirt-demo.sh"
    "faults|every fault class injected through the control channel; its cost and tracing's|tests/guest/host/run-faults.sh"
    "faults-7.3|the fault classes on 7.3 (poisoned device-private pages too)|env CXL_ACCEL_ENV=$CACHE/env-7.3.sh tests/guest/host/run-faults.sh"
    "suite-cxl|main suite with --attach cxl on 7.3: each device a CXL Type-2 endpoint over vfio-user, under a host bridge of its own|env CXL_ACCEL_ENV=$CACHE/env-7.3.sh ci/guest-suite.sh --attach cxl --cxl-host-bridges each"
    "cxl-one|the CXL suite on 7.3: memdevs, locked decoders, regions, MSI-X per queue, re-probe; two devices under one host bridge|env CXL_ACCEL_ENV=$CACHE/env-7.3.sh tests/guest/host/run-cxl.sh one"
    "cxl-each|the CXL suite, each device under a host bridge of its own|env CXL_ACCEL_ENV=$CACHE/env-7.3.sh tests/guest/host/run-cxl.sh each"
    "cxl-region|the CXL suite on QEMU 10.2 with qemu/patches (x-cxl-mem-bar): loads and stores through each region reach device memory, the coherence tests through the region|env CXL_ACCEL_ENV=$CACHE/env-7.3.sh CXL_ACCEL_QEMU_ENV=$CACHE/qemu-cxl.env tests/guest/host/run-cxl.sh one --cxl-mem-bar"
    "cxl-regs|the CXL registers of an endpoint as a driver sees them through QEMU, nothing bound: DVSECs and component registers against the specification's table (commit, errors, locks, RAS write-1-to-clear)|env CXL_ACCEL_ENV=$CACHE/env-7.3.sh tests/guest/host/run-faults.sh --cxl-registers"
    "hmm-cxl|the kernel's own hmm-tests on 7.3 with --attach cxl|env CXL_ACCEL_ENV=$CACHE/env-7.3.sh tests/kernel/run-hmm-tests.sh --attach cxl"
    "faults-cxl|the fault classes on 7.3 with --attach cxl|env CXL_ACCEL_ENV=$CACHE/env-7.3.sh tests/guest/host/run-faults.sh --attach cxl"
    "faults-supervise|faults under --supervise; what a worker restart keeps|tests/guest/host/run-faults.sh --supervise"
    "latency|command round trips next to vhost-device-rng in the same boot, ATOMIC ops/s with 1, 2, 4 threads (quick form, 4 vCPUs)|tests/guest/host/run-latency.sh --quick --smp 4"
)

run_field() { # index field
    echo "${RUNS[$1]}" | cut -d'|' -f"$2"
}

list_runs() {
    local i
    for i in "${!RUNS[@]}"; do
        printf '%-16s %s\n' "$(run_field "$i" 1)" "$(run_field "$i" 2)"
    done
}

SKIP_GUEST=0
ONLY=()
while [ $# -gt 0 ]; do
    case "$1" in
    --skip-guest) SKIP_GUEST=1; shift ;;
    --list) list_runs; exit 0 ;;
    --run)
        [ -n "${2:-}" ] || die "ci/test.sh: --run needs a name (see --list)"
        list_runs | awk '{print $1}' | grep -qx "$2" || die "ci/test.sh: no guest run '$2' (see --list)"
        ONLY+=("$2")
        shift 2
        ;;
    -h | --help)
        script_help "$0" 3
        exit 0
        ;;
    *) die "ci/test.sh: unknown argument '$1' (see --help)" ;;
    esac
done

need_cargo ci/test.sh "$ROOT"

# The host's apt configuration before anything runs: the set-up reads extra
# Debian suites through private configurations and must leave it alone.
OUT=$(mktemp)
APT_BEFORE=$(mktemp)
trap 'rm -f "$OUT" "$APT_BEFORE"' EXIT
etc_apt_state >"$APT_BEFORE"
etc_apt_unchanged() {
    log "== /etc/apt as before the set-up"
    if ! etc_apt_state | diff -u "$APT_BEFORE" - >&2; then
        echo "ci/test.sh: /etc/apt changed (above); the set-up must use private apt configurations" >&2
        return 1
    fi
    log "/etc/apt unchanged ($(wc -l <"$APT_BEFORE") entries)"
}

RESULTS=${CXL_ACCEL_RESULTS:-$ROOT/results}
T0=$(now)
"$HERE/setup.sh" --kernel 7.3 --qemu-floor --qemu-cxl --linux-source --peer-rng
T_SETUP=$(elapsed "$T0")

log "== cargo build --release"
cargo build --release --locked
T_CARGO=0
T_FUZZ=0
if [ "${#ONLY[@]}" -eq 0 ]; then
    if cargo fmt --version >/dev/null 2>&1; then
        log "== cargo fmt --check"
        cargo fmt --check
    else
        log "cargo fmt not installed: formatting not checked"
    fi
    if cargo clippy --version >/dev/null 2>&1; then
        log "== cargo clippy"
        cargo clippy --locked --all-targets -- -D warnings
    else
        log "cargo clippy not installed: lints not checked"
    fi
    log "== cargo test"
    T1=$(now)
    cargo test --locked
    # The benchmark binary must keep working: run it in its quick form.
    cargo bench --locked --bench throughput -- --quick
    # The checker of the guest runs' KTAP and JUnit files refuses broken ones.
    python3 "$HERE/check-results.py" --self-test
    # The guest driver's files call only the layers below them.
    log "== guest driver layers (ci/driver-layers.sh)"
    "$HERE/driver-layers.sh"
    T_CARGO=$(elapsed "$T1")
    # The README's commands, as a user would type them (they boot guests).
    if [ "$SKIP_GUEST" = 0 ]; then
        log "== README command blocks (ci/readme-check.sh)"
        "$HERE/readme-check.sh"
    fi
    T3=$(now)
    # Coverage-guided fuzzing of request decoding and execution, bounded.
    "$HERE/fuzz.sh" "${CXL_ACCEL_FUZZ_SECONDS:-60}"
    T_FUZZ=$(elapsed "$T3")
fi

if [ "$SKIP_GUEST" = 1 ]; then
    log "guest runs skipped (--skip-guest)"
    etc_apt_unchanged
    exit 0
fi

# Every guest run uses the daemon's seccomp filter (its default), so a
# system call missing from its list fails CI instead of a user's run.
rm -rf "$RESULTS"
mkdir -p "$RESULTS"
T2=$(now)
SUMMARY=()
FAILED_RUNS=()
for i in "${!RUNS[@]}"; do
    name=$(run_field "$i" 1)
    if [ "${#ONLY[@]}" -gt 0 ] && ! printf '%s\n' "${ONLY[@]}" | grep -qx "$name"; then
        continue
    fi
    log "== guest: $name: $(run_field "$i" 2)"
    t=$(now)
    rc=0
    # shellcheck disable=SC2046 # the command is words by design
    $(run_field "$i" 3) --quiet --results "$RESULTS/$name" | tee "$OUT" || rc=$?
    SUMMARY+=("$(printf '%-16s %-40s %6ss' "$name" "$(tail -n 1 "$OUT")" "$(elapsed "$t")")")
    # What CI systems read must be valid: KTAP, JUnit, and the two agreeing; a run
    # of several guests (libvirt: one and two) has a folder for each.
    mapfile -t folders < <(find "$RESULTS/$name" -name results.ktap -printf '%h\n' 2>/dev/null | sort)
    if [ "${#folders[@]}" -eq 0 ]; then
        echo "check-results: INVALID: $RESULTS/$name has no results.ktap"
        rc=1
    else
        python3 "$HERE/check-results.py" "${folders[@]}" || rc=1
    fi
    [ "$rc" = 0 ] || FAILED_RUNS+=("$name")
done
T_GUEST=$(elapsed "$T2")

# The driver as out-of-tree drivers ship: Debian's dkms for both guest
# kernels, in private trees, and a guest of each with the module it built.
T_DKMS=0
if [ "${#ONLY[@]}" -eq 0 ]; then
    log "== dkms: build, install and remove the driver for 6.12 and 7.3, boot with it"
    t=$(now)
    "$HERE/dkms-check.sh" || FAILED_RUNS+=(dkms)
    T_DKMS=$(elapsed "$t")
    # The systemd unit under a real systemd (a container: CI's PID 1 may be another).
    log "== systemd: cxl-accel@.service in a systemd container"
    "$HERE/systemd-check.sh" || FAILED_RUNS+=(systemd)
fi
etc_apt_unchanged || FAILED_RUNS+=(etc-apt)

TIMINGS="timings: setup ${T_SETUP}s, cargo ${T_CARGO}s, fuzz ${T_FUZZ}s, guest ${T_GUEST}s, dkms ${T_DKMS}s, total $(elapsed "$T0")s"
log "$TIMINGS"
echo "guest runs (KTAP, JUnit and the logs of failed runs in $RESULTS):"
printf '  %s\n' "${SUMMARY[@]}"
# The run's figures, for CI to keep with the results (an artifact, never the README).
{
    echo "# ci/test.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "$TIMINGS"
    printf '%s\n' "${SUMMARY[@]}"
} >"$RESULTS/timings.txt"
if [ "${#FAILED_RUNS[@]}" -gt 0 ]; then
    echo "FAILED: ${FAILED_RUNS[*]}"
    exit 1
fi
echo "all guest runs, the dkms, systemd and /etc/apt checks passed"
