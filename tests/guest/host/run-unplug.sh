#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Host side: hot-unplug of a device under load. Boots a guest with two
# devices, each in its own hot-pluggable slot (ci/run-guest.sh --hotplug)
# and a QMP monitor (--monitor). In the guest, unplug-tests holds a mapped
# buffer, a DMA-BUF of device 0 imported by device 1 (and one the other way
# round), pages migrated to device 0's memory and command loops, and prints
# UNPLUG-READY. This script waits for that line on the console (run-guest.sh
# --console), then unplug-host.py removes device 0 through QMP (device_del
# cxlacc0: QEMU ejects the whole slot, cxlacc0-bar included, once the guest
# let go of it), drops its chardev and memory backend, checks QEMU's events
# and the daemons, and says GO on the guest's second serial port. The guest
# checks the errors its processes got, the migrated data, the surviving
# device, leak counters, the kernel log, unload and reload.
#
# Usage: tests/guest/host/run-unplug.sh [ci/run-guest.sh options]
# The host's checks print "RESULT host_<name> PASS|FAIL" lines of their own.
# UNPLUG_ID=cxlacc0-bar deletes function 1 instead (QEMU ejects the slot
# either way). Native PCIe hotplug (pciehp) instead of ACPI:
#   tests/guest/host/run-unplug.sh --qemu-arg -global \
#       --qemu-arg ICH9-LPC.acpi-pci-hotplug-with-bridge-support=off
set -euo pipefail

# shellcheck source=tests/guest/host/host-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/host-lib.sh"
READY_WAIT=${READY_WAIT:-300}	# s until the guest is set up
DELETE_WAIT=${DELETE_WAIT:-60}	# s from device_del to QEMU's DEVICE_DELETED
UNPLUG_ID=${UNPLUG_ID:-cxlacc0}	# device_del target


TMP=$(mktemp -d)
RG_PID=
cleanup() {
    if [ -n "$RG_PID" ]; then # run-guest.sh stops QEMU and the daemons on TERM
        pkill -TERM -P "$RG_PID" 2>/dev/null || true
        wait "$RG_PID" 2>/dev/null || true
    fi
    rm -rf "$TMP"
}
trap cleanup EXIT

cat >"$TMP/guest.sh" <<'EOS'
#!/bin/sh
. /cxl/guest-lib.sh
iomem_regions() { grep -c ' : cxl-accel$' /proc/iomem; }

