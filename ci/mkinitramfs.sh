#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# Build a busybox initramfs for cxl-accel guests.
#
# Usage: ci/mkinitramfs.sh OUT.cpio.gz [options]
#   --add SRC:DEST     copy host file/dir SRC to guest path DEST (DEST ending
#                      in / means "into that directory"); binaries must be static;
#                      for a .ko, the guest kernel modules it depends on are added
#                      and loaded (the guest script insmods it)
#   --insmod SRC:DEST  like --add for a .ko, and /init loads it (after the
#                      guest kernel modules it depends on, which are added too)
#   --module NAME      also include and load this guest kernel module (and its
#                      dependencies); built-in ones are skipped
#   --add-root ROOT:PATH  a dynamically linked program PATH of the Debian root
#                      ROOT (e.g. the set-up's trixie root), at PATH in the
#                      guest with its loader and every shared library it needs,
#                      found from its ELF headers in ROOT's library directories
#
# /init mounts /proc /sys /dev /dev/pts /tmp and debugfs (/sys/kernel/debug, also
# reachable as /debugfs), loads the modules, then:
#   - with "cxlaccel.run=/path/script" on the kernel command line: runs it,
#     prints the kernel log between CXL-ACCEL-DMESG-BEGIN/END, prints
#     "CXL-ACCEL-GUEST-DONE rc=N" and powers off;
#   - otherwise: an interactive shell on the console; power off when it exits.
#
# Needs GUEST_KVER and GUEST_MODULES (from the set-up ci/setup.sh wrote).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=ci/lib.sh
. "$HERE/lib.sh"

usage() {
    sed -n '3,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit "${1:-0}"
}

# The virtio transport our device sits on; built-in on Debian's 6.12 (then
# nothing is added), but a kernel with modular virtio needs them here.
DEFAULT_MODULES=(virtio virtio_ring virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci)

OUT=
ADDS=()
ROOT_PROGS=()
INSMODS=()
MODULES=("${DEFAULT_MODULES[@]}")
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help) usage 0 ;;
    --add) ADDS+=("${2:?--add needs SRC:DEST}"); shift 2 ;;
    --insmod) INSMODS+=("${2:?--insmod needs SRC:DEST}"); shift 2 ;;
    --module) MODULES+=("${2:?--module needs NAME}"); shift 2 ;;
    --add-root) ROOT_PROGS+=("${2:?--add-root needs ROOT:PATH}"); shift 2 ;;
    -*) echo "mkinitramfs: unknown option $1" >&2; usage 2 ;;
    *) [ -z "$OUT" ] || { echo "mkinitramfs: one output only" >&2; usage 2; }; OUT=$1; shift ;;
    esac
done
[ -n "$OUT" ] || usage 2

if [ -z "${GUEST_KVER:-}" ] && [ -f "$ENV_FILE" ]; then
    load_env
fi
[ -n "${GUEST_KVER:-}" ] || die "mkinitramfs: GUEST_KVER unknown; run ci/setup.sh first"
BUSYBOX=${BUSYBOX:-/bin/busybox}
[ -x "$BUSYBOX" ] || die "mkinitramfs: $BUSYBOX missing; apt-get install busybox-static (or run ci/setup.sh)"
readelf -l "$BUSYBOX" 2>/dev/null | grep -q 'INTERP' && die "mkinitramfs: $BUSYBOX is dynamically linked; need busybox-static"

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT

mkdir -p "$STAGE"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,root,etc/cxl-accel,lib/modules/"$GUEST_KVER"}
cp "$BUSYBOX" "$STAGE/bin/busybox"
for applet in $("$BUSYBOX" --list-full); do
    [ -e "$STAGE/$applet" ] || ln -s /bin/busybox "$STAGE/$applet"
done
ln -s /sys/kernel/debug "$STAGE/debugfs"
# Lets the kernel give /init a console before devtmpfs is mounted.
mknod -m 600 "$STAGE/dev/console" c 5 1 2>/dev/null || true

