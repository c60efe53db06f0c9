#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
# Guest side of ci/demo.sh: a short tour of device 0, each line tagged for the host.
/bin/cxl-accel-demo /dev/cxl-accel0 32 >/tmp/demo.out 2>&1
rc=$?
sed 's/^/DEMO| /' /tmp/demo.out
if [ $rc = 0 ]; then echo "RESULT demo PASS"; else echo "RESULT demo FAIL exit status $rc"; fi
exit $rc
