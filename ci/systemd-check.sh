#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
#
# systemd/cxl-accel@.service under a real systemd, whatever runs as PID 1
# here: a throw-away container (systemd-nspawn --volatile=yes: the host's
# /usr, an empty /etc and /var in memory, no network) boots with the unit,
# the user of systemd/cxl-accel.sysusers, an /etc/cxl-accel/0.conf and the
# daemon from target/release, and starts cxl-accel@0 with all of systemd's
# sandboxing on top of the daemon's own seccomp filter. A check service in the
# container then looks at it as QEMU would (another user in group kvm connects
# to the socket and opens the device memory), stops it, and powers off; each
# check is one RESULT line. (The unit's ExecStart= names /usr/local/bin, which
# the container cannot add to the host's /usr: its copy uses /opt/cxl-accel.)
#
# Usage: ci/systemd-check.sh [--keep]
# Installs systemd-container when missing; run as root.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=ci/lib.sh
. "$HERE/lib.sh"
cd "$ROOT"

KEEP=0
case "${1:-}" in
-h | --help) script_help "$0" 3; exit 0 ;;
--keep) KEEP=1 ;;
"") ;;
*) die "systemd-check: unknown argument '$1' (see --help)" ;;
esac

DAEMON=${CXL_ACCEL_DAEMON:-$ROOT/target/release/cxl-accel}
[ -x "$DAEMON" ] || die "systemd-check: $DAEMON not found; build it (cargo build --release)"
install_missing systemd-check systemd-container

T=$(mktemp -d "${TMPDIR:-/tmp}/cxl-accel-systemd.XXXXXX")
trap '[ "$KEEP" = 1 ] && echo "systemd-check: kept $T" >&2 || rm -rf "$T"' EXIT
mkdir -p "$T/units" "$T/out"
sed 's|/usr/local/bin/cxl-accel|/opt/cxl-accel/cxl-accel|g' systemd/cxl-accel@.service \
    >"$T/units/cxl-accel@.service"
cp "$DAEMON" "$T/cxl-accel"
echo 'CXL_ACCEL_ARGS="--memory-size 64M --socket-group kvm"' >"$T/0.conf"
echo 'CXL_ACCEL_ARGS="--memory-size 64M --socket-group kvm --supervise"' >"$T/1.conf"
# Instance 2 as libvirt's <shmem> wants it: device memory in the host's /dev/shm, through
# the drop-in README.md gives.
printf '%s\n' 'CXL_ACCEL_MEMORY=/dev/shm/cxl-accel-check2' \
    'CXL_ACCEL_ARGS="--memory-size 64M --socket-group kvm"' >"$T/2.conf"
printf '%s\n' '[Service]' 'PrivateDevices=no' 'ReadWritePaths=/dev/shm' >"$T/shm.conf"

# The checks, run as root in the container once cxl-accel@0 has started (or failed).
cat >"$T/check.sh" <<'EOF'
#!/bin/sh
out=/out/result
: >$out
check() { # name command...
    name=$1
    shift
    if detail=$("$@" 2>&1); then
        echo "RESULT $name PASS" >>$out
    else
        echo "RESULT $name FAIL $(echo "$detail" | tr '\n' ' ' | cut -c1-600)" >>$out
    fi
}
dir=/run/cxl-accel/0
check started systemctl is-active cxl-accel@0
check socket-for-kvm sh -c "[ \"\$(stat -c '%U:%G %a' $dir/cxl-accel.sock)\" = 'cxl-accel:kvm 660' ] || stat -c '%U:%G %a' $dir/cxl-accel.sock"
check memory-for-kvm sh -c "[ \"\$(stat -c '%U:%G %a' $dir/devmem)\" = 'cxl-accel:kvm 660' ] || stat -c '%U:%G %a' $dir/devmem"
# QEMU's side: another user, only in group kvm.
check qemu-user-connects setpriv --reuid=nobody --regid=kvm --clear-groups python3 -c \
    "import socket; s = socket.socket(socket.AF_UNIX); s.connect('$dir/cxl-accel.sock')"
check qemu-user-maps-memory setpriv --reuid=nobody --regid=kvm --clear-groups python3 -c \
    "open('$dir/devmem', 'r+b').close()"
check others-cannot setpriv --reuid=nobody --regid=nogroup --clear-groups sh -c \
    "! python3 -c \"open('$dir/devmem', 'r+b')\" 2>/dev/null"
pid=$(systemctl show -p MainPID --value cxl-accel@0)
check seccomp-filter grep -q '^Seccomp:[[:space:]]*2' /proc/$pid/status
check no-new-privileges grep -q '^NoNewPrivs:[[:space:]]*1' /proc/$pid/status
check no-capabilities grep -q '^CapEff:[[:space:]]*0*$' /proc/$pid/status
check not-root sh -c "[ \"\$(stat -c %U /proc/$pid)\" = cxl-accel ]"
check stops systemctl stop cxl-accel@0
check stopped-cleanly sh -c "[ \"\$(systemctl show -p Result --value cxl-accel@0)\" = success ]"
check runtime-dir-removed sh -c "[ ! -e $dir ]"
# Instance 1 with --supervise: for a front-end (QEMU's user holds a connection) the
# supervisor starts a worker (fork and exec under systemd's filter) and replaces it when
# it is killed.
check supervised-started systemctl start cxl-accel@1
setpriv --reuid=nobody --regid=kvm --clear-groups python3 -c \
    "import socket, time; s = socket.socket(socket.AF_UNIX); s.connect('/run/cxl-accel/1/cxl-accel.sock'); time.sleep(25)" &