insmod /cxl/cxl_accel.ko cmd_timeout_ms=3000 || { result unplug_load FAIL insmod; exit 1; }
# device index 0 (QEMU id cxlacc0) goes away, 1 stays
gone= keep=
for s in /sys/class/cxl-accel/*; do
    case "$(cat "$s/device_index" 2>/dev/null)" in
    0) gone=$(basename "$s") ;;
    1) keep=$(basename "$s") ;;
    esac
done
if [ -z "$gone" ] || [ -z "$keep" ]; then
    result unplug_load FAIL "devices with index 0 and 1 not found: $(ls /sys/class/cxl-accel)"
    exit 1
fi
gone_mem=$(cat "/sys/class/cxl-accel/$gone/mem_function")
gone_vdev=$(basename "$(readlink "/sys/class/cxl-accel/$gone/device")")
gone_pci=$(basename "$(readlink -f "/sys/bus/virtio/devices/$gone_vdev/..")")
keep_vdev=$(basename "$(readlink "/sys/class/cxl-accel/$keep/device")")
echo "unplug: $gone = $gone_vdev on $gone_pci + $gone_mem will be removed; $keep = $keep_vdev stays"

# the host says GO on ttyS1 once it is done with its side of the removal
head -n 1 /dev/ttyS1 >/tmp/go 2>&1 &
/cxl/unplug-tests -d "/dev/$gone" -P "/dev/$keep" || RC=1
i=0
while ! grep -q GO /tmp/go && [ $i -lt 1200 ]; do sleep 0.1; i=$((i + 1)); done
grep -q GO /tmp/go || result unplug_host_go FAIL "no GO from the host on ttyS1 within 120 s"

# the whole slot is gone, the other device is not
if [ ! -e "/sys/bus/pci/devices/$gone_pci" ] && [ ! -e "/sys/bus/pci/devices/$gone_mem" ] &&
    [ ! -e "/sys/bus/virtio/devices/$gone_vdev" ] && [ -e "/sys/bus/virtio/devices/$keep_vdev" ] &&
    [ "$(iomem_regions)" = 1 ]; then
    result unplug_slot_gone PASS "$gone_pci, $gone_mem and $gone_vdev gone, one cxl-accel region left in /proc/iomem"
else
    result unplug_slot_gone FAIL "PCI: $(ls /sys/bus/pci/devices | tr '\n' ' '); virtio: $(ls /sys/bus/virtio/devices | tr '\n' ' '); $(iomem_regions) cxl-accel regions in /proc/iomem"
fi

# kernel log: the removal went through remove(), and nothing complained
bad=$(dmesg | grep -E 'nonexistent resource|still at the device|static mapping|cxl.accel.*(leak|busy)' | head -n 3)
if dmesg | grep -q "cxl_accel $gone_vdev: $gone removed" && [ -z "$bad" ]; then
    result unplug_kernel_log PASS "$(dmesg | grep -cE 'cxl.accel|cxl_accel') driver lines, removal logged, no complaint"
else
    result unplug_kernel_log FAIL "removal line missing or: $bad"
fi

# unload and reload: the survivor comes back alone, whole
refcnt=$(cat /sys/module/cxl_accel/refcnt)
if rmmod cxl_accel; then
    if [ "$(iomem_regions)" = 0 ]; then
        result unplug_unload PASS "refcnt $refcnt, no cxl-accel region left in /proc/iomem"
    else
        result unplug_unload FAIL "$(iomem_regions) cxl-accel regions in /proc/iomem after rmmod"
    fi
else
    result unplug_unload FAIL "rmmod (refcnt $refcnt)"
fi
if insmod /cxl/cxl_accel.ko; then
    n=$(ls /sys/class/cxl-accel | wc -l)
    if [ "$n" = 1 ] && [ "$(cat /sys/class/cxl-accel/cxl-accel0/device_index)" = 1 ]; then
        /cxl/unplug-tests -d /dev/cxl-accel0 -t reload || RC=1
    else
        result unplug_reload FAIL "$n devices after reload: $(ls /sys/class/cxl-accel | tr '\n' ' ')"
    fi
    rmmod cxl_accel || result unplug_reload FAIL "second rmmod"
else
    result unplug_reload FAIL "insmod after the unplug"
fi
dmesg | grep -E 'cxl.accel|cxl_accel|acpiphp|pciehp' | tail -n 20 | sed 's/^/  dmesg: /'
exit $RC
EOS

# ----------------------------------------------------------------- run

QMP_SOCK=$TMP/qmp.sock
CTL_SOCK=$TMP/ctl.sock
CONSOLE=$TMP/console.log
# cxl_accel.ko needs virtio_dma_buf (DMA-BUF export): /init loads it.
# The second serial port (ttyS1) is how the host tells the guest to go on.
(
"$REPO/ci/run-guest.sh" --devices 2 --hotplug --monitor "$QMP_SOCK" --timeout 500 \
    --qemu-arg -chardev --qemu-arg "socket,id=cxl-ctl,path=$CTL_SOCK,server=on,wait=off" \
    --qemu-arg -device --qemu-arg isa-serial,chardev=cxl-ctl,index=1 \
    --module virtio_dma_buf \
    --add "$REPO/guest-driver/cxl_accel.ko:/cxl/cxl_accel.ko" \
    --add "$GUEST_PROGS/unplug-tests:/cxl/unplug-tests" \
    --add "$GUEST_SCRIPTS/guest-lib.sh:/cxl/guest-lib.sh" \
    --script "$TMP/guest.sh" --console "$CONSOLE" "$@" | tee "$TMP/guest.out"
    exit "${PIPESTATUS[0]}"
) &
RG_PID=$!

T0=$SECONDS
while ! grep -qs '^UNPLUG-READY' "$CONSOLE"; do
    if ! kill -0 "$RG_PID" 2>/dev/null || [ $((SECONDS - T0)) -ge "$READY_WAIT" ]; then
        break
    fi
    sleep 0.1
done
HOST_RC=0
if grep -qs '^UNPLUG-READY' "$CONSOLE"; then
    "$HERE/unplug-host.py" "$QMP_SOCK" "$CTL_SOCK" "$DELETE_WAIT" "$UNPLUG_ID" |
        tee "$TMP/host.out" || HOST_RC=$?
else
    echo "RESULT host_device_del FAIL the guest never printed UNPLUG-READY (within ${READY_WAIT}s)" |
        tee "$TMP/host.out"
    HOST_RC=1
fi

RG_RC=0
wait "$RG_PID" || RG_RC=$?
RG_PID=
# One verdict line like run-guest.sh's, the host's checks included.
read -r GP _ GF _ < <(tail -n 1 "$TMP/guest.out")
[[ "$GP" =~ ^[0-9]+$ && "$GF" =~ ^[0-9]+$ ]] || { GP=0; GF=1; }
HP=$(grep -c '^RESULT host_[^ ]* PASS' "$TMP/host.out" || true)
HF=$(grep -c '^RESULT host_[^ ]* FAIL' "$TMP/host.out" || true)
[ "$HOST_RC" = 0 ] || [ "$HF" -gt 0 ] || HF=1
echo "run-unplug: run-guest rc $RG_RC, host checks rc $HOST_RC"
echo "$((GP + HP)) passed, $((GF + HF)) failed"
[ "$RG_RC" = 0 ] && [ "$HOST_RC" = 0 ]
