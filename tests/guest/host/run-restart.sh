#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Host side: restart without loss. Boots a guest with one device whose daemon
# runs under --supervise; its worker is SIGKILLed KILLS times, INTERVAL
# seconds apart, while four guest threads stream commands
# (cxl-accel-tests --restart) and check every result. Then the driver is
# unloaded and reloaded and the device checked again.
#
# Usage: tests/guest/host/run-restart.sh [ci/run-guest.sh options]
# Environment: KILLS (default 15), INTERVAL (1.5), START (2: seconds after
# the guest program says it is streaming), STREAM (40: guest seconds),
# KEEP_LOG (a file to keep the console and daemon logs in).
set -euo pipefail

# shellcheck source=tests/guest/host/host-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/host-lib.sh"
KILLS=${KILLS:-15}
INTERVAL=${INTERVAL:-1.5}
START=${START:-2}
STREAM=${STREAM:-40}


TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export CXL_ACCEL_REAL_DAEMON=$DAEMON CXL_ACCEL_KILLS="$START $KILLS $INTERVAL"
# Kills start once the guest streams, however long the boot took.
export CXL_ACCEL_KILLS_CONSOLE=$TMP/console CXL_ACCEL_KILLS_AFTER="RESTART STREAMING"
cat >"$TMP/guest.sh" <<EOS
#!/bin/sh
. /cxl/guest-lib.sh
insmod /cxl/cxl_accel.ko || exit 1
# --attach cxl: the CXL Device DVSEC (control, lock, range) as the kernel set it up,
# read through config space before the kills and after them.
dvsec() {
    dd if="/sys/bus/pci/devices/\$1/config" bs=4 skip=64 count=10 2>/dev/null | od -An -tx4 | tr -s ' \n' ' '
}
BDF=\$(basename "\$(readlink -f /sys/class/cxl-accel/cxl-accel0/device/..)")
# a DVSEC (extended capability 0x23) at 0x100: the CXL function of --attach cxl
case "\$(dvsec "\$BDF" | awk '{print \$1}')" in *0023) BEFORE=\$(dvsec "\$BDF") ;; esac
/cxl/cxl-accel-tests --restart $STREAM /dev/cxl-accel0 || RC=1
if [ -n "\${BEFORE:-}" ]; then
    AFTER=\$(dvsec "\$BDF")
    if [ "\$AFTER" = "\$BEFORE" ]; then
        result restart_cxl_registers PASS "CXL Device DVSEC of \$BDF as before the kills:\$AFTER"
    else
        result restart_cxl_registers FAIL "before:\$BEFORE after:\$AFTER"
        RC=1
    fi
fi
if rmmod cxl_accel && insmod /cxl/cxl_accel.ko &&
   /cxl/cxl-accel-tests -d /dev/cxl-accel0 -p after_restarts_ -t identify -t copy_roundtrip -t alloc_many -t signal_event -t stats; then
    result restart_reload PASS "driver reloaded, device answers after the restarts"
else
    result restart_reload FAIL "-"
fi
rmmod cxl_accel || RC=1
exit \$RC
EOS
set +e
"$REPO/ci/run-guest.sh" --devices 1 --timeout 400 --daemon "$HERE/killing-daemon" \
    --module virtio_dma_buf --log "$TMP/run.log" --console "$TMP/console" \
    --add "$REPO/guest-driver/cxl_accel.ko:/cxl/cxl_accel.ko" \
    --add "$GUEST_PROGS/cxl-accel-tests:/cxl/cxl-accel-tests" \
    --add "$GUEST_SCRIPTS/guest-lib.sh:/cxl/guest-lib.sh" \
    --script "$TMP/guest.sh" "$@" >"$TMP/out" 2>&1
rc=$?
set -e
# KEEP_LOG=FILE keeps the console and daemon logs.
if [ -n "${KEEP_LOG:-}" ]; then cp "$TMP/run.log" "$KEEP_LOG"; fi
grep -vE '^[0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?$' "$TMP/out" || true
kills=$(grep -c 'killing-daemon: SIGKILL worker' "$TMP/run.log" || true)
restarts=$(grep -c 'worker pid .* started (resuming)' "$TMP/run.log" || true)
summary=$(tail -n 1 "$TMP/out")
echo "host: $kills workers killed, $restarts resumed by the supervisor"
if [ "$rc" = 0 ] && [ "$kills" -lt "$KILLS" ]; then
    echo "host: expected $KILLS kills, the guest finished first"
    rc=1
fi
if [ "$rc" != 0 ]; then
    grep -E 'supervisor|resumed|ERROR|panick' "$TMP/run.log" | tail -n 30 || true
fi
echo "$summary; $kills kills survived"
exit $rc
