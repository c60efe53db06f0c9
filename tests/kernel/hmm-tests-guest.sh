#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Guest side of tests/kernel/run-hmm-tests.sh: loads the driver with its
# test_hmm interface (/dev/hmm_dmirror0..3 on cxl-accel0 and 1), runs the
# kernel's unmodified hmm-tests once, keeps its KTAP output in the console
# log between HMM-KTAP-BEGIN and HMM-KTAP-END, and turns every test into one
# line "RESULT kernel.<fixture>.<variant>.<test> PASS|FAIL|SKIP <detail>".
# Tests of the skip list (hmm-tests.skip: a test name, or a variant) are
# left out when their condition holds ("no-private" on kernels without
# device-private memory, "no-gup-test" on kernels without gup_test) and
# reported SKIP with its reason; a test that skips itself otherwise fails.
D=$(cd "$(dirname "$0")" && pwd)
HMM=$D/kernel-hmm-tests
SKIPLIST=$D/hmm-tests.skip

rmmod cxl_accel 2>/dev/null
if ! insmod /lib/modules/extra/cxl_accel.ko test_hmm=1; then
    echo "RESULT kernel.hmm.load FAIL insmod cxl_accel.ko test_hmm=1"
    exit 1
fi
private=no
grep -q '^mode coherent private' /sys/class/cxl-accel/cxl-accel0/migration && private=yes
gup=no
[ -e /sys/kernel/debug/gup_test ] && gup=yes
# hugetlbfs pages for anon_write_hugetlbfs
echo 8 >/proc/sys/vm/nr_hugepages

# every fixture.variant.test, from the table "-l" prints
"$HMM" -l 2>&1 | awk '
function flush(  vi, ti) {
	for (vi = 1; vi <= nv; vi++)
		for (ti = 1; ti <= nt; ti++)
			print f "." v[vi] "." t[ti]
	f = ""; nv = 0; nt = 0
}
/^-/ { flush(); next }
/^#/ || NF == 0 { next }
{
	fx = substr($0, 1, 21); vx = substr($0, 22, 26); tx = substr($0, 48)
	gsub(/ /, "", fx); gsub(/ /, "", vx); gsub(/ /, "", tx)
	if (fx != "") f = fx
	if (vx != "") v[++nv] = vx
	if (tx != "") t[++nt] = tx
}
END { flush() }' >/tmp/hmm-all

# what the skip list leaves out here: harness options, and name|reason
args=
: >/tmp/hmm-left-out
while read -r name when reason; do
    case "$name" in '' | '#'*) continue ;; esac
    case "$when" in
    no-private) [ $private = no ] || continue ;;
    no-gup-test) [ $gup = no ] || continue ;;
    *) continue ;;
    esac
    case "$name" in
    hmm_device_* | hmm2_device_*) args="$args -V $name" ;;
    *) args="$args -T $name" ;;
    esac
    echo "$name|$reason" >>/tmp/hmm-left-out
done <"$SKIPLIST"

echo "HMM-KTAP-BEGIN private=$private gup_test=$gup"
# shellcheck disable=SC2086
"$HMM" $args >/tmp/hmm-ktap 2>&1
hmm_rc=$?
cat /tmp/hmm-ktap
echo "HMM-KTAP-END rc=$hmm_rc"

rc=0
while read -r test; do
    variant=$(echo "$test" | cut -d. -f2)
    name=$(echo "$test" | cut -d. -f3)
    reason=$(grep -e "^$name|" -e "^$variant|" /tmp/hmm-left-out | head -n 1 | cut -d'|' -f2)
    if [ -n "$reason" ]; then
        echo "RESULT kernel.$test SKIP $reason"
        continue
    fi
    line=$(grep -E "^(not )?ok [0-9]+ $test( |\$)" /tmp/hmm-ktap | head -n 1)
    case "$line" in
    "") echo "RESULT kernel.$test FAIL no KTAP line (crashed?)"; rc=1 ;;
    *'# SKIP'*)	# only the list may skip
        echo "RESULT kernel.$test FAIL skipped itself (${line#*# SKIP }), not on the skip list"
        rc=1 ;;
    'not ok'*) echo "RESULT kernel.$test FAIL $(grep -E "^# hmm-tests.c:[0-9]+:$name:" /tmp/hmm-ktap | head -n 1)"; rc=1 ;;
    *) echo "RESULT kernel.$test PASS -" ;;
    esac
done </tmp/hmm-all
[ "$(grep -c . /tmp/hmm-all)" -gt 0 ] || { echo "RESULT kernel.hmm.list FAIL hmm-tests -l listed nothing"; rc=1; }
rmmod cxl_accel || rc=1
exit $rc
