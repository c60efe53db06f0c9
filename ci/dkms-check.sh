#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
#
# The driver the way out-of-tree drivers ship: Debian's dkms adds
# guest-driver/ (its dkms.conf), builds and installs cxl_accel.ko for the
# cached guest kernels of ci/setup.sh, 6.12 on the host and 7.3 in the trixie
# root (its build tools need trixie's C library; dkms is installed there), then
# removes it again. Everything dkms writes goes to trees in a temporary
# directory (--sourcetree, --dkmstree, --installtree; dkms's depmod, which
# knows only /lib/modules, is replaced by depmod -b on that tree): /usr/src,
# /var/lib/dkms and /lib/modules are left alone. Finally a guest of each
# kernel loads the module dkms built for it and runs the demo.
#
# Usage: ci/dkms-check.sh [--kernel 6.12|7.3] [--no-boot] [--keep]
#   --kernel K   only this kernel (default: 6.12, and 7.3 when set up)
#   --no-boot    do not boot a guest with the module
#   --keep       keep the temporary directory
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
# shellcheck source=ci/lib.sh
. "$HERE/lib.sh"
cd "$ROOT"

KERNELS=()
BOOT=1
KEEP=0
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help)
        script_help "$0" 3
        exit 0
        ;;
    --kernel)
        case "${2:-}" in 6.12 | 7.3) KERNELS+=("$2") ;; *) die "dkms-check: --kernel 6.12|7.3" ;; esac
        shift 2
        ;;
    --no-boot) BOOT=0; shift ;;
    --keep) KEEP=1; shift ;;
    *) die "dkms-check: unknown argument '$1' (see --help)" ;;
    esac
done
if [ "${#KERNELS[@]}" -eq 0 ]; then
    KERNELS=(6.12)
    [ ! -f "$CACHE/env-7.3.sh" ] || KERNELS+=(7.3)
fi

CONF=guest-driver/dkms.conf
NAME=$(sed -n 's/^PACKAGE_NAME="\(.*\)"/\1/p' "$CONF")
VERSION=$(sed -n 's/^PACKAGE_VERSION="\(.*\)"/\1/p' "$CONF")
MODULE=$(sed -n 's/^BUILT_MODULE_NAME\[0\]="\(.*\)"/\1/p' "$CONF")
if [ -z "$NAME" ] || [ -z "$VERSION" ] || [ -z "$MODULE" ]; then
    die "dkms-check: $CONF lacks PACKAGE_NAME, PACKAGE_VERSION or BUILT_MODULE_NAME"
fi

install_missing dkms-check dkms

W=$(mktemp -d "${TMPDIR:-/tmp}/cxl-accel-dkms.XXXXXX")
cleanup() {
    local rc=$?
    if [ "$KEEP" = 1 ]; then echo "dkms-check: kept $W" >&2; else rm -rf "$W"; fi
    exit "$rc"
}
trap cleanup EXIT

