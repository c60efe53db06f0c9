#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Host side: fault injection through the control channel. Boots a guest
# with two devices; device 0's daemon has a control socket
# (ci/run-guest.sh --control), device 1's has none. In the guest,
# fault-tests runs one test per fault class on device 0 and asks the host
# for each fault on the console; fault-host.py runs the "cxl-accel ctl"
# commands and answers on the guest's second serial port (ttyS1). Then the
# cost of the control channel and of tracing is measured (device 1 without
# a control socket against device 0 with one, trace off and on), and the
# driver must unload cleanly with nothing left.
#
# Usage: tests/guest/host/run-faults.sh [--supervise | --cxl-registers]
#                                       [ci/run-guest.sh options]
#   --supervise   the daemons run under --supervise (sandboxed workers); a
#                 short run: the host channel, error status, engine stall,
#                 poison and a worker restart (what fault state survives)
#   --cxl-registers  one CXL endpoint (--attach cxl), neither our driver nor the
#                 kernel's CXL core on it: fault-tests --cxl-registers checks its
#                 DVSECs and component registers against the specification's
#                 table (RAS errors raised through the host channel)
# Environment: FAULT_TESTS="name ..." runs only these fault-tests tests.
set -euo pipefail

# shellcheck source=tests/guest/host/host-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/host-lib.sh"

SUPERVISE=0
REGS=0
case "${1:-}" in
--supervise) SUPERVISE=1; shift ;;
--cxl-registers) REGS=1; shift ;;
esac

