# Shared helpers for the ci/ scripts (sourced, not executed).
# shellcheck shell=bash

# shellcheck disable=SC2034 # used by the scripts that source this
CACHE="${CXL_ACCEL_CACHE:-$HOME/.cache/cxl-accel}"

die() {
    echo "$*" >&2
    exit 1
}

log() {
    echo "[$(date +%H:%M:%S)] $*" >&2
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
