#!/usr/bin/env bash
# The README's test command: set-up, Rust checks and tests, then the guest
# end-to-end suite (two devices, the driver, every guest test as its own line).
# Usage: ci/test.sh [--skip-guest]   (--skip-guest: daemon-only iteration; CI never uses it)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=ci/lib.sh
. "$HERE/lib.sh"
cd "$ROOT"

SKIP_GUEST=0
case "${1:-}" in
--skip-guest) SKIP_GUEST=1 ;;
-h | --help)
    sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
"") ;;
*) die "ci/test.sh: unknown argument '$1' (see --help)" ;;
esac

command -v cargo >/dev/null ||
    die "ci/test.sh: cargo not found; install a Rust toolchain (rustup, cargo >= 1.85) first"

T0=$(now)
"$HERE/setup.sh"
T_SETUP=$(elapsed "$T0")

log "== cargo build --release"
cargo build --release --locked
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
T_CARGO=$(elapsed "$T1")
T3=$(now)
# Coverage-guided fuzzing of request decoding and execution, bounded.
"$HERE/fuzz.sh" "${CXL_ACCEL_FUZZ_SECONDS:-60}"
T_FUZZ=$(elapsed "$T3")

if [ "$SKIP_GUEST" = 1 ]; then
    log "guest suite skipped (--skip-guest)"
    exit 0
fi

OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
T2=$(now)
# A device that stops answering for a while: -ETIMEDOUT, recovery, clean unload.
log "== guest: stalled device"
# Every guest run uses the daemon's seccomp filter, so a system call missing from its
# list fails CI instead of a user's run.
SANDBOX=(--daemon-arg --seccomp --daemon-arg enforce)
tests/guest/run-stall.sh --quiet "${SANDBOX[@]}" | tee "$OUT"
STALL=$(tail -n 1 "$OUT")
log "== guest: migration while the device stalls"
tests/guest/run-hmm-stall.sh --quiet "${SANDBOX[@]}" | tee "$OUT"
HMM_STALL=$(tail -n 1 "$OUT")
log "== guest: daemon killed 15 times under load (--supervise)"
tests/guest/run-restart.sh --quiet "${SANDBOX[@]}" | tee "$OUT"
RESTART=$(tail -n 1 "$OUT")
log "== guest: soak, 60 s of commands, migration and DMA-BUF on two devices whose workers are killed"
tests/guest/run-soak.sh --quiet "${SANDBOX[@]}" | tee "$OUT"
SOAK=$(tail -n 1 "$OUT")
log "== guest: hot-unplug under load"
tests/guest/run-unplug.sh --quiet "${SANDBOX[@]}" | tee "$OUT"
UNPLUG=$(tail -n 1 "$OUT")
log "== guest: NUMA attach mode, QEMU as the socket server"
"$HERE/run-guest.sh" --attach numa --socket-mode client --devices 2 --quiet --timeout 600 \
    "${SANDBOX[@]}" \
    --insmod guest-driver/cxl_accel.ko:/lib/modules/extra/ \
    --add tests/guest/out/hmm-tests:/bin/ --add tests/guest/out/hmm-bench:/bin/ \
    --script tests/guest/run-numa.sh | tee "$OUT"
NUMA=$(tail -n 1 "$OUT")
log "== guest: end-to-end suite"
"$HERE/guest-suite.sh" "${SANDBOX[@]}" | tee "$OUT"
SUITE=$(tail -n 1 "$OUT")
T_GUEST=$(elapsed "$T2")
log "timings: setup ${T_SETUP}s, cargo ${T_CARGO}s, fuzz ${T_FUZZ}s, guest ${T_GUEST}s, total $(elapsed "$T0")s"
log "guest stall test: $STALL; migration stall test: $HMM_STALL; restarts: $RESTART; soak: $SOAK; hot-unplug: $UNPLUG; NUMA mode: $NUMA"
# The last line is the guest suite's verdict ("N passed, N failed, N skipped").
echo "$SUITE"
