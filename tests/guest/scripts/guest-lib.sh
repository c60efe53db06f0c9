# SPDX-License-Identifier: GPL-2.0
# Shared prologue of the guest-side scripts (busybox sh), sourced: RESULT
# lines, where the test files are, the cxl-accel devices and their nodes.
# The host puts it at /cxl/guest-lib.sh (ci/run-guest.sh --add); a script
# loads it with
#   GL=$(dirname "$0")/guest-lib.sh; [ -f "$GL" ] || GL=/cxl/guest-lib.sh
#   . "$GL"
# shellcheck shell=sh

RC=${RC:-0}
# the calling script's directory: test files are looked for there first
GUEST_DIR=${GUEST_DIR:-$(cd "$(dirname "$0")" && pwd)}

# result NAME PASS|FAIL|SKIP DETAIL: one RESULT line; a FAIL makes RC 1
result() {
    echo "RESULT $1 $2 $3"
    [ "$2" != FAIL ] || RC=1
}

# find_file NAME [DIR...]: NAME next to the calling script, in /cxl, in the
# DIRs, else in PATH; prints its path, or nothing
find_file() {
    _ff=$1
    shift
    for _fd in "$GUEST_DIR" /cxl "$@"; do
        if [ -f "$_fd/$_ff" ]; then
            echo "$_fd/$_ff"
            return 0
        fi
    done
    command -v "$_ff" 2>/dev/null
}

# the names of the bound devices (cxl-accelN), one a line
device_list() {
    for _s in /sys/class/cxl-accel/*; do
        [ -e "$_s/dev" ] && basename "$_s"
    done
}

# /dev nodes for every bound device (the initramfs has no devtmpfs rules)
ensure_nodes() {
    for _s in /sys/class/cxl-accel/*; do
        [ -e "$_s/dev" ] || continue
        _n=$(basename "$_s")
        if [ ! -e "/dev/$_n" ]; then
            _mm=$(cat "$_s/dev")
            mknod "/dev/$_n" c "${_mm%%:*}" "${_mm##*:}"
        fi
    done
}

# how many virtio functions have our device ID (21 = 0x0015)
expected_devices() {
    _e=0
    for _v in /sys/bus/virtio/devices/*; do
        [ -f "$_v/device" ] && [ "$(cat "$_v/device")" = 0x0015 ] && _e=$((_e + 1))
    done
    echo $_e
}

# wait_for_line FILE PATTERN TENTHS: poll until FILE has a line with PATTERN,
# for at most TENTHS tenths of a second
wait_for_line() {
    _w=0
    while ! grep -q "$2" "$1" 2>/dev/null && [ $_w -lt "$3" ]; do
        sleep 0.1
        _w=$((_w + 1))
    done
}

# whole seconds since boot
uptime_s() {
    cut -d. -f1 /proc/uptime
}