TMP=$(mktemp -d)
RG_PID=
HOST_PID=
cleanup() {
    if [ -n "$RG_PID" ]; then # run-guest.sh stops QEMU and the daemons on TERM
        pkill -TERM -P "$RG_PID" 2>/dev/null || true
        wait "$RG_PID" 2>/dev/null || true
    fi
    [ -z "$HOST_PID" ] || kill "$HOST_PID" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

ARGS=
BENCH=1
DAEMON_ARGS=()
if [ "$SUPERVISE" = 1 ]; then
    ARGS="--supervised -t host_channel -t error_status -t engine_stall -t poison_buffer -t worker_restart"
    BENCH=0
    DAEMON_ARGS=(--daemon-arg --supervise)
fi
for t in ${FAULT_TESTS:-}; do ARGS="$ARGS -t $t"; done
DEVICES=2
if [ "$REGS" = 1 ]; then
    DEVICES=1
    DAEMON_ARGS=(--attach cxl)
fi

{
    echo '#!/bin/sh'
    echo "FT_ARGS='$ARGS'"
    echo "BENCH=$BENCH"
    echo "REGS=$REGS"
    cat <<'EOS'
# RC and result (every call here passes PASS or FAIL)
. /cxl/guest-lib.sh
if [ "$REGS" = 1 ]; then
    # the registers as the function came up: no driver of ours, no CXL core
    /cxl/fault-tests -p faults. --cxl-registers || RC=1
    exit $RC
fi
# the commands time out after 5 s unless a test says otherwise
insmod /cxl/cxl_accel.ko cmd_timeout_ms=5000 || { result faults.load FAIL insmod; exit 1; }
d0= d1=
for s in /sys/class/cxl-accel/*; do
    n=$(basename "$s")
    [ -e "/dev/$n" ] || mknod "/dev/$n" c "$(cut -d: -f1 "$s/dev")" "$(cut -d: -f2 "$s/dev")"
    case "$(cat "$s/device_index")" in
    0) d0=$n ;;
    1) d1=$n ;;
    esac
done
[ -n "$d0" ] || { result faults.load FAIL "no device with index 0"; exit 1; }
# the second device, when there is one, for the tests that need two
peer=
[ -z "$d1" ] || peer="-P /dev/$d1"
# shellcheck disable=SC2086
/cxl/fault-tests -d "/dev/$d0" $peer -p faults. $FT_ARGS || RC=1
if [ "$BENCH" = 1 ] && [ -n "$d1" ]; then
    # both devices' interrupts and the benchmark on CPU 0: the devices differ
    # only in the control socket, not in where their completions land
    for irq in $(grep -E 'virtio[0-9]+(-|$)' /proc/interrupts | cut -d: -f1); do
        echo 1 >"/proc/irq/$irq/smp_affinity" 2>/dev/null
    done
    /cxl/fault-tests -d "/dev/$d0" -P "/dev/$d1" -p faults. --bench || RC=1
fi

# nothing left anywhere: driver counters, the module's DMA-BUFs, unload
bad=
for s in /sys/class/cxl-accel/*; do
    for a in quarantined buffers; do
        v=$(cat "$s/$a")
        [ "$v" = 0 ] || bad="$bad $(basename "$s")/$a=$v"
    done
    grep -q '^ranges 0$' "$s/poison_stats" || bad="$bad $(basename "$s") still lists poison"
done
live=$(cat /sys/class/cxl-accel/cxl-accel0/dmabuf/module_live 2>/dev/null)
[ "$live" = "0 0 0" ] || bad="$bad dmabuf module_live='$live'"
if [ -z "$bad" ]; then
    result faults.leaks PASS "no quarantined request, buffer, poison record or DMA-BUF left on any device"
else
    result faults.leaks FAIL "$bad"
fi
if rmmod cxl_accel; then
    result faults.unload PASS "rmmod after the fault tests"
else
    result faults.unload FAIL "rmmod (refcnt $(cat /sys/module/cxl_accel/refcnt))"
fi
dmesg | grep -iE 'cxl.accel|cxl_accel|MCE' | tail -n 30 | sed 's/^/  dmesg: /'
exit $RC
EOS
} >"$TMP/guest.sh"

SERIAL=$TMP/serial.sock
CONSOLE=$TMP/console.log
: >"$CONSOLE"
# cxl_accel.ko needs virtio_dma_buf (DMA-BUF export): /init loads it.
# The second serial port (ttyS1) carries the host's answers.
(
"$REPO/ci/run-guest.sh" --devices "$DEVICES" --timeout 900 \
    --control "$TMP" --control-devices 0 "${DAEMON_ARGS[@]}" \
    --qemu-arg -chardev --qemu-arg "socket,id=cxl-faults,path=$SERIAL,server=on,wait=off" \
    --qemu-arg -device --qemu-arg isa-serial,chardev=cxl-faults,index=1 \
    --module virtio_dma_buf \
    --add "$REPO/guest-driver/cxl_accel.ko:/cxl/cxl_accel.ko" \
    --add "$GUEST_PROGS/fault-tests:/cxl/fault-tests" \
    --add "$GUEST_SCRIPTS/guest-lib.sh:/cxl/guest-lib.sh" \
    --script "$TMP/guest.sh" --console "$CONSOLE" "$@" | tee "$TMP/guest.out"
    exit "${PIPESTATUS[0]}"
) &
RG_PID=$!
"$HERE/fault-host.py" "$CONSOLE" "$SERIAL" "$DAEMON" "$TMP" "$RG_PID" >"$TMP/host.log" 2>&1 &
HOST_PID=$!

RG_RC=0
wait "$RG_PID" || RG_RC=$?
RG_PID=
sleep 0.5
kill "$HOST_PID" 2>/dev/null || true
wait "$HOST_PID" 2>/dev/null || true
HOST_PID=
echo "----- fault-host.py (the host's side of the requests)"
tail -n 80 "$TMP/host.log"
# a failed run keeps the host's side next to run-guest.sh's logs
prev=
for a in "$@"; do
    if [ "$prev" = --results ] && [ "$RG_RC" != 0 ] && [ -d "$a" ]; then
        cp "$TMP/host.log" "$a/fault-host.log"
    fi
    prev=$a
done
echo "-----"
# the verdict line last, as run-guest.sh prints it
tail -n 1 "$TMP/guest.out"
exit "$RG_RC"
