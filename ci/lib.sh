# Shared helpers for the ci/ scripts (sourced, not executed).
# shellcheck shell=bash

# shellcheck disable=SC2034 # used by the scripts that source this
CACHE="${CXL_ACCEL_CACHE:-$HOME/.cache/cxl-accel}"
# The guest set-up (QEMU, guest kernel, its headers and modules) that
# ci/setup.sh wrote; CXL_ACCEL_ENV picks another one, e.g. the debug
# kernel's of ci/debug-kernel.sh.
ENV_FILE="${CXL_ACCEL_ENV:-$CACHE/env.sh}"

die() {
    echo "$*" >&2
    exit 1
}

log() {
    echo "[$(date +%H:%M:%S)] $*" >&2
}

# Source the guest set-up (exports QEMU, GUEST_KERNEL, KDIR, ...).
load_env() {
    [ -f "$ENV_FILE" ] || die "$ENV_FILE is missing: run ci/setup.sh first"
    # shellcheck source=/dev/null
    . "$ENV_FILE"
}

now() {
    date +%s.%N
}

# Elapsed seconds since $1 (from `now`), one decimal.
elapsed() {
    awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'
}

# "install ok installed" is the only state that means a usable package
# ("unknown ok not-installed" is what dpkg reports for removed ones).
pkg_installed() {
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" = "install ok installed" ]
}
