#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Host side: the kernel's own HMM selftests, unmodified, against cxl-accel.
# Builds tools/testing/selftests/mm/hmm-tests.c of the guest kernel's own
# version statically, from that kernel's Debian source (ci/setup.sh
# --linux-source: 6.12's source tarball, 7.3's linux-source-7.3 package;
# cached outside the repository, never vendored), with the helpers its
# Makefile links when it uses them (vm_util.c, hugepage_settings.c) and in
# the userland that builds modules for that kernel (KMAKE: the host, or the
# trixie root for 7.3). Then boots a guest with two devices on the kernel of
# the loaded set-up (CXL_ACCEL_ENV), loads the driver with test_hmm=1
# (/dev/hmm_dmirror0..3) and runs them (hmm-tests-guest.sh): one RESULT line
# per test, SKIP only for the tests on hmm-tests.skip, with the reason.
#
# Usage: tests/kernel/run-hmm-tests.sh [ci/run-guest.sh options]
set -euo pipefail

# shellcheck source=tests/guest/host/host-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../guest/host/host-lib.sh"

# the kernel's version (6.12.95 of 6.12.95+deb12-amd64) and series
VER=${GUEST_KVER%%[+-]*}
SERIES=$(echo "$VER" | cut -d. -f1-2)
case "$SERIES" in
7.3) run_setup --kernel 7.3 --linux-source ;;
*) run_setup --linux-source ;;
esac
SRC=$CACHE/linux-src/linux-$VER
if [ ! -e "$SRC/.parts" ]; then
    # a kernel of our own (GUEST_KERNEL=): the Debian source of its series
    SRC=$(printf '%s\n' "$CACHE/linux-src/linux-$SERIES".*/.parts | sort -V | tail -n 1)
    SRC=${SRC%/.parts}
    [ -e "$SRC/.parts" ] ||
        die "run-hmm-tests: no Linux $SERIES source in $CACHE/linux-src (ci/setup.sh --linux-source, with --kernel 7.3 for 7.3)"
    log "no Linux $VER source: using $(basename "$SRC")'s selftests"
fi
SRCVER=${SRC##*/linux-}
BUILD=$CACHE/hmm-selftest/$SRCVER
if [ ! -x "$BUILD/hmm-tests" ]; then
    MM=$SRC/tools/testing/selftests/mm
    helpers=()
    if grep -q 'vm_util\.h' "$MM/hmm-tests.c"; then
        # shellcheck disable=SC2016 # make's syntax, not ours
        read -ra helpers < <(sed -n 's/^\$(TEST_GEN_FILES):[[:space:]]*//p' "$MM/Makefile")
    fi
    log "building hmm-tests of Linux $SRCVER${helpers[*]:+ (with ${helpers[*]})}"
    mkdir -p "$BUILD"
    # KMAKE is "make" or "<runner> make": the runner's compiler and C library
    runner=${KMAKE:-make}
    runner=${runner%make}
    # shellcheck disable=SC2086 # the runner is a command with its arguments
    (cd "$MM" && $runner gcc -static -O2 -I.. -I../../../.. -I../../../../tools/include \
        -o hmm-tests.tmp hmm-tests.c "${helpers[@]}" -lpthread) ||
        die "run-hmm-tests: hmm-tests of Linux $SRCVER does not build"
    mv "$MM/hmm-tests.tmp" "$BUILD/hmm-tests"
fi

exec "$REPO/ci/run-guest.sh" --devices 2 --quiet --timeout 1200 \
    --insmod "$REPO/guest-driver/cxl_accel.ko:/lib/modules/extra/" \
    --add "$BUILD/hmm-tests:/cxl/kernel-hmm-tests" \
    --add "$HERE/hmm-tests.skip:/cxl/hmm-tests.skip" \
    --script "$HERE/hmm-tests-guest.sh" "$@"
