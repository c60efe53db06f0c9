# SPDX-License-Identifier: GPL-2.0
# shellcheck shell=bash
# Sourced by the host-side daemon wrappers (killing-daemon, stalling-daemon).

# wait_for_console FILE PATTERN: poll the guest console FILE until a line has
# PATTERN, for at most 300 s; returns 1 if it never came.
wait_for_console() {
    local t
    for ((t = 0; t < 3000; t++)); do
        grep -q -- "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}
