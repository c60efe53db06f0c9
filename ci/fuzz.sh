#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Bounded coverage-guided fuzzing of the device model with cargo-fuzz (libFuzzer):
# request decoding, request execution, and descriptor chains taken from a virtqueue and
# handled by the daemon's backend code. Runs each target for SECONDS (default 60)
# on a copy of the seed corpus in fuzz/corpus/, so the repository is not modified.
# Usage: ci/fuzz.sh [SECONDS]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=ci/lib.sh
. "$HERE/lib.sh"
SECONDS_PER_TARGET=${1:-60}

if ! cargo fuzz --version >/dev/null 2>&1; then
    log "installing cargo-fuzz from crates.io"
    mkdir -p "$CACHE"
    with_progress "cargo install cargo-fuzz" "$CACHE/cargo-fuzz-install.log" \
        cargo install --locked cargo-fuzz ||
        die "ci/fuzz.sh: cannot install cargo-fuzz (log: $CACHE/cargo-fuzz-install.log)"
fi
# libFuzzer instrumentation needs unstable rustc flags; the stable toolchain allows them
# with RUSTC_BOOTSTRAP, which is confined to this build.
export RUSTC_BOOTSTRAP=1
cd "$ROOT/fuzz"
with_progress "cargo fuzz build" "$CACHE/fuzz-build.log" cargo fuzz build -O ||
    { tail -n 30 "$CACHE/fuzz-build.log" >&2; die "ci/fuzz.sh: the fuzz targets do not build (log: $CACHE/fuzz-build.log)"; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# One libFuzzer process is one thread: two targets at a time use both cores of a
# 2-core machine, each still fuzzed for SECONDS on a core of its own.
fuzz_one() { # target
    local target=$1
    cp -r "corpus/$target" "$WORK/$target"
    cargo fuzz run -O "$target" "$WORK/$target" -- \
        -max_total_time="$SECONDS_PER_TARGET" -max_len=4096 -print_final_stats=1 \
        >"$WORK/$target.log" 2>&1
}
for pair in "decode execute" "chain"; do
    read -ra targets <<<"$pair"
    log "== fuzz $pair for ${SECONDS_PER_TARGET}s"
    pids=()
    for target in "${targets[@]}"; do
        fuzz_one "$target" &
        pids+=("$!")
    done
    i=0
    for target in "${targets[@]}"; do
        wait "${pids[$i]}" || {
            tail -n 40 "$WORK/$target.log"
            die "ci/fuzz.sh: $target found a failure (crash input under fuzz/artifacts/$target/)"
        }
        i=$((i + 1))
        runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$WORK/$target.log" | grep -oE '[0-9]+$')
        echo "fuzz $target: $runs executions in ${SECONDS_PER_TARGET}s, no failure"
    done
done