# ---------------------------------------------------------------- modules

LOAD_LIST=$STAGE/etc/cxl-accel/modules
: >"$LOAD_LIST"
declare -A SEEN=()

# Is module NAME (dashes or underscores) built into the kernel?
is_builtin() {
    [ -n "${GUEST_MODULES:-}" ] && [ -f "$GUEST_MODULES/modules.builtin" ] &&
        grep -qE "/${1//[-_]/[-_]}\\.ko\$" "$GUEST_MODULES/modules.builtin"
}

# Relative path (as in modules.dep) of module NAME, or nothing.
module_path() {
    awk -F: -v re="/${1//[-_]/[-_]}\\.ko(\\.(xz|zst|gz))?\$" '$1 ~ re { print $1; exit }' \
        "$GUEST_MODULES/modules.dep"
}

# Copy one module (decompressed: busybox insmod may not read .ko.xz) and
# append it to the load list.
add_module_file() {
    local rel=$1 src dst
    [ -n "${SEEN[$rel]:-}" ] && return 0
    SEEN[$rel]=1
    src=$GUEST_MODULES/$rel
    dst=$STAGE/lib/modules/$GUEST_KVER/${rel%.xz}
    dst=${dst%.zst}
    dst=${dst%.gz}
    mkdir -p "$(dirname "$dst")"
    case "$src" in
    *.xz) xz -dc "$src" >"$dst" ;;
    *.zst) zstd -qdc "$src" >"$dst" ;;
    *.gz) gzip -dc "$src" >"$dst" ;;
    *) cp "$src" "$dst" ;;
    esac
    echo "/lib/modules/$GUEST_KVER/${dst#"$STAGE/lib/modules/$GUEST_KVER/"}" >>"$LOAD_LIST"
}

