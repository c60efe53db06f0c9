# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# The verdict on a guest run, shared by ci/run-guest.sh and ci/libvirt-demo.sh
# (sourced, not executed).
# shellcheck shell=bash

# guest_verdict WHO WHAT: judges the guest console $CONSOLE (RESULT lines, the
# CXL-ACCEL-GUEST-DONE marker, the kernel log), prints the results and
# "N passed, N failed, N skipped" last, writes KTAP, JUnit and (after a
# failure) the logs into $RESULTS when set, and returns non-zero when the run
# failed. WHO names the runner in messages, WHAT describes the run. Also reads:
# WORK (console.txt and kernel.log go there; qemu.log and daemon*.log in it
# are reported), TIMED_OUT and TIMEOUT, QEMU_RC, DEAD_DAEMONS (indices of
# daemons that died), WALL (seconds), QUIET.
guest_verdict() {
    local who=$1 what=$2
    FAILS=()
    TEXT=$WORK/console.txt
    tr -d '\r' <"$CONSOLE" >"$TEXT"

    PASSED=0
    FAILED=0
    SKIPPED=0
    RESULT_LINES=()
    while read -r _ name status detail; do
        RESULT_LINES+=("$(printf '%-4s %s%s' "$status" "$name" "${detail:+  ($detail)}")")
        case "$status" in
        PASS) PASSED=$((PASSED + 1)) ;;
        SKIP) SKIPPED=$((SKIPPED + 1)) ;;
        *)
            FAILED=$((FAILED + 1))
            FAILS+=("$name${detail:+ ($detail)}")
            ;;
        esac
    done < <(grep -E '^RESULT [^ ]+ (PASS|FAIL|SKIP)( |$)' "$TEXT" || true)

    RUNNER_FAILS=()
    runner_fail() {
        FAILED=$((FAILED + 1))
        FAILS+=("$1")
        RUNNER_FAILS+=("$1")
    }

    if [ "$TIMED_OUT" = 1 ]; then
        runner_fail "TIMEOUT after ${TIMEOUT}s"
    fi
    DONE_LINE=$(grep -E '^CXL-ACCEL-GUEST-DONE rc=[0-9]+' "$TEXT" | tail -n 1 || true)
    if [ -z "$DONE_LINE" ]; then
        runner_fail "end marker CXL-ACCEL-GUEST-DONE missing (guest crashed, hung or timed out; QEMU rc=$QEMU_RC)"
        [ -s "$WORK/qemu.log" ] && { echo "$who: QEMU said:" >&2; tail -n 20 "$WORK/qemu.log" >&2; }
    else
        SCRIPT_RC=${DONE_LINE##*rc=}
        [ "$SCRIPT_RC" = 0 ] || runner_fail "guest script exited with rc=$SCRIPT_RC"
    fi
    for i in "${!DEAD_DAEMONS[@]}"; do
        runner_fail "daemon $i died during the run"
        tail -n 20 "$WORK/daemon$i.log" >&2
    done

    # Kernel log: the dmesg dump between the markers, else the whole console.
    KLOG=$WORK/kernel.log
    if grep -q '^CXL-ACCEL-DMESG-END' "$TEXT"; then
        sed -n '/^CXL-ACCEL-DMESG-BEGIN/,/^CXL-ACCEL-DMESG-END/p' "$TEXT" >"$KLOG"
    else
        cp "$TEXT" "$KLOG"
    fi
    KERNEL_BAD_RE='WARNING:|BUG:|Oops|Call Trace|Kernel panic'
    if grep -qE "$KERNEL_BAD_RE" "$KLOG"; then
        runner_fail "guest kernel log has $(grep -oE "$KERNEL_BAD_RE" "$KLOG" | sort -u | paste -sd, -)"
        echo "$who: guest kernel problems:" >&2
        grep -E -A 12 "$KERNEL_BAD_RE" "$KLOG" | head -n 60 >&2
    fi

    # For CI systems: KTAP and JUnit, and the logs of a failed run.
    write_results() {
        local dir=$1 n=0 total status name detail suite
        mkdir -p "$dir"
        total=$(( ${#RESULT_LINES[@]} + ${#RUNNER_FAILS[@]} ))
        suite=$(basename "$dir")
        # control characters (but tab) are not allowed in XML 1.0 at all
        xml() { tr -d '\000-\010\013\014\016-\037' | sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g' -e 's/"/\&quot;/g'; }
        {
            echo "KTAP version 1"
            echo "1..$total"
            while read -r _ name status detail; do
                n=$((n + 1))
                case "$status" in
                PASS) echo "ok $n $name${detail:+ # $detail}" ;;
                SKIP) echo "ok $n $name # SKIP $detail" ;;
                *) echo "not ok $n $name${detail:+ # $detail}" ;;
                esac
            done < <(grep -E '^RESULT [^ ]+ (PASS|FAIL|SKIP)( |$)' "$TEXT" || true)
            for detail in "${RUNNER_FAILS[@]}"; do
                n=$((n + 1))
                echo "not ok $n $who # $detail"
            done
        } >"$dir/results.ktap"
        {
            echo '<?xml version="1.0" encoding="UTF-8"?>'
            printf '<testsuite name="%s" tests="%d" failures="%d" skipped="%d" time="%s">\n' \
                "$(echo "$suite" | xml)" "$total" "$FAILED" "$SKIPPED" "$WALL"
            while read -r _ name status detail; do
                printf '  <testcase classname="%s" name="%s">' "$(echo "$suite" | xml)" "$(echo "$name" | xml)"
                case "$status" in
                PASS) ;;
                SKIP) printf '<skipped message="%s"/>' "$(echo "$detail" | xml)" ;;
                *) printf '<failure message="%s"/>' "$(echo "$detail" | xml)" ;;
                esac
                echo '</testcase>'
            done < <(grep -E '^RESULT [^ ]+ (PASS|FAIL|SKIP)( |$)' "$TEXT" || true)
            for detail in "${RUNNER_FAILS[@]}"; do
                printf '  <testcase classname="%s" name="%s"><failure message="%s"/></testcase>\n' \
                    "$(echo "$suite" | xml)" "$(echo "$who" | xml)" "$(echo "$detail" | xml)"
            done
            echo '</testsuite>'
        } >"$dir/junit.xml"
        echo "$PASSED passed, $FAILED failed, $SKIPPED skipped" >"$dir/summary"
        if [ "$FAILED" -gt 0 ]; then
            cp "$TEXT" "$dir/console.log"
            cp "$KLOG" "$dir/kernel.log"
            local f
            for f in "$WORK"/daemon*.log "$WORK/qemu.log"; do
                if [ -s "$f" ]; then cp "$f" "$dir/"; fi
            done
        fi
    }
    [ -z "$RESULTS" ] || write_results "$RESULTS"

    echo
    for l in "${RESULT_LINES[@]}"; do echo "  $l"; done
    echo "$who: $what guest wall time ${WALL}s"
    if [ "$FAILED" -gt 0 ] && [ "$QUIET" = 1 ]; then
        echo "$who: last lines of the guest console:"
        grep -v '^RESULT ' "$TEXT" | tail -n 40 | sed 's/^/  | /'
    fi
    for f in "${FAILS[@]}"; do echo "$who: FAIL $f"; done
    [ "$PASSED" -gt 0 ] || [ "$FAILED" -gt 0 ] || echo "$who: warning: the guest printed no RESULT lines"
    echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
    [ "$FAILED" = 0 ]
}
