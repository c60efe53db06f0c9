#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Guest side of ci/libvirt-demo.sh: the demo of ci/demo.sh on every cxl-accel device,
# each line tagged for the host. With cxlaccel.devices=N on the kernel command line the
# guest must see exactly N devices.
want=
read -r cmdline </proc/cmdline
for arg in $cmdline; do
    case "$arg" in
    cxlaccel.devices=*) want=${arg#cxlaccel.devices=} ;;
    esac
done
n=0
rc=0
for dev in /dev/cxl-accel[0-9]*; do
    [ -e "$dev" ] || continue
    n=$((n + 1))
    name=${dev#/dev/}
    if /bin/cxl-accel-demo "$dev" 16 >/tmp/demo.out 2>&1; then
        status=PASS
    else
        status="FAIL exit status $?"
        rc=1
    fi
    sed "s/^/DEMO| /" /tmp/demo.out
    echo "RESULT demo-$name $status"
done
if [ -n "$want" ]; then
    if [ "$n" = "$want" ]; then
        echo "RESULT devices PASS $n"
    else
        echo "RESULT devices FAIL $n devices, expected $want"
        rc=1
    fi
fi
exit $rc
