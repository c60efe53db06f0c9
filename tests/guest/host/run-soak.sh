#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Host side: soak test under daemon restarts. Boots a guest with two devices
# whose daemons run under --supervise (tests/guest/host/killing-daemon) and, for
# SOAK_SECONDS, runs a mixed workload in the guest while the host SIGKILLs
# the device workers, one kill per device every INTERVAL seconds (the two
# devices staggered by half of it: a kill every second by default):
#   - command streams on both devices (cxl-accel-tests --soak: COPY, FILL,
#     CHECKSUM, ATOMIC, ALLOC/FREE from four threads each);
#   - migration (hmm-tests --soak): anonymous memory with known contents to
#     either device, between them and back, CPU writes, device reads and
#     writes through SVM, the odd EVICT, the data checked after every step;
#   - DMA-BUF (dmabuf-tests --soak): buffers exported by one device and
#     imported into the other, peer-to-peer copies, fills, checksums and
#     atomics, exports and imports made anew, the data checked after every
#     step.
# A command in flight at a kill may fail with -EIO (counted), nothing else
# may fail, no byte may be wrong, nothing may hang. Afterwards nothing may be
# left behind (device memory, buffers, migration pool, DMA-BUFs, quarantine,
# warnings in the kernel log), and the module must unload, load again and
# work.
#
# Usage: tests/guest/host/run-soak.sh [ci/run-guest.sh options]
# Environment: SOAK_SECONDS (default 60, the CI form; e.g. 3600 for the long
# form, by hand), INTERVAL (2: seconds between kills of one device), START
# (3: seconds after the guest says the workload runs), KILLS (per device;
# default: as many as fit, the last one at least 6 s before the end),
# SOAK_LOG (a file to keep the guest console and daemon logs in).
set -euo pipefail

# shellcheck source=tests/guest/host/host-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/host-lib.sh"
SOAK=${SOAK_SECONDS:-60}
INTERVAL=${INTERVAL:-2}
START=${START:-3}
STAGGER=$(awk -v i="$INTERVAL" 'BEGIN { print i / 2 }')
if ! [[ "$SOAK" =~ ^[0-9]+$ ]] || [ "$SOAK" -lt 20 ]; then
    echo "run-soak: SOAK_SECONDS must be a number of seconds >= 20" >&2
    exit 2
fi
KILLS=${KILLS:-$(awk -v s="$SOAK" -v i="$INTERVAL" -v a="$START" -v g="$STAGGER" \
    'BEGIN { n = int((s - 6 - a - g) / i) + 1; print (n < 1 ? 1 : n) }')}


TMP=$(mktemp -d)
trap '[ -z "${SOAK_LOG:-}" ] || cp "$TMP/run.log" "$SOAK_LOG"; rm -rf "$TMP"' EXIT
export CXL_ACCEL_REAL_DAEMON=$DAEMON CXL_ACCEL_KILLS="$START $KILLS $INTERVAL"
export CXL_ACCEL_KILLS_STAGGER=$STAGGER
# Kills start once the guest runs the workload, however long the boot took.
export CXL_ACCEL_KILLS_CONSOLE=$TMP/console CXL_ACCEL_KILLS_AFTER="SOAK RUNNING"
cat >"$TMP/guest.sh" <<EOS
#!/bin/sh
. /cxl/guest-lib.sh
S=/sys/class/cxl-accel
insmod /cxl/cxl_accel.ko || exit 1
for d in cxl-accel0 cxl-accel1; do
    if [ ! -e /dev/\$d ] || [ "\$(cat \$S/\$d/devmem_free)" != "\$(cat \$S/\$d/devmem_size)" ]; then
        result soak_setup FAIL "\$d missing or not all of its memory free"
        exit 1
    fi
done
# The kernel log as it comes: in a long soak the ring buffer wraps (every
# restart logs a line), the final dmesg would miss the start.
cat /dev/kmsg >/tmp/kmsg &
kp=\$!
echo "cxl-accel-soak: workload starts" >/dev/kmsg

/cxl/cxl-accel-tests --soak $SOAK /dev/cxl-accel0 &
p0=\$!
/cxl/cxl-accel-tests --soak $SOAK /dev/cxl-accel1 &
p1=\$!
/cxl/hmm-tests --soak $SOAK /dev/cxl-accel0 /dev/cxl-accel1 &
p2=\$!
/cxl/dmabuf-tests --soak $SOAK &
p3=\$!
echo "SOAK RUNNING for $SOAK s"
for p in \$p0 \$p1 \$p2 \$p3; do
    wait "\$p" || RC=1
done

