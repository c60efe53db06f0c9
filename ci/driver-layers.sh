#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# The guest driver's layers (guest-driver/README.md, "Files, in layers"),
# checked on its objects as built for each guest kernel of the set-up
# (Debian's 6.12 and 7.3: each compiles parts the other leaves out), in a
# copy of guest-driver/ so that the tree's own build is left alone; then
# the checker's own self-test. Fails on a call to a higher layer, a file in
# no layer, or a symbol declared outside its file's header.
# Usage: ci/driver-layers.sh
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=ci/lib.sh
. "$HERE/lib.sh"

case "${1:-}" in
-h | --help)
    script_help "$0" 3
    exit 0
    ;;
esac

python3 "$HERE/driver-layers.py" --self-test
W=$(mktemp -d "${TMPDIR:-/tmp}/cxl-accel-layers.XXXXXX")
trap 'rm -rf "$W"' EXIT
rc=0
for env in "$CACHE/env.sh" "$CACHE/env-7.3.sh"; do
    [ -f "$env" ] || continue
    (
        # shellcheck source=/dev/null
        . "$env"
        rm -rf "$W/guest-driver"
        cp -r "$ROOT/guest-driver" "$W/"
        make -s -C "$W/guest-driver" clean >/dev/null 2>&1 || true
        log "driver layers: built for $GUEST_KVER"
        build_driver "$W"
        python3 "$HERE/driver-layers.py" --src "$ROOT/guest-driver" "$W/guest-driver"
    ) || rc=1
done
exit "$rc"
