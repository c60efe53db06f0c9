#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Host side of the latency benchmark: one guest boot with cxl-accel devices
# and a virtio peer, rust-vmm's vhost-device-rng behind
# vhost-user-test-device-pci (virtio-id 4: the guest's virtio-rng binds and
# /dev/hwrng reads go to it), so that both are measured in the same boot.
# The guest runs lat-bench (NOP, ATOMIC and 4 KiB COPY round trips next to
# a 64-byte /dev/hwrng read, then ATOMIC ops/s with 1, 2 and 4 threads) and
# lat-stages.sh (the driver's tracepoints: where a round trip goes).
#
# Usage: tests/guest/host/run-latency.sh [--quick | --stages] [ci/run-guest.sh options]
#   (default)  one device as configured by default; the full benchmark
#   --quick    CI's form: fewer calls, 1 s per thread count
#   --stages   every stage on and off in one boot: three devices, whose
#              daemons send every command to an engine (--inline-max 0), run
#              small ones inline (the default), and also busy-poll
#              (--poll-us 50); each measured with the driver's completion
#              polling off and on, with one command queue and one per CPU
#              (and the inline device with a queue per CPU and no polling)
# vhost-device-rng comes from $CACHE/bin (ci/setup.sh --peer-rng installs it), else PATH;
# without it the peer's column stays empty and the run says so.
set -euo pipefail

# shellcheck source=tests/guest/host/host-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/host-lib.sh"

MODE=full
RUNNER=()
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) MODE=quick; shift ;;
    --stages) MODE=stages; shift ;;
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
    log "run-latency: vhost-device-rng not found (ci/setup.sh --peer-rng installs it): no peer device"
fi

DEVICES=1
DEVARGS=()
case $MODE in
quick) RUNS="default:/dev/cxl-accel0:--quick" ;;
full) RUNS="default:/dev/cxl-accel0:" ;;
stages)
    DEVICES=3
    DEVARGS=(--device-arg 0:--inline-max=0 --device-arg 2:--poll-us=50)
    RUNS=
    ;;
esac

cat >"$TMP/guest.sh" <<EOS
#!/bin/sh
P=/sys/module/cxl_accel/parameters
# khwrngd would read the peer device in the background: keep it quiet.
[ -w /sys/class/misc/hw_random/rng_quality ] && echo 0 >/sys/class/misc/hw_random/rng_quality
[ -e /dev/hwrng ] && echo "hwrng: \$(cat /sys/class/misc/hw_random/rng_current)"
echo "clocksource: \$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource), CPUs: \$(nproc)"
rc=0
name() { case \$1 in 0) echo engine ;; 1) echo inline ;; *) echo busypoll ;; esac; }
bench() { # label device lat-bench-args...
    l=\$1; d=\$2; shift 2
    /cxl/lat-bench --label "\$l" "\$@" "\$d" || rc=1
    for k in nop atomic; do /cxl/lat-stages.sh "\$l" \$k 300 "\$d"; done
    n=\$(basename "\$d")
    echo "WAITS \$l polled=\$(cat /sys/class/cxl-accel/\$n/waits_polled) slept=\$(cat /sys/class/cxl-accel/\$n/waits_slept) queues=\$(cat /sys/class/cxl-accel/\$n/cmd_queues)"
}
if [ "$MODE" = stages ]; then
    insmod /cxl/cxl_accel.ko poll_us=0 cmd_queues=1 || exit 1
    for d in 0 1 2; do bench "\$(name \$d)-nopoll-1q" /dev/cxl-accel\$d --threads 1,2; done
    echo 50 >\$P/poll_us
    for d in 0 1 2; do bench "\$(name \$d)-poll-1q" /dev/cxl-accel\$d --threads 1,2; done
    rmmod cxl_accel || exit 1
    insmod /cxl/cxl_accel.ko || exit 1
    for d in 0 1 2; do bench "\$(name \$d)-poll-percpu" /dev/cxl-accel\$d --threads 1,2,4; done
    # The per-CPU queues without the vCPUs' polling: whether threads scale when the host
    # has CPU to spare for them.
    echo 0 >\$P/poll_us
    bench inline-nopoll-percpu /dev/cxl-accel1 --threads 1,2,4
    grep -E 'virtio|cxl' /proc/interrupts
else
    insmod /cxl/cxl_accel.ko || exit 1
    for r in $RUNS; do
        l=\${r%%:*}; r=\${r#*:}
        bench "\$l" "\${r%%:*}" \${r#*:}
    done
fi
exit \$rc
EOS
"$REPO/ci/run-guest.sh" --devices "$DEVICES" --timeout 1200 --module virtio_dma_buf \
    "${PEER[@]}" "${DEVARGS[@]}" \
    --add "$REPO/guest-driver/cxl_accel.ko:/cxl/cxl_accel.ko" \
    --add "$GUEST_PROGS/lat-bench:/cxl/lat-bench" --add "$GUEST_SCRIPTS/lat-stages.sh:/cxl/lat-stages.sh" \
    --script "$TMP/guest.sh" "${RUNNER[@]}"