# The sources as a package would ship them: the driver's tracked files.
SRC=$W/src/$NAME-$VERSION
MODTREE=$W/root/lib/modules
mkdir -p "$SRC" "$W/dkms" "$MODTREE"
git ls-files -z guest-driver | while IFS= read -r -d '' f; do
    mkdir -p "$SRC/$(dirname "${f#guest-driver/}")"
    cp "$f" "$SRC/${f#guest-driver/}"
done
[ -f "$SRC/dkms.conf" ] || die "dkms-check: guest-driver/dkms.conf is not tracked"

# dkms [RUN...] ARGS: dkms on the host, or through RUN (the trixie root).
dkms_in() { # run-prefix-or-empty action args...
    local run=$1
    shift
    # shellcheck disable=SC2086 # the prefix is a command with its arguments
    $run dkms "$@" --sourcetree "$W/src" --dkmstree "$W/dkms" --installtree "$MODTREE"
}

check_kernel() { # 6.12|7.3
    local k=$1 env run='' log ko vm
    env=$(envfile "$k")
    [ "$k" = 6.12 ] || run=$CACHE/trixie/run
    [ -f "$env" ] || die "dkms-check: $env missing; run ci/setup.sh${run:+ --kernel 7.3}"
    (
        # shellcheck source=/dev/null
        . "$env"
        if [ -n "$run" ]; then
            # dkms in the trixie root, from its own Debian packages
            # shellcheck disable=SC2016 # dpkg-query's format
            if [ "$(chroot "$CACHE/trixie/root" dpkg-query -W -f='${Status}' dkms 2>/dev/null || true)" != "install ok installed" ]; then
                with_progress "installing dkms in the trixie root" "$W/root-install.log" \
                    "$run" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends dkms ||
                    { tail -n 10 "$W/root-install.log" >&2; die "dkms-check: cannot install dkms in the trixie root"; }
            fi
        fi
        log "== dkms ($k): add, build, install $NAME/$VERSION for $GUEST_KVER ($($run dkms --version))"
        log=$W/dkms-$k.log
        : >"$log"
        dkms_in "$run" add -m "$NAME" -v "$VERSION" >>"$log" 2>&1 ||
            { cat "$log" >&2; die "dkms-check: dkms add failed"; }
        with_progress "dkms build ($k)" "$W/build-$k.log" \
            dkms_in "$run" build -m "$NAME" -v "$VERSION" -k "$GUEST_KVER" --kernelsourcedir "$KDIR" ||
            { cat "$W/build-$k.log" >&2; cat "$W/dkms/$NAME/$VERSION/build/make.log" >&2 2>/dev/null || true; die "dkms-check: dkms build for $GUEST_KVER failed"; }
        grep -E '^make |^Building module|signed' "$W/build-$k.log" | sed 's/^/  | /' || true
        # The kernel's module directory, as an installed kernel has it.
        mkdir -p "$MODTREE/$GUEST_KVER"
        dkms_in "$run" install --no-depmod -m "$NAME" -v "$VERSION" -k "$GUEST_KVER" --kernelsourcedir "$KDIR" >>"$log" 2>&1 ||
            { cat "$log" >&2; die "dkms-check: dkms install for $GUEST_KVER failed"; }
        ko=$(find "$MODTREE/$GUEST_KVER" -name "$MODULE.ko*" | head -n 1)
        [ -n "$ko" ] || { cat "$log" >&2; die "dkms-check: dkms install put no $MODULE.ko under $MODTREE/$GUEST_KVER"; }
        case "$ko" in
        *.xz) xz -dc "$ko" >"$W/$MODULE-$k.ko" ;;
        *.zst) zstd -qdc "$ko" >"$W/$MODULE-$k.ko" ;;
        *.gz) gzip -dc "$ko" >"$W/$MODULE-$k.ko" ;;
        *) cp "$ko" "$W/$MODULE-$k.ko" ;;
        esac
        vm=$(modinfo -F vermagic "$W/$MODULE-$k.ko")
        case "$vm" in
        "$GUEST_KVER "*) ;;
        *) die "dkms-check: $ko has vermagic '$vm', not for $GUEST_KVER" ;;
        esac
        log "installed ${ko#"$MODTREE/"} (vermagic $vm); dkms status: $(dkms_in "$run" status -m "$NAME" 2>/dev/null | tr '\n' ' ')"
        # (only our module is in the tree: depmod says the kernel's lists are missing)
        depmod -b "$W/root" "$GUEST_KVER" 2>/dev/null ||
            die "dkms-check: depmod of the installed tree failed"
        grep -q "updates/dkms/$MODULE.ko" "$MODTREE/$GUEST_KVER/modules.dep" ||
            die "dkms-check: depmod does not list $MODULE in $MODTREE/$GUEST_KVER/modules.dep"
        dkms_in "$run" remove --no-depmod -m "$NAME" -v "$VERSION" --all >>"$log" 2>&1 ||
            { cat "$log" >&2; die "dkms-check: dkms remove failed"; }
        [ -z "$(find "$MODTREE" -name "$MODULE.ko*")" ] || die "dkms-check: dkms remove left $MODULE.ko behind"
        [ ! -e "$W/dkms/$NAME" ] || die "dkms-check: dkms remove left $W/dkms/$NAME"
        log "removed: nothing of $NAME left in the dkms and module trees"
    )
}

envfile() { # 6.12|7.3
    case "$1" in
    6.12) echo "$CACHE/env.sh" ;;
    7.3) echo "$CACHE/env-7.3.sh" ;;
    esac
}

for k in "${KERNELS[@]}"; do check_kernel "$k"; done

if [ "$BOOT" = 1 ]; then
    [ -x target/release/cxl-accel ] || die "dkms-check: build the daemon first (cargo build --release) or use --no-boot"
    make -s -C tests/guest/progs >/dev/null
    for k in "${KERNELS[@]}"; do
        log "== booting a $k guest with the module dkms built"
        CXL_ACCEL_ENV=$(envfile "$k") "$HERE/run-guest.sh" --devices 1 --quiet --timeout 300 \
            --insmod "$W/$MODULE-$k.ko:/lib/modules/extra/cxl_accel.ko" \
            --add tests/guest/progs/out/cxl-accel-demo:/bin/ \
            --script tests/guest/scripts/demo-guest.sh | tail -n 3
    done
fi
echo "dkms-check: passed (${KERNELS[*]})"
