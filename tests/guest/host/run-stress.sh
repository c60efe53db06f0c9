#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Host side: the seeded random stress with oracles (tests/guest/progs/mm-stress.c)
# on its own, for long runs by hand: boots a guest with two devices, runs it
# for STRESS_SECONDS (default 3600) with STRESS_SEED (default: a fresh seed,
# printed) and STRESS_PROCS processes (4), STRESS_EXCLUDE operations left
# out (mm-stress -x), then checks that nothing was left behind. The CI form (60 s) runs inside the main suite (run-all.sh).
#
# Usage: tests/guest/host/run-stress.sh [ci/run-guest.sh options]
#   e.g. STRESS_SECONDS=3600 tests/guest/host/run-stress.sh --log /tmp/stress.log
#        STRESS_SEED=123 STRESS_SECONDS=120 tests/guest/host/run-stress.sh  (replay)
set -euo pipefail

# shellcheck source=tests/guest/host/host-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/host-lib.sh"
SECS=${STRESS_SECONDS:-3600}
[[ "$SECS" =~ ^[0-9]+$ ]] || { echo "run-stress: STRESS_SECONDS must be a number" >&2; exit 2; }

[ -x "$REPO/target/release/cxl-accel" ] || (cd "$REPO" && cargo build --release --locked)

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cat >"$TMP/guest.sh" <<EOS
#!/bin/sh
export CXLA_STRESS_SECONDS=$SECS CXLA_STRESS_PROCS=${STRESS_PROCS:-4}
export CXLA_STRESS_SEED=${STRESS_SEED:-} CXLA_STRESS_EXCLUDE=${STRESS_EXCLUDE:-}
export CXLA_STRESS_ARGS="${STRESS_ARGS:-}"
exec sh /bin/stress-guest.sh
EOS
exec "$REPO/ci/run-guest.sh" --devices 2 --quiet --timeout $((SECS + 600)) \
    --insmod "$REPO/guest-driver/cxl_accel.ko:/lib/modules/extra/" \
    --add "$GUEST_PROGS/mm-stress:/bin/" --add "$GUEST_SCRIPTS/stress-guest.sh:/bin/" \
    --add "$GUEST_SCRIPTS/guest-lib.sh:/cxl/guest-lib.sh" \
    --script "$TMP/guest.sh" "$@"