# Add module NAME after everything it depends on.
add_module() {
    local name=$1 rel deps i
    is_builtin "$name" && return 0
    if [ -z "${GUEST_MODULES:-}" ] || [ ! -f "$GUEST_MODULES/modules.dep" ]; then
        die "mkinitramfs: module $name needed but GUEST_MODULES has no modules.dep"
    fi
    rel=$(module_path "$name")
    [ -n "$rel" ] || die "mkinitramfs: guest kernel $GUEST_KVER has no module $name"
    # modules.dep lists the full closure, the first to load last.
    read -r -a deps <<<"$(awk -F': *' -v m="$rel" '$1 == m { print $2; exit }' "$GUEST_MODULES/modules.dep")"
    for ((i = ${#deps[@]} - 1; i >= 0; i--)); do
        add_module_file "${deps[$i]}"
    done
    add_module_file "$rel"
}

for m in "${MODULES[@]}"; do add_module "$m"; done

# ----------------------------------------------------------- extra files

copy_in() { # SRC DEST -> prints guest path
    local src=${1%%:*} dest=${1#*:}
    if [ "$src" = "$1" ] || [ -z "$dest" ]; then
        die "mkinitramfs: expected SRC:DEST, got '$1'"
    fi
    [ -e "$src" ] || die "mkinitramfs: $src does not exist"
    case "$dest" in
    /*) ;;
    *) dest=/$dest ;;
    esac
    case "$dest" in
    */) dest=$dest$(basename "$src") ;;
    esac
    mkdir -p "$STAGE$(dirname "$dest")"
    cp -a "$src" "$STAGE$dest"
    if [ -f "$src" ] && readelf -l "$src" 2>/dev/null | grep -q INTERP; then
        echo "mkinitramfs: warning: $src is dynamically linked; the guest has no libc" >&2
    fi
    echo "$dest"
}

for a in "${ADDS[@]}"; do
    copy_in "$a" >/dev/null
    case "${a%%:*}" in
    *.ko) for dep in $(modinfo -F depends "${a%%:*}" 2>/dev/null | tr ',' ' '); do add_module "$dep"; done ;;
    esac
done
for a in "${INSMODS[@]}"; do
    guest=$(copy_in "$a")
    # Pull in the guest kernel modules it needs (dma-buf helpers etc.).
    for dep in $(modinfo -F depends "${a%%:*}" 2>/dev/null | tr ',' ' '); do add_module "$dep"; done
    echo "$guest" >>"$LOAD_LIST"
done

# A program of another root filesystem with its loader and libraries: the
# guest has no libc of its own.
declare -A ROOT_SEEN=()
root_lib() { # ROOT NAME -> the library's path in ROOT (as the guest sees it)
    local d
    for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /lib /usr/lib; do
        if [ -e "$1$d/$2" ]; then
            echo "$d/$2"
            return 0
        fi
    done
    return 1
}
add_root_file() { # ROOT PATH: the file and what it needs, once
    local root=$1 path=$2 interp lib p
    [ -n "${ROOT_SEEN[$path]:-}" ] && return 0
    ROOT_SEEN[$path]=1
    [ -e "$root$path" ] || die "mkinitramfs: $root$path does not exist"
    mkdir -p "$STAGE$(dirname "$path")"
    cp -L "$root$path" "$STAGE$path"
    interp=$(readelf -l "$root$path" 2>/dev/null |
        sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
    [ -z "$interp" ] || add_root_file "$root" "$interp"
    for lib in $(readelf -d "$root$path" 2>/dev/null | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
        p=$(root_lib "$root" "$lib") || die "mkinitramfs: $lib (needed by $path) is not in $root"
        add_root_file "$root" "$p"
    done
}
for a in "${ROOT_PROGS[@]}"; do
    [ "${a%%:*}" != "$a" ] || die "mkinitramfs: expected ROOT:PATH, got '$a'"
    add_root_file "${a%%:*}" "${a#*:}"
done

# ------------------------------------------------------------------ /init

cat >"$STAGE/etc/profile" <<'EOF'
export PATH=/sbin:/bin:/usr/sbin:/usr/bin
export PS1='cxl-guest:\w# '
EOF

cat >"$STAGE/init" <<'EOF'
#!/bin/sh
# cxl-accel guest /init (generated by ci/mkinitramfs.sh).
export PATH=/sbin:/bin:/usr/sbin:/usr/bin
mount -t devtmpfs devtmpfs /dev
exec 0</dev/console 1>/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs tmpfs /tmp
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t debugfs debugfs /sys/kernel/debug

while read -r m; do
    [ -n "$m" ] || continue
    insmod "$m" || echo "cxl-accel-init: insmod $m failed"
done </etc/cxl-accel/modules

run=
for arg in $(cat /proc/cmdline); do
    case "$arg" in
    cxlaccel.run=*) run=${arg#cxlaccel.run=} ;;
    esac
done

if [ -n "$run" ]; then
    echo "CXL-ACCEL-GUEST-START script=$run"
    cd /tmp
    if [ ! -e "$run" ]; then
        echo "cxl-accel-init: $run not found"
        rc=127
    elif [ "$(head -c 4 "$run")" = "$(printf '\177ELF')" ]; then
        "$run"
        rc=$?
    else
        sh "$run"
        rc=$?
    fi
    echo "CXL-ACCEL-DMESG-BEGIN"
    dmesg
    echo "CXL-ACCEL-DMESG-END"
    echo "CXL-ACCEL-GUEST-DONE rc=$rc"
else
    echo "cxl-accel guest ($(uname -r)): interactive shell; exit to power off"
    setsid cttyhack sh -l
fi
sync
poweroff -f
EOF
chmod 755 "$STAGE/init"

mkdir -p "$(dirname "$OUT")"
(cd "$STAGE" && find . -print0 | LC_ALL=C sort -z | cpio --null -o -H newc -R 0:0 --quiet) | gzip -6 >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "mkinitramfs: $OUT ($(du -h "$OUT" | cut -f1); modules: $(wc -l <"$LOAD_LIST"))" >&2
