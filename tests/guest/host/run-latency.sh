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
# The host also reads the daemon's CPU time (not in --stages): over 10 s with the
# device idle, and over the benchmark per 1,000 commands (the CPU lines).
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
    # The daemon's CPU time, read by the host at these lines: over 10 s with the device
    # idle (loaded, nothing running), then over the benchmark, per command it served.
    sleep 2
    echo "CPU IDLE START"; sleep 10; echo "CPU IDLE END"
    cmds() { awk '\$1 == "commands" { print \$2 }' /sys/class/cxl-accel/cxl-accel0/device_stats; }
    echo "CPU BENCH START \$(cmds)"
    for r in $RUNS; do
        l=\${r%%:*}; r=\${r#*:}
        bench "\$l" "\${r%%:*}" \${r#*:}
    done
    echo "CPU BENCH END \$(cmds)"
    sleep 1
fi
exit \$rc
EOS
# The daemons' CPU time (utime + stime of the whole process) at the guest's CPU lines.
# shellcheck source=tests/guest/host/console-wait.sh
. "$HERE/console-wait.sh"
export CXL_ACCEL_REAL_DAEMON=$DAEMON CXL_ACCEL_PIDS=$TMP/pids
: >"$TMP/pids"
cpu_s() { # seconds of CPU the daemons have used so far
    local t=0 p
    for p in $(cat "$TMP/pids"); do
        [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat")))
    done
    awk -v t="$t" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", t / hz }'
}
cpu_watch() {
    local c=$TMP/console a b n0 n1
    wait_for_console "$c" "CPU IDLE START" || return 0
    a=$(cpu_s)
    wait_for_console "$c" "CPU IDLE END" || return 0
    b=$(cpu_s)
    echo "CPU daemon idle: $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", b - a }') s over 10 s of an idle device"
    wait_for_console "$c" "CPU BENCH START" || return 0
    a=$(cpu_s)
    n0=$(grep -a -m1 -o 'CPU BENCH START [0-9]*' "$c" | awk '{ print $4 }')
    wait_for_console "$c" "CPU BENCH END" || return 0
    b=$(cpu_s)
    n1=$(grep -a -m1 -o 'CPU BENCH END [0-9]*' "$c" | awk '{ print $4 }')
    awk -v a="$a" -v b="$b" -v n="$((n1 - n0))" 'BEGIN {
        printf "CPU daemon busy: %.2f s for %d commands, %.3f s per 1,000 commands\n",
            b - a, n, (n > 0 ? (b - a) * 1000 / n : 0) }'
}
CPU_WATCH=
if [ "$MODE" != stages ]; then
    cpu_watch &
    CPU_WATCH=$!
    DEVARGS+=(--daemon "$HERE/cpu-daemon" --console "$TMP/console")
fi
"$REPO/ci/run-guest.sh" --devices "$DEVICES" --timeout 1200 --module virtio_dma_buf \
    "${PEER[@]}" "${DEVARGS[@]}" \
    --add "$REPO/guest-driver/cxl_accel.ko:/cxl/cxl_accel.ko" \
    --add "$GUEST_PROGS/lat-bench:/cxl/lat-bench" --add "$GUEST_SCRIPTS/lat-stages.sh:/cxl/lat-stages.sh" \
    --script "$TMP/guest.sh" "${RUNNER[@]}" || rc=$?
# What it has not said by now, it will not (the guest is gone).
if [ -n "$CPU_WATCH" ]; then
    kill "$CPU_WATCH" 2>/dev/null || true
    wait "$CPU_WATCH" 2>/dev/null || true
fi
exit "${rc:-0}"