sup=$(systemctl show -p MainPID --value cxl-accel@1)
worker() { pgrep -P "$sup" -x cxl-accel | head -n 1; }
i=0; while [ -z "$(worker)" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
w=$(worker)
check supervised-has-worker test -n "$w"
# Kill it once it runs as a worker (the supervisor logged it), not in the window between
# fork and exec, where it already has the supervisor's name.
i=0; while ! journalctl -u cxl-accel@1 --no-pager 2>/dev/null | grep -q "worker pid $w started" && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
kill -9 "$w" 2>/dev/null
i=0; while { [ -z "$(worker)" ] || [ "$(worker)" = "$w" ]; } && [ $i -lt 150 ]; do sleep 0.1; i=$((i + 1)); done
# On failure, the detail says where the old worker and the supervisor are.
check supervised-worker-replaced sh -c "[ -n \"$(worker)\" ] && [ \"$(worker)\" != $w ] && systemctl is-active cxl-accel@1 ||
    { echo killed $w; ps -o pid,ppid,stat,wchan:24,etime,comm -p $w,$sup; ps -o pid,ppid,stat,comm --ppid $sup; false; }"
check supervised-stops systemctl stop cxl-accel@1
journalctl -u cxl-accel@1 --no-pager >/out/journal-1 2>&1
check shm-started systemctl start cxl-accel@2
check shm-memory-for-kvm sh -c "[ \"\$(stat -c '%U:%G %a' /dev/shm/cxl-accel-check2)\" = 'cxl-accel:kvm 660' ]"
check shm-stops systemctl stop cxl-accel@2
journalctl -u cxl-accel@2 --no-pager >/out/journal-2 2>&1
journalctl -u cxl-accel@0 --no-pager >/out/journal 2>&1
echo done >>/out/finished
EOF
chmod 755 "$T/check.sh"
cat >"$T/units/cxl-check.service" <<'EOF'
[Unit]
Description=cxl-accel@0 as QEMU would see it
Wants=cxl-accel@0.service
After=cxl-accel@0.service
[Service]
Type=oneshot
ExecStart=/opt/cxl-check.sh
ExecStartPost=/bin/systemctl poweroff --no-block
EOF
cat >"$T/units/cxl-check.target" <<'EOF'
[Unit]
Description=cxl-accel unit check
Requires=basic.target cxl-check.service
After=basic.target
AllowIsolate=yes
EOF

binds=()
for u in cxl-accel@.service cxl-check.service cxl-check.target; do
    binds+=(--bind-ro="$T/units/$u:/etc/systemd/system/$u")
done
log "booting a systemd container with cxl-accel@0 (systemd $(systemd-nspawn --version | awk 'NR == 1 {print $2}'))"
t0=$(now)
rc=0
with_progress "systemd container" "$T/nspawn.log" \
    timeout 120 systemd-nspawn --quiet --keep-unit --register=no -D / --volatile=yes \
    --private-network "${binds[@]}" \
    --bind-ro="$ROOT/systemd/cxl-accel.sysusers:/etc/sysusers.d/cxl-accel.conf" \
    --bind-ro="$T/0.conf:/etc/cxl-accel/0.conf" \
    --bind-ro="$T/1.conf:/etc/cxl-accel/1.conf" \
    --bind-ro="$T/2.conf:/etc/cxl-accel/2.conf" \
    --bind-ro="$T/shm.conf:/etc/systemd/system/cxl-accel@2.service.d/shm.conf" \
    --bind-ro="$T/cxl-accel:/opt/cxl-accel/cxl-accel" \
    --bind-ro="$T/check.sh:/opt/cxl-check.sh" \
    --bind="$T/out:/out" \
    -b systemd.unit=cxl-check.target systemd.firstboot=off </dev/null || rc=$?
log "container done in $(elapsed "$t0")s (rc $rc)"
sed 's/^/  /' "$T/out/result" 2>/dev/null || true
passed=$(grep -c ' PASS' "$T/out/result" 2>/dev/null || true)
failed=$(grep -c ' FAIL' "$T/out/result" 2>/dev/null || true)
if [ ! -e "$T/out/finished" ]; then
    failed=$((failed + 1))
    echo "systemd-check: the checks did not finish; the container's console ends:"
    sed 's/\x1b\[[0-9;]*[mK]//g' "$T/nspawn.log" | grep -av 'Job .* running' | tail -n 30 | sed 's/^/  | /'
fi
if [ "$failed" != 0 ]; then
    echo "systemd-check: cxl-accel@0's journal:"
    sed 's/^/  | /' "$T/out/journal" 2>/dev/null | tail -n 20 || true
    for i in 1 2; do
        echo "systemd-check: cxl-accel@$i's journal:"
        sed 's/^/  | /' "$T/out/journal-$i" 2>/dev/null | tail -n 20 || true
    done
fi
echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" = 0 ]
