#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
#
# The README's commands work: every fenced ```sh block of README.md and of the
# documents in docs/ runs, from
# the repository, under bash -euo pipefail with no input and a time limit,
# in a process group of its own that is killed afterwards (nothing it started
# outlives it). A block that cannot run in CI says why in a comment on the
# line before its fence:
#   <!-- readme-test: skip: REASON -->
# (tests/readme.rs checks that every skipped block gives a reason, and that the
# files and flags the READMEs name exist.)
#
# Usage: ci/readme-check.sh [--list] [FILE...]   (default README.md docs/*.md)
#   --list   print the blocks and what would happen to each, run nothing
# Needs the set-up of ci/setup.sh; run as root (blocks use /run).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=ci/lib.sh
. "$HERE/lib.sh"
cd "$ROOT"

LIST=0
FILES=()
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help)
        script_help "$0" 3
        exit 0
        ;;
    --list) LIST=1; shift ;;
    *) FILES+=("$1"); shift ;;
    esac
done
[ "${#FILES[@]}" -gt 0 ] || FILES=(README.md docs/*.md)
for FILE in "${FILES[@]}"; do
    [ -f "$FILE" ] || die "readme-check: $FILE not found"
done
TIMEOUT=${CXL_ACCEL_README_TIMEOUT:-900}

W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT

PASSED=0 FAILED=0 SKIPPED=0
for FILE in "${FILES[@]}"; do
rm -f "$W"/*.sh "$W"/*.log
# Blocks into $W/N.sh, an index line each: N LINE SKIP-REASON
python3 - "$FILE" "$W" >"$W/index" <<'EOF'
import re, sys
path, out = sys.argv[1], sys.argv[2]
lines = open(path).read().split("\n")
n, i, skip = 0, 0, ""
while i < len(lines):
    line = lines[i]
    m = re.match(r"\s*<!-- readme-test: skip: (.*?)\s*-->\s*$", line)
    if m:
        skip = m.group(1)
    elif line.strip() == "```sh":
        n += 1
        start = i + 1
        body = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        open(f"{out}/{n}.sh", "w").write("\n".join(body) + "\n")
        print(n, start, skip or "-")
        skip = ""
    elif line.strip():
        skip = ""
    i += 1
EOF

while read -r n line reason; do
    first=$(grep -v '^\s*$' "$W/$n.sh" | head -n 1 | cut -c1-60)
    if [ "$reason" != - ]; then
        SKIPPED=$((SKIPPED + 1))
        echo "SKIP $FILE:$line ($first): $reason"
        continue
    fi
    if [ "$LIST" = 1 ]; then
        echo "RUN  $FILE:$line ($first)"
        continue
    fi
    log "== $FILE:$line: $first"
    t0=$(now)
    rc=0
    setsid timeout --kill-after=10 "$TIMEOUT" bash -euo pipefail "$W/$n.sh" </dev/null >"$W/$n.log" 2>&1 &
    pid=$!
    wait_progress "README block at line $line" "$W/$n.log" "$pid" "$t0" || rc=$?
    kill -- -"$pid" 2>/dev/null || true
    if [ "$rc" = 0 ]; then
        PASSED=$((PASSED + 1))
        echo "PASS $FILE:$line ($first) in $(elapsed "$t0")s"
    else
        FAILED=$((FAILED + 1))
        echo "FAIL $FILE:$line ($first): exit status $rc after $(elapsed "$t0")s; its output ends:"
        tail -n 30 "$W/$n.log" | sed 's/^/  | /'
    fi
done <"$W/index"
done
[ "$LIST" = 1 ] && exit 0
echo "$PASSED passed, $FAILED failed, $SKIPPED skipped"
[ "$FAILED" = 0 ]
