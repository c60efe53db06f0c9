#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
#
# Runs COMMAND (default: ci/setup.sh) and fails when /etc/apt is not as it
# was before: every file, link and directory with its mode, owner and
# contents (ci/lib.sh etc_apt_state). The set-up reads extra Debian suites
# through private apt configurations in its cache and must never change the
# host's. ci/test.sh makes the same check around everything it runs.
#
# Usage: ci/etc-apt-check.sh [COMMAND [ARGS...]]
#   e.g. CXL_ACCEL_CACHE=$(mktemp -d) ci/etc-apt-check.sh ci/setup.sh --kernel 7.3
#   (a fresh cache: every download and private apt index made anew)
# CXL_ACCEL_ETC_APT: check another directory (for tests).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=ci/lib.sh
. "$HERE/lib.sh"

case "${1:-}" in
-h | --help)
    script_help "$0" 3
    exit 0
    ;;
esac
[ $# -gt 0 ] || set -- "$HERE/setup.sh"

BEFORE=$(mktemp)
AFTER=$(mktemp)
trap 'rm -f "$BEFORE" "$AFTER"' EXIT
etc_apt_state >"$BEFORE"
rc=0
"$@" || rc=$?
etc_apt_state >"$AFTER"
if ! diff -u "$BEFORE" "$AFTER" >&2; then
    echo "etc-apt-check: ${CXL_ACCEL_ETC_APT:-/etc/apt} changed while running: $*" >&2
    exit 1
fi
echo "etc-apt-check: ${CXL_ACCEL_ETC_APT:-/etc/apt} unchanged ($(wc -l <"$AFTER") entries) after: $* (exit status $rc)"
exit "$rc"
