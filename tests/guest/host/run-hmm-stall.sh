#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Host side: page migration and SVM on a device whose DMA engines stall.
# Boots a guest with one device whose engines are stalled twice through the
# daemon's control channel ("cxl-accel ctl stall" and "unstall", by
# stalling-daemon with CXL_ACCEL_STALL_HOW=ctl; tests/guest/host/run-stall.sh
# freezes the whole daemon with SIGSTOP instead):
#  1. while the guest migrates 1 MiB back and forth and lets the device
#     checksum it (hmm-tests --stall): commands time out, the migrations are
#     abandoned with the data in place, the quarantined commands keep their
#     destination pages; after the engines run again everything works and
#     the pool gives back every page;
#  2. while the module is unloaded with a process's pages on device memory:
#     eviction falls back to CPU copies, the process's data stays intact.
#
# Usage: tests/guest/host/run-hmm-stall.sh [ci/run-guest.sh options]
set -euo pipefail

# shellcheck source=tests/guest/host/host-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/host-lib.sh"


TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
# Two engine stalls, counted from the guest's "HMM-STALL GO": 4..10 s and
# 30..38 s (the guest unloads the module at 31 s). A stall before the driver
# loaded would fail its probe: with the engines stalled commands time out,
# whereas a frozen daemon also holds the guest's configuration accesses.
export CXL_ACCEL_REAL_DAEMON=$DAEMON CXL_ACCEL_STALLS="4:6 20:8" CXL_ACCEL_STALL_HOW=ctl
export CXL_ACCEL_STALLS_CONSOLE=$TMP/console CXL_ACCEL_STALLS_AFTER="HMM-STALL GO"
cat >"$TMP/guest.sh" <<'EOS'
#!/bin/sh
. /cxl/guest-lib.sh
insmod /cxl/cxl_accel.ko cmd_timeout_ms=1000 || exit 1
go=$(uptime_s)
echo "HMM-STALL GO"
/cxl/hmm-tests --stall 22 /dev/cxl-accel0 || RC=1
# second stall: 30..38 s after GO
rm -f /tmp/hmm-go
/cxl/hmm-tests --hold-migrated /dev/cxl-accel0 --close >/tmp/hold.out 2>&1 &
holder=$!
while [ "$(uptime_s)" -lt $((go + 31)) ]; do sleep 0.2; done
t0=$(uptime_s)
if rmmod cxl_accel; then
    t1=$(uptime_s)
    touch /tmp/hmm-go
    wait $holder
    hrc=$?
    sed 's/^/  /' /tmp/hold.out
    cpu=$(dmesg | grep -o '[0-9]* migrated pages moved back to system RAM at removal, [0-9]* of them by CPU copy\( (error [-0-9]*)\)\?' | tail -n 1)
    if [ $hrc = 0 ] && grep -q 'HOLD DONE ok' /tmp/hold.out; then
        result hmm_stall_unload PASS "rmmod at uptime $t0 s took $((t1 - t0)) s with the engines stalled: $cpu; data intact"
    else
        result hmm_stall_unload FAIL "holder rc $hrc"
    fi
else
    touch /tmp/hmm-go
    result hmm_stall_unload FAIL rmmod
fi
dmesg | grep -iE 'cxl.accel|cxl_accel' | tail -n 12 | sed 's/^/  dmesg: /'
exit $RC
EOS
# cxl_accel.ko needs virtio_dma_buf (DMA-BUF export): /init loads it
"$REPO/ci/run-guest.sh" --devices 1 --timeout 300 --daemon "$HERE/stalling-daemon" \
    --control "$TMP" --console "$TMP/console" \
    --module virtio_dma_buf \
    --add "$REPO/guest-driver/cxl_accel.ko:/cxl/cxl_accel.ko" \
    --add "$GUEST_PROGS/hmm-tests:/cxl/hmm-tests" \
    --add "$GUEST_SCRIPTS/guest-lib.sh:/cxl/guest-lib.sh" \
    --script "$TMP/guest.sh" "$@"
