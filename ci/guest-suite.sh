#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Guest end-to-end suite: builds the driver against the guest kernel headers and the
# static guest test programs, boots a guest with two devices, runs every guest test
# (one RESULT line each) and fails on any failure or kernel warning.
# Extra arguments go to ci/run-guest.sh (e.g. --accel kvm, --log FILE).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=ci/lib.sh
. "$HERE/lib.sh"
cd "$ROOT"

load_env
[ -x target/release/cxl-accel ] || cargo build --release --locked

log "== guest driver (KDIR=$KDIR)"
build_driver "$ROOT"
log "== guest test programs"
make -s -C tests/guest/progs >/dev/null

ADD=()
for f in tests/guest/progs/out/* tests/guest/scripts/stress-guest.sh; do
    ADD+=(--add "$f:/bin/")
done
ADD+=(--add tests/guest/scripts/guest-lib.sh:/cxl/guest-lib.sh)	# the scripts' helpers
exec "$HERE/run-guest.sh" --devices 2 --quiet --timeout 1200 \
    --insmod guest-driver/cxl_accel.ko:/lib/modules/extra/ \
    "${ADD[@]}" --script tests/guest/scripts/run-all.sh "$@"
