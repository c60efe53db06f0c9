#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# NUMA attach mode: device memory as a CPU-less NUMA node of guest RAM, two
# devices, QEMU as the socket server (the daemons connect); the guest side is
# tests/guest/scripts/run-numa.sh. Extra arguments go to ci/run-guest.sh.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=ci/lib.sh
. "$HERE/lib.sh"
cd "$ROOT"

load_env
[ -x target/release/cxl-accel ] || cargo build --release --locked
build_driver "$ROOT"
make -s -C tests/guest/progs >/dev/null
exec "$HERE/run-guest.sh" --attach numa --socket-mode client --devices 2 --timeout 600 \
    --insmod guest-driver/cxl_accel.ko:/lib/modules/extra/ \
    --add tests/guest/progs/out/hmm-tests:/bin/ --add tests/guest/progs/out/hmm-bench:/bin/ \
    --add tests/guest/scripts/guest-lib.sh:/cxl/guest-lib.sh \
    --script tests/guest/scripts/run-numa.sh "$@"
