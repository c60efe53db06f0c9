#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Host side: the kernel's own HMM selftests, unmodified, against cxl-accel.
# Builds tools/testing/selftests/mm/hmm-tests.c statically from Debian's
# Linux source tarball (ci/setup.sh --linux-source; cached outside the
# repository, never vendored), boots a guest with two devices on the kernel
# of the loaded set-up (CXL_ACCEL_ENV), loads the driver with test_hmm=1
# (/dev/hmm_dmirror0..3) and runs them (hmm-tests-guest.sh): one RESULT
# line per test, SKIP only for the tests on hmm-tests.skip, with the reason.
#
# Usage: tests/kernel/run-hmm-tests.sh [ci/run-guest.sh options]
set -euo pipefail

# shellcheck source=tests/guest/host/host-lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../guest/host/host-lib.sh"
run_setup --linux-source
TARBALL=$(printf '%s\n' "$CACHE"/linux-src/linux_6.12.*.orig.tar.xz | sort -V | tail -n 1)
[ -f "$TARBALL" ] || die "run-hmm-tests: no Linux source tarball in $CACHE/linux-src"
VER=$(basename "$TARBALL" | sed -E 's/^linux_([0-9.]+)\.orig.*/\1/')
BUILD=$CACHE/hmm-selftest/$VER
if [ ! -x "$BUILD/hmm-tests" ]; then
    log "building hmm-tests from $(basename "$TARBALL")"
    rm -rf "$BUILD"
    mkdir -p "$BUILD/src"
    tar -xf "$TARBALL" -C "$BUILD/src" --strip-components=1 \
        "linux-$VER/tools/testing/selftests/mm/hmm-tests.c" \
        "linux-$VER/tools/testing/selftests/kselftest_harness.h" \
        "linux-$VER/tools/testing/selftests/kselftest.h" \
        "linux-$VER/lib/test_hmm_uapi.h" "linux-$VER/mm/gup_test.h" \
        "linux-$VER/tools/include"
    (cd "$BUILD/src/tools/testing/selftests/mm" &&
        gcc -static -O2 -I.. -I../../../.. -I../../../../tools/include \
            -o "$BUILD/hmm-tests.tmp" hmm-tests.c -lpthread) ||
        die "run-hmm-tests: hmm-tests does not build"
    mv "$BUILD/hmm-tests.tmp" "$BUILD/hmm-tests"
fi

exec "$REPO/ci/run-guest.sh" --devices 2 --quiet --timeout 1200 \
    --insmod "$REPO/guest-driver/cxl_accel.ko:/lib/modules/extra/" \
    --add "$BUILD/hmm-tests:/cxl/kernel-hmm-tests" \
    --add "$HERE/hmm-tests.skip:/cxl/hmm-tests.skip" \
    --script "$HERE/hmm-tests-guest.sh" "$@"
