#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# The CXL suite: boots two devices as CXL Type-2 endpoints (--attach cxl,
# the daemon as a vfio-user server under QEMU's CXL host bridge and root
# port) on a kernel with the Type-2 accelerator API (7.3), and runs
# tests/guest/scripts/cxl-guest.sh: the memdevs, decoders and regions the CXL
# core made of them, the topology asked for, teardown and re-probe, MSI-X per
# queue; then the sample Type-2 driver (samples/cxl-type2) in place of ours.
#
# Usage: tests/guest/host/run-cxl.sh one|each [ci/run-guest.sh options]
#   one   both devices under one host bridge (two root ports)
#   each  each device under a host bridge of its own
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
case "${1:-}" in
one | each) ;;
*) echo "usage: $0 one|each [ci/run-guest.sh options]" >&2; exit 2 ;;
esac
hbs=$1
shift
# the sample Type-2 driver, built for the guest kernel like ours
# shellcheck source=ci/lib.sh
. "$ROOT/ci/lib.sh"
load_env
cd "$ROOT"
# shellcheck disable=SC2086 # KMAKE is a command with its arguments
${KMAKE:-make} -s -C samples/cxl-type2 KDIR="$KDIR" >/dev/null
exec "$ROOT/ci/guest-suite.sh" --attach cxl --cxl-host-bridges "$hbs" --timeout 600 \
    --add "$ROOT/samples/cxl-type2/cxl_type2_sample.ko:/cxl/" \
    --script "$ROOT/tests/guest/scripts/cxl-guest.sh" "$@"
