# SPDX-License-Identifier: GPL-2.0
# Shared prologue of the host-side guest runs (tests/guest/run-*.sh), sourced:
# HERE, REPO, ci/lib.sh (CACHE, die, log) and the guest set-up it loads
# (QEMU, guest kernel, KDIR), DAEMON, and the driver and the test programs
# built for that guest kernel.
# shellcheck shell=bash
HERE=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=ci/lib.sh
. "$REPO/ci/lib.sh"
load_env
# shellcheck disable=SC2034 # used by the scripts that source this
DAEMON=${CXL_ACCEL_DAEMON:-$REPO/target/release/cxl-accel}
build_driver "$REPO"
make -s -C "$REPO/tests/guest"
