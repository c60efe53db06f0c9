#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Host side of the latency benchmark: one guest boot with a cxl-accel device
# and a virtio peer, rust-vmm's vhost-device-rng behind
# vhost-user-test-device-pci (virtio-id 4: the guest's virtio-rng binds and
# /dev/hwrng reads go to it), so that both are measured in the same boot.
# The guest runs lat-bench (NOP, ATOMIC and 4 KiB COPY round trips next to
# a 64-byte /dev/hwrng read, then ATOMIC ops/s with 1, 2 and 4 threads).
#
# Usage: tests/guest/run-latency.sh [--quick] [--bench-arg ARG]...
#                                   [ci/run-guest.sh options]
#   --quick          CI's form: fewer calls, 1 s per thread count
#   --bench-arg ARG  extra lat-bench argument (repeatable)
#   --params STR     cxl_accel module parameters (e.g. "poll_us=0")
# vhost-device-rng comes from $CACHE/bin (ci/setup.sh installs it), else PATH;
# without it the peer's column stays empty and the run says so.
set -euo pipefail

# shellcheck source=tests/guest/host-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/host-lib.sh"

BENCH=()
PARAMS=
RUNNER=()
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) BENCH+=(--quick); shift ;;
    --bench-arg) BENCH+=("$2"); shift 2 ;;
    --params) PARAMS=$2; shift 2 ;;
    *) RUNNER+=("$1"); shift ;;
    esac
done

TMP=$(mktemp -d)
RNG_PID=
cleanup() {
    [ -z "$RNG_PID" ] || kill "$RNG_PID" 2>/dev/null || true
    [ -z "$RNG_PID" ] || wait "$RNG_PID" 2>/dev/null || true
    rm -rf "$TMP"
}
trap cleanup EXIT

PEER=()
RNG_BIN=$CACHE/bin/vhost-device-rng
[ -x "$RNG_BIN" ] || RNG_BIN=$(command -v vhost-device-rng || true)
if [ -n "$RNG_BIN" ]; then
    # The daemon appends the instance number to the socket path.
    "$RNG_BIN" --socket-path "$TMP/rng.sock" >"$TMP/rng.log" 2>&1 &
    RNG_PID=$!
    for _ in $(seq 100); do
        [ -S "$TMP/rng.sock0" ] && break
        kill -0 "$RNG_PID" 2>/dev/null || break
        sleep 0.1
    done
    [ -S "$TMP/rng.sock0" ] || { cat "$TMP/rng.log" >&2; die "run-latency: vhost-device-rng did not start"; }
    PEER=(--qemu-arg -chardev --qemu-arg "socket,id=rng0,path=$TMP/rng.sock0"
        --qemu-arg -device
        --qemu-arg "vhost-user-test-device-pci,chardev=rng0,virtio-id=4,num_vqs=1,bus=pcie.0,addr=0x18.0"
        --module virtio-rng)
else
    log "run-latency: vhost-device-rng not found (ci/setup.sh installs it): no peer device"
fi

cat >"$TMP/guest.sh" <<EOS
#!/bin/sh
insmod /cxl/cxl_accel.ko $PARAMS || exit 1
# khwrngd would read the peer device in the background: keep it quiet.
[ -w /sys/class/misc/hw_random/rng_quality ] && echo 0 >/sys/class/misc/hw_random/rng_quality
[ -e /dev/hwrng ] && echo "hwrng: \$(cat /sys/class/misc/hw_random/rng_current)"
echo "clocksource: \$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
for n in /sys/bus/virtio/devices/*; do echo "\$(basename \$n): device \$(cat \$n/device) irq \$(cat \$n/../irq 2>/dev/null)"; done
grep -E 'virtio|cxl|CPU' /proc/interrupts
/cxl/lat-bench ${BENCH[*]} /dev/cxl-accel0
rc=\$?
for k in nop atomic copy4k; do /cxl/lat-stages.sh now \$k 300; done
grep -E 'virtio|cxl' /proc/interrupts
cat /sys/class/cxl-accel/cxl-accel0/*polled* /sys/class/cxl-accel/cxl-accel0/*slept* 2>/dev/null
exit \$rc
EOS
"$REPO/ci/run-guest.sh" --devices 1 --timeout 900 --module virtio_dma_buf "${PEER[@]}" \
    --add "$REPO/guest-driver/cxl_accel.ko:/cxl/cxl_accel.ko" \
    --add "$HERE/out/lat-bench:/cxl/lat-bench" --add "$HERE/lat-stages.sh:/cxl/lat-stages.sh" \
    --script "$TMP/guest.sh" "${RUNNER[@]}"