# Nothing left behind. Buffers given back late (deferred FREE, pool chunks)
# get a few seconds.
for d in cxl-accel0 cxl-accel1; do
    s=\$S/\$d
    size=\$(cat \$s/devmem_size)
    i=0
    while { [ "\$(cat \$s/devmem_free)" != "\$size" ] || [ "\$(cat \$s/buffers)" != 0 ]; } && [ \$i -lt 100 ]; do
        sleep 0.1
        i=\$((i + 1))
    done
    free=\$(cat \$s/devmem_free)
    bufs=\$(cat \$s/buffers)
    chunks=\$(awk '\$1 == "pool_chunks" { print \$2 }' \$s/migration)
    used=\$(awk '\$1 == "pool_pages_used" { print \$2 }' \$s/migration)
    to=\$(cat \$s/timeouts)
    q=\$(cat \$s/quarantined)
    pe=\$(cat \$s/protocol_errors)
    detail="device memory free \$free of \$size, \$bufs buffers, pool \$chunks chunks \$used pages, \$to timeouts, \$q quarantined, \$pe protocol errors; \$(cat \$s/commands_completed) commands, \$(cat \$s/command_errors) failed on the device"
    if [ "\$free" = "\$size" ] && [ "\$bufs" = 0 ] && [ "\$chunks" = 0 ] && [ "\$used" = 0 ] &&
       [ "\$to" = 0 ] && [ "\$q" = 0 ] && [ "\$pe" = 0 ]; then
        result soak_leaks.\$d PASS "\$detail"
    else
        result soak_leaks.\$d FAIL "\$detail"
    fi
done
live=\$(cat \$S/cxl-accel0/dmabuf/module_live)
# The driver's warnings and errors since the start (lost FREEs or UNEXPORTs,
# protocol trouble), and any kernel warning: records "PRI,SEQ,TIME,-;TEXT",
# kernel facility and level 0-4 is PRI < 5.
sleep 0.2
kill \$kp
bad=\$(sed -n '/cxl-accel-soak: workload starts/,\$p' /tmp/kmsg |
    awk -F';' '{ split(\$1, h, ","); if (h[1] < 5 && \$0 ~ /cxl.accel/) print \$2 }
        /WARNING:|BUG:|Oops|Call Trace|Kernel panic/ { print \$2 }' | head -n 5)
if [ "\$live" = "0 0 0" ] && [ -z "\$bad" ]; then
    result soak_kernel_log PASS "no DMA-BUF export, attachment or import alive (module_live \$live); no driver warning or error, no kernel warning in \$(grep -c . /tmp/kmsg) kernel log records"
else
    result soak_kernel_log FAIL "module_live \$live; \$(echo "\$bad" | tr '\n' '|')"
fi

# The module goes (no DMA-BUF holds it) and comes back; the devices work.
if rmmod cxl_accel && insmod /cxl/cxl_accel.ko; then
    for d in cxl-accel0 cxl-accel1; do
        /cxl/cxl-accel-tests -d /dev/\$d -p after_soak.\$d. -t identify -t copy_roundtrip \
            -t alloc_many -t stats || RC=1
    done
    rmmod cxl_accel || result soak_unload FAIL "second rmmod failed"
else
    result soak_unload FAIL "rmmod/insmod after the soak failed"
fi
exit \$RC
EOS
set +e
"$REPO/ci/run-guest.sh" --devices 2 --timeout $((SOAK + 300)) --daemon "$HERE/killing-daemon" \
    --module virtio_dma_buf --log "$TMP/run.log" --console "$TMP/console" \
    --add "$REPO/guest-driver/cxl_accel.ko:/cxl/cxl_accel.ko" \
    --add "$GUEST_PROGS/cxl-accel-tests:/cxl/cxl-accel-tests" \
    --add "$GUEST_PROGS/hmm-tests:/cxl/hmm-tests" \
    --add "$GUEST_PROGS/dmabuf-tests:/cxl/dmabuf-tests" \
    --add "$GUEST_SCRIPTS/guest-lib.sh:/cxl/guest-lib.sh" \
    --script "$TMP/guest.sh" "$@" >"$TMP/out" 2>&1
rc=$?
set -e
grep -vE '^[0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?$' "$TMP/out" || true
# per device: the daemon logs follow "===== daemonN.log" in the saved log
counts=$(awk '/^===== daemon[0-9]+\.log/ { d = $2 }
    /killing-daemon: SIGKILL worker/ { k[d]++ }
    /worker pid .* started \(resuming\)/ { r[d]++ }
    END { printf "%d %d %d %d", k["daemon0.log"], k["daemon1.log"], r["daemon0.log"], r["daemon1.log"] }' \
    "$TMP/run.log")
read -r k0 k1 r0 r1 <<<"$counts"
kills=$((k0 + k1))
summary=$(tail -n 1 "$TMP/out")
skipped=0
if [[ "$summary" =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed(,\ ([0-9]+)\ skipped)?$ ]]; then
    passed=${BASH_REMATCH[1]}
    failed=${BASH_REMATCH[2]}
    skipped=${BASH_REMATCH[4]:-0}
else
    passed=0
    failed=1
fi
echo "host: $kills workers killed ($k0 on device 0, $k1 on device 1, every ${INTERVAL} s), $((r0 + r1)) resumed by the supervisor; soak ${SOAK} s"
if [ "$rc" = 0 ] && { [ "$k0" -lt "$KILLS" ] || [ "$k1" -lt "$KILLS" ]; }; then
    echo "host: expected $KILLS kills per device, the guest finished first"
    rc=1
    failed=$((failed + 1))
fi
if [ "$rc" != 0 ]; then
    grep -E 'supervisor|resumed|ERROR|panick' "$TMP/run.log" | tail -n 30 || true
fi
echo "$passed passed, $failed failed, $skipped skipped; $kills kills survived"
exit $rc
