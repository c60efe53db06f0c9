#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Guest side of the NUMA attach mode tests (busybox sh): device memory is a
# CPU-less NUMA node instead of an ivshmem BAR. Boot it from the host with
#
#   ci/run-guest.sh --attach numa --devices 2 \
#       --insmod guest-driver/cxl_accel.ko:/lib/modules/extra/ \
#       --add tests/guest/progs/out/hmm-tests:/bin/ --add tests/guest/progs/out/hmm-bench:/bin/ \
#       --add tests/guest/scripts/guest-lib.sh:/cxl/guest-lib.sh \
#       --script tests/guest/scripts/run-numa.sh
#
# Checks that the driver bound every device without an ivshmem function,
# runs the NUMA tests of hmm-tests (move_pages/mbind to the device node,
# device computing on those pages) on every device and across two, the
# move_pages benchmark (HMM_BENCH_ARGS, default --quick), then unloads.
# Prints "RESULT <name> PASS|FAIL <detail>".

GL=$(dirname "$0")/guest-lib.sh
[ -f "$GL" ] || GL=/cxl/guest-lib.sh
# shellcheck source=tests/guest/scripts/guest-lib.sh
. "$GL"

expected=$(expected_devices)
ensure_nodes
devs=$(device_list)
n=$(echo "$devs" | grep -c .)
detail=
for d in $devs; do
    s=/sys/class/cxl-accel/$d
    detail="$detail $d: node $(cat "$s/numa_node") at $(cat "$s/devmem_gpa"), mem_function $(cat "$s/mem_function");"
done
if [ "$n" = "$expected" ] && [ "$n" -gt 0 ]; then
    result numa.bind PASS "$n device(s) bound in NUMA mode:$detail"
else
    result numa.bind FAIL "$n device(s) bound, $expected virtio function(s)"
    dmesg | tail -n 20
    exit 1
fi
# automatic NUMA balancing would move pages off the device node behind the
# tests' back: they place pages explicitly
[ -w /proc/sys/kernel/numa_balancing ] && echo 0 >/proc/sys/kernel/numa_balancing
echo "----- NUMA nodes"
for nd in /sys/devices/system/node/node*; do
    echo "$(basename "$nd"): cpus '$(cat "$nd/cpulist")' $(grep MemTotal "$nd/meminfo" | sed 's/.*MemTotal://')"
done

# shellcheck disable=SC2086
set -- $devs
for d in $devs; do
    /bin/hmm-tests -d "/dev/$d" -p "numa.$d." -t numa_info -t numa_move_pages -t numa_mbind || RC=1
done
if [ $# -ge 2 ]; then
    /bin/hmm-tests -d "/dev/$1" -P "/dev/$2" -p "numa." -t numa_peer || RC=1
fi
# shellcheck disable=SC2086
/bin/hmm-bench -d "/dev/$1" ${HMM_BENCH_ARGS:---quick} || RC=1

if rmmod cxl_accel && [ ! -d /sys/class/cxl-accel ]; then
    result numa.unload PASS "rmmod"
else
    result numa.unload FAIL "rmmod failed"
fi
dmesg | grep -iE 'cxl.accel|cxl_accel' | tail -n 20 | sed 's/^/  dmesg: /'
exit "$RC"
