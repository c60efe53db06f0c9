#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Guest side of the seeded random stress (tests/guest/progs/mm-stress.c): runs it on
# the first two cxl-accel devices (or one) for CXLA_STRESS_SECONDS (default 60)
# with CXLA_STRESS_SEED (default: a fresh one, printed), then requires that
# nothing was left behind: every migration pool empty, no device mirror, no
# command still quarantined. Used by run-all.sh (the CI form) and run-stress.sh
# (long runs by hand). Prints "RESULT mm_stress ..." and
# "RESULT mm_stress_leaks ...".
GL=$(dirname "$0")/guest-lib.sh
[ -f "$GL" ] || GL=/cxl/guest-lib.sh
# shellcheck source=tests/guest/scripts/guest-lib.sh
. "$GL"
STRESS=$(find_file mm-stress)
if [ -z "$STRESS" ]; then
    result mm_stress FAIL "mm-stress not found"
    exit 1
fi
# shellcheck disable=SC2046 # device names have no blanks
set -- $(device_list)
if [ $# = 0 ]; then
    result mm_stress FAIL "no cxl-accel device"
    exit 1
fi
# shellcheck disable=SC2086
"$STRESS" -t "${CXLA_STRESS_SECONDS:-60}" -n "${CXLA_STRESS_PROCS:-4}" \
    ${CXLA_STRESS_SEED:+-s "$CXLA_STRESS_SEED"} ${CXLA_STRESS_EXCLUDE:+-x "$CXLA_STRESS_EXCLUDE"} \
    -d "/dev/$1" ${2:+-P "/dev/$2"} ${CXLA_STRESS_ARGS:-} || RC=1

# Pages, mirrors and commands of exited processes go asynchronously: a
# command given up on (quarantined) keeps its pages and its SVM mirror until
# the device hands it back, so all three are read once nothing is pending
# any more (or after 30 s).
settled() { # reads used, mirrors, quar of $d; true when all three are 0
    used=$(sed -n 's/^pool_pages_used //p' "$d/migration")
    mirrors=$(sed -n 's/^svm_mirrors //p' "$d/migration")
    quar=$(cat "$d/quarantined")
    [ "$used" = 0 ] && [ "$mirrors" = 0 ] && [ "$quar" = 0 ]
}
leaks=
for dev in "$@"; do
    d=/sys/class/cxl-accel/$dev
    i=0
    until settled || [ $i -ge 300 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    if [ "$used" != 0 ] || [ "$mirrors" != 0 ] || [ "$quar" != 0 ]; then
        leaks="$leaks $dev: $used pool pages, $mirrors mirrors, $quar quarantined;"
        # who still holds the device open (nobody should: every process exited)
        for f in /proc/[0-9]*/fd/*; do
            case $(readlink "$f" 2>/dev/null) in
            */"$dev") echo "  $dev still open: $f" ;;
            esac
        done
    fi
    echo "  $dev: pool pages in use $used, mirrors $mirrors, commands quarantined $quar (after $((i / 10)).$((i % 10)) s)"
    # which copy paths the run went through (copy_mode switches between them)
    echo "  $dev: $(grep -E '^(migrated_to_dev|migrated_to_ram|evicted|copy_commands|copy_failures|cpu_copied) ' "$d/migration" | tr '\n' ' ')"
done
if [ -z "$leaks" ]; then
    result mm_stress_leaks PASS "every migration pool empty, no device mirror, no quarantined command"
else
    result mm_stress_leaks FAIL "${leaks# }"
fi
exit "$RC"
