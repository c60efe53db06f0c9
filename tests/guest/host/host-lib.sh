# SPDX-License-Identifier: GPL-2.0
# Shared prologue of the host-side guest runs (tests/guest/host/run-*.sh,
# tests/kernel/run-hmm-tests.sh), sourced: HERE (the calling script's
# directory), REPO, ci/lib.sh (CACHE, die, log) and the guest set-up it loads
# (QEMU, guest kernel, KDIR), DAEMON, and the driver and the test programs
# built for that guest kernel: GUEST_PROGS (the built programs) and
# GUEST_SCRIPTS (the scripts that run inside the guest).
# shellcheck shell=bash
HERE=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
# shellcheck disable=SC2034 # used by the scripts that source this
GUEST_PROGS=$REPO/tests/guest/progs/out
# shellcheck disable=SC2034
GUEST_SCRIPTS=$REPO/tests/guest/scripts
# shellcheck source=ci/lib.sh
. "$REPO/ci/lib.sh"
load_env
# shellcheck disable=SC2034 # used by the scripts that source this
DAEMON=${CXL_ACCEL_DAEMON:-$REPO/target/release/cxl-accel}
build_driver "$REPO"
make -s -C "$REPO/tests/guest/progs"
