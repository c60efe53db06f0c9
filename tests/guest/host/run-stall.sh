#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Host side: a dead-then-alive device. Boots a guest with one device whose
# daemon is stopped (SIGSTOP) for STOP_FOR seconds, STOP_AT seconds after
# the guest started copying, then resumed; the guest keeps issuing commands meanwhile
# (cxl-accel-tests --stall) and checks -ETIMEDOUT, recovery, the quarantine
# and clean unload.
#
# Usage: tests/guest/host/run-stall.sh [ci/run-guest.sh options]
set -euo pipefail

# shellcheck source=tests/guest/host/host-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/host-lib.sh"
STOP_AT=${STOP_AT:-4}
STOP_FOR=${STOP_FOR:-6}


TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export CXL_ACCEL_REAL_DAEMON=$DAEMON CXL_ACCEL_STALLS="$STOP_AT:$STOP_FOR"
# The stop comes STOP_AT seconds after the guest starts copying, however long the boot took.
export CXL_ACCEL_STALLS_CONSOLE=$TMP/console CXL_ACCEL_STALLS_AFTER="STALL "

cat >"$TMP/guest.sh" <<'EOS'
#!/bin/sh
. /cxl/guest-lib.sh
insmod /cxl/cxl_accel.ko cmd_timeout_ms=2000 || exit 1
/cxl/cxl-accel-tests --stall 25 /dev/cxl-accel0 || RC=1
cat /sys/class/cxl-accel/cxl-accel0/timeouts /sys/class/cxl-accel/cxl-accel0/quarantined
if rmmod cxl_accel; then
    result stall_unload PASS "rmmod after the stall"
else
    result stall_unload FAIL rmmod
fi
exit $RC
EOS
# cxl_accel.ko needs virtio_dma_buf (DMA-BUF export): /init loads it
"$REPO/ci/run-guest.sh" --devices 1 --timeout 300 --daemon "$HERE/stalling-daemon" \
    --module virtio_dma_buf --console "$TMP/console" \
    --add "$REPO/guest-driver/cxl_accel.ko:/cxl/cxl_accel.ko" \
    --add "$GUEST_PROGS/cxl-accel-tests:/cxl/cxl-accel-tests" \
    --add "$GUEST_SCRIPTS/guest-lib.sh:/cxl/guest-lib.sh" \
    --script "$TMP/guest.sh" "$@"
