#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# A debug guest kernel for running the driver under the checks Debian's
# kernels leave out: KASAN, DEBUG_VM, DEBUG_PAGEALLOC, SLUB_DEBUG, lockdep
# (PROVE_LOCKING), DEBUG_ATOMIC_SLEEP and DEBUG_OBJECTS; also with
# DEVICE_PRIVATE and the kernel's own test_hmm. Built from Debian's Linux
# 6.12 source tarball (ci/setup.sh --linux-source) with x86_64_defconfig,
# kvm_guest.config and ci/debug-kernel.config, into the cache (about 40 min
# on 2 cores, once). Writes "$CACHE/env-debug.sh"; then, for example:
#   CXL_ACCEL_ENV=~/.cache/cxl-accel/env-debug.sh ci/guest-suite.sh
#   CXL_ACCEL_ENV=~/.cache/cxl-accel/env-debug.sh tests/guest/host/run-stress.sh
# Usage: ci/debug-kernel.sh [--jobs N]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=ci/lib.sh
. "$HERE/lib.sh"

JOBS=${CXL_ACCEL_JOBS:-2}
case "${1:-}" in
-h | --help)
    sed -n '3,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
    ;;
--jobs) JOBS=${2:?--jobs needs a number} ;;
"") ;;
*) die "ci/debug-kernel.sh: unknown argument '$1' (see --help)" ;;
esac

run_setup --linux-source
load_env	# the QEMU to run it with
TARBALL=$(printf '%s\n' "$CACHE"/linux-src/linux_6.12.*.orig.tar.xz | sort -V | tail -n 1)
[ -f "$TARBALL" ] || die "ci/debug-kernel.sh: no Linux source tarball in $CACHE/linux-src"
VER=$(basename "$TARBALL" | sed -E 's/^linux_([0-9.]+)\.orig.*/\1/')
BASE=$CACHE/debug-kernel
SRC=$BASE/linux-$VER
MODS=$BASE/modules-$VER

for p in libelf-dev libssl-dev bc flex bison; do
    pkg_installed "$p" || MISSING="${MISSING:-} $p"
done
if [ -n "${MISSING:-}" ]; then
    log "installing$MISSING"
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $MISSING >/dev/null ||
        die "ci/debug-kernel.sh: cannot install$MISSING"
fi

if [ ! -e "$SRC/.unpacked" ]; then
    rm -rf "$SRC" "$SRC.tmp"
    mkdir -p "$SRC.tmp"
    with_progress "unpacking $(basename "$TARBALL")" "$BASE/unpack.log" \
        tar -xf "$TARBALL" -C "$SRC.tmp" --strip-components=1
    touch "$SRC.tmp/.unpacked"
    mv "$SRC.tmp" "$SRC"
fi
cd "$SRC"
if ! cmp -s "$HERE/debug-kernel.config" "$BASE/config-fragment" 2>/dev/null; then
    make -s x86_64_defconfig
    ./scripts/kconfig/merge_config.sh -m .config kernel/configs/kvm_guest.config \
        "$HERE/debug-kernel.config" >"$BASE/merge.log" 2>&1
    make -s olddefconfig
    cp "$HERE/debug-kernel.config" "$BASE/config-fragment"
fi
with_progress "building the debug kernel (make -j$JOBS)" "$BASE/build.log" \
    make -j"$JOBS" bzImage modules ||
    { tail -n 30 "$BASE/build.log" >&2; die "ci/debug-kernel.sh: build failed (see $BASE/build.log)"; }
KVER=$(make -s kernelrelease)
rm -rf "$MODS"
with_progress "installing modules" "$BASE/modules.log" \
    make -s modules_install INSTALL_MOD_PATH="$MODS" INSTALL_MOD_STRIP=1
{
    echo "# Written by ci/debug-kernel.sh on $(date -u +%FT%TZ): the debug guest kernel."
    printf 'export QEMU=%q\n' "$QEMU"
    printf 'export QEMU_FIRMWARE_ARGS=%q\n' "$QEMU_FIRMWARE_ARGS"
    printf 'export GUEST_KERNEL=%q\n' "$SRC/arch/x86/boot/bzImage"
    printf 'export GUEST_KVER=%q\n' "$KVER"
    printf 'export KDIR=%q\n' "$SRC"
    printf 'export GUEST_MODULES=%q\n' "$MODS/lib/modules/$KVER"
    printf 'export KMAKE=make\n'
} >"$CACHE/env-debug.sh"
log "debug kernel $KVER ready; wrote $CACHE/env-debug.sh"
