#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# Guest side of ci/demo.sh: a short tour of device 0, each line tagged for the host.
GL=$(dirname "$0")/guest-lib.sh
[ -f "$GL" ] || GL=/cxl/guest-lib.sh
# shellcheck source=tests/guest/scripts/guest-lib.sh
. "$GL"
DEMO=$(find_file cxl-accel-demo)
# the host's memcpy, measured by ci/demo.sh before the boot: the DMA figures' yardstick
HOST=$(tr ' ' '\n' </proc/cmdline | sed -n 's/^cxlaccel.host_memcpy=//p')
"${DEMO:-cxl-accel-demo}" ${HOST:+--host-memcpy "$HOST"} /dev/cxl-accel0 32 >/tmp/demo.out 2>&1
rc=$?
sed 's/^/DEMO| /' /tmp/demo.out
if [ $rc = 0 ]; then
    result demo PASS "$(grep -c . /tmp/demo.out) lines"
else
    result demo FAIL "exit status $rc"
fi
exit "$RC"
