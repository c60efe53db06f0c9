#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# The README's demo command: boots a guest with one cxl-accel device and the driver, and
# shows coherent CPU access to device memory, a device computation on guest data, and
# copy bandwidth next to the CPU's. Runs ci/setup.sh first (cached after the first time)
# and builds the daemon, the driver and the demo program.
#
# Usage: ci/demo.sh [RUN-GUEST-OPTIONS...]
#   extra arguments go to ci/run-guest.sh (see ci/run-guest.sh --help), e.g.
#   --log FILE to keep the guest console, --accel kvm on a host with KVM
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=ci/lib.sh
. "$HERE/lib.sh"
cd "$ROOT"

case "${1:-}" in
-h | --help)
    script_help "$0" 3
    exit 0
    ;;
esac

need_cargo ci/demo.sh "$ROOT"
# The daemon builds while the set-up downloads (its progress goes to stderr).
T0=$(now)
BUILDLOG=$(mktemp)
log "building the daemon (cargo build --release) while the set-up runs"
cargo build --release --locked >"$BUILDLOG" 2>&1 &
CARGO_PID=$!
"$HERE/setup.sh" >/dev/null
wait_progress "cargo build --release" "$BUILDLOG" "$CARGO_PID" "$T0" ||
    { tail -n 30 "$BUILDLOG" >&2; die "ci/demo.sh: cargo build --release failed"; }
rm -f "$BUILDLOG"
load_env
log "building the driver and the demo program"
build_driver "$ROOT"
make -s -C tests/guest/progs >/dev/null

# the host's memcpy, the yardstick of the device's DMA figures (same buffers, THP)
HOST_MEMCPY=$(tests/guest/progs/out/cxl-accel-demo --memcpy 32 | sed -n 's/.*: \([0-9.]*\) MB\/s$/\1/p')
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
log "booting a guest (QEMU $("$QEMU" --version | head -n1 | awk '{print $4}'), 1 device, TCG)"
rc=0
"$HERE/run-guest.sh" --devices 1 --quiet --timeout 300 --log "$LOG" \
    --insmod guest-driver/cxl_accel.ko:/lib/modules/extra/ \
    --add tests/guest/progs/out/cxl-accel-demo:/bin/ --add tests/guest/scripts/guest-lib.sh:/cxl/guest-lib.sh \
    ${HOST_MEMCPY:+--append "cxlaccel.host_memcpy=$HOST_MEMCPY"} \
    --script tests/guest/scripts/demo-guest.sh "$@" >/dev/null || rc=$?
echo
grep -E '^DEMO\| ' "$LOG" | tr -d '\r' | sed 's/^DEMO| /  /'
echo
if [ "$rc" = 0 ]; then
    echo "demo: done (guest console log: rerun with --log FILE to keep it)"
else
    echo "demo: FAILED; the guest console follows" >&2
    tail -n 60 "$LOG" >&2
    exit "$rc"
fi
