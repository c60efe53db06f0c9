#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
# shellcheck disable=SC2317 # steps are called through run_step
# Bring a host to the point where cxl-accel guests boot (nothing compiled; with
# --peer-rng, the latency benchmark's peer):
#   - host packages (apt-get install from the host's own apt sources);
#   - QEMU: QEMU= if given; else a qemu-system-x86_64 >= 10.2 on PATH that has
#     vhost-user-test-device-pci; else Debian's qemu-system-x86 from
#     trixie-backports (11.1), installed into a minimal Debian trixie root in
#     the cache (debootstrap) and run from there with that root's libraries;
#   - the Debian 6.12 guest kernel and headers (bookworm-backports), unpacked
#     into the cache (never installed on the host);
#   - with --kernel 7.3: Debian's 7.3 guest kernel (trixie-backports) as well,
#     its headers and compiler in the trixie root (its modules build there),
#     and ndctl's cxl tool there (the CXL guests carry it: cxl list);
#   - with --qemu-floor: QEMU 10.2 built from Debian's source package, the
#     documented minimum (about 10 minutes, once);
#   - with --qemu-cxl: the same QEMU 10.2 with qemu/patches applied (the CXL
#     windows reach the device memory BAR, x-cxl-mem-bar; about 10 minutes,
#     once per version of the patches), never the default;
#   - with --linux-source: the Linux source of each guest kernel, for the
#     kernel's own HMM selftests: Debian's 6.12 source tarball (bookworm-
#     backports) and, with --kernel 7.3, the linux-source-7.3 package
#     (trixie-backports); both kept packed in the cache, with only the
#     selftests' part unpacked;
#   - with --peer-rng: rust-vmm's vhost-device-rng from crates.io (cargo
#     install, into $CACHE/bin): the virtio peer of the latency benchmark
#     (ci/test.sh asks for it; the demo does not).
# The host's apt configuration is never changed: every extra Debian suite is
# read through a private apt configuration in the cache. Every step is
# skipped when already done and prints a line at least every 15 s while it
# works. Writes "$CACHE/env.sh" (6.12), "$CACHE/env-7.3.sh",
# "$CACHE/qemu-10.2.env" and "$CACHE/qemu-cxl.env" (see ci/README.md).
#
# Usage: ci/setup.sh [--kernel 7.3] [--qemu-floor] [--qemu-cxl] [--linux-source] [--peer-rng]
#        ci/setup.sh --check-host
#   --check-host  only say whether the automated set-up knows this host
#                 (CXL_ACCEL_OS_RELEASE: another os-release file, for tests)
# Overrides (each skips its step):
#   QEMU=/path/to/qemu-system-x86_64
#   GUEST_KERNEL=/path/to/bzImage  KDIR=/path/to/kernel/build/dir
#     (optionally GUEST_MODULES=/lib/modules/<kver> dir and GUEST_KVER=<kver>)
# Other knobs: CXL_ACCEL_CACHE (cache dir), CXL_ACCEL_JOBS (ninja -j, default 2),
#   DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=ci/lib.sh
. "$HERE/lib.sh"

MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
JOBS="${CXL_ACCEL_JOBS:-2}"
QEMU_MIN=10.2
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

WANT_73=0
WANT_FLOOR=0
WANT_CXL=0
WANT_SRC=0
WANT_RNG=0
CHECK_HOST=0
OS_RELEASE=${CXL_ACCEL_OS_RELEASE:-/etc/os-release}
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help)
        script_help "$0" 4
        exit 0
        ;;
    --kernel)
        [ "${2:-}" = 7.3 ] || die "ci/setup.sh: --kernel takes 7.3 (6.12 is always set up)"
        WANT_73=1
        shift 2
        ;;
    --qemu-floor) WANT_FLOOR=1; shift ;;
    --qemu-cxl) WANT_CXL=1; shift ;;
    --linux-source) WANT_SRC=1; shift ;;
    --peer-rng) WANT_RNG=1; shift ;;
    --check-host) CHECK_HOST=1; shift ;;
    *) die "ci/setup.sh: unknown argument '$1' (see --help)" ;;
    esac
done

mkdir -p "$CACHE"
TIMINGS=()

run_step() {
    local name=$1 t0 dt
    shift
    t0=$(now)
    log "== $name"
    "$@"
    dt=$(elapsed "$t0")
    TIMINGS+=("$(printf '%-12s %7ss' "$name" "$dt")")
    log "== $name done in ${dt}s"
}

# --------------------------------------------------------------- host

HOST_PACKAGES=(
    build-essential busybox-static dwarves xz-utils bzip2 cpio kmod python3
    ca-certificates curl dpkg-dev debootstrap
)
# QEMU 10.2 from source: its build dependencies and Debian's firmware
FLOOR_PACKAGES=(
    ninja-build libglib2.0-dev libfdt-dev libpixman-1-dev flex bison
    device-tree-compiler pkg-config python3-venv seabios qemu-system-data
)

# The set-up knows Debian 12 and 13; elsewhere everything must be given.
step_host() {
    local id ver
    # shellcheck source=/dev/null
    id=$(. "$OS_RELEASE" 2>/dev/null && echo "${ID:-unknown}")
    # shellcheck source=/dev/null
    ver=$(. "$OS_RELEASE" 2>/dev/null && echo "${VERSION_ID:-}")
    case "$id:$ver" in
    debian:12 | debian:13)
        log "host: Debian $ver"
        return 0
        ;;
    esac
    if [ -n "${QEMU:-}" ] && [ -n "${GUEST_KERNEL:-}" ] && [ -n "${KDIR:-}" ]; then
        log "host: $id $ver (not Debian 12/13): using QEMU=, GUEST_KERNEL= and KDIR= as given"
        return 0
    fi
    die "ci/setup.sh: this host is $id $ver; the automated set-up knows Debian 12 and 13 only. Elsewhere install QEMU >= $QEMU_MIN, a guest kernel and its headers yourself and run with QEMU=, GUEST_KERNEL= and KDIR= (Ubuntu: apt install qemu-system-x86 busybox-static cpio kmod xz-utils python3 build-essential dwarves linux-headers-generic; Fedora: dnf install qemu-system-x86-core busybox cpio kmod xz python3 gcc make dwarves kernel-devel)."
}

step_packages() {
    local want=("${HOST_PACKAGES[@]}")
    [ "$WANT_FLOOR" = 0 ] || want+=("${FLOOR_PACKAGES[@]}")
    install_missing "cxl-accel setup" "${want[@]}"
}

# ------------------------------------------------- private apt configurations

# apt run against a configuration of its own in $CACHE/apt/NAME (sources,
# lists, cache), so that suites the host does not use (bookworm-backports,
# unstable's sources) never enter /etc/apt.
papt_dir() { echo "$CACHE/apt/$1"; }

papt_init() { # name sources-line...
    local d
    d=$(papt_dir "$1")
    shift
    mkdir -p "$d/parts" "$d/lists/partial" "$d/cache/archives/partial"
    printf '%s\n' "$@" >"$d/sources.list.new"
    : >"$d/preferences"
    if ! cmp -s "$d/sources.list.new" "$d/sources.list" 2>/dev/null; then
        mv "$d/sources.list.new" "$d/sources.list"
        rm -f "$d/.updated"
    else
        rm -f "$d/sources.list.new"
    fi
}

papt_opts() { # name
    local d
    d=$(papt_dir "$1")
    echo "-o Dir::Etc::SourceList=$d/sources.list -o Dir::Etc::SourceParts=$d/parts" \
        "-o Dir::Etc::Preferences=$d/preferences -o Dir::Etc::PreferencesParts=$d/parts" \
        "-o Dir::State::Lists=$d/lists -o Dir::Cache=$d/cache -o APT::Sandbox::User=root"
}

papt() { # name apt-get-args...
    local n=$1
    shift
    # shellcheck disable=SC2046 # the options are words without blanks
    apt-get -q $(papt_opts "$n") "$@"
}

papt_cache() { # name apt-cache-args...
    local n=$1
    shift
    # shellcheck disable=SC2046
    apt-cache $(papt_opts "$n") "$@"
}

papt_update() { # name
    local d
    d=$(papt_dir "$1")
    [ -e "$d/.updated" ] && return 0
    with_progress "apt index ($1)" "$d/update.log" papt "$1" update ||
        { tail -n 5 "$d/update.log" >&2; die "cxl-accel setup: cannot read the $1 apt index (see $d/update.log)"; }
    touch "$d/.updated"
}

BPO=bookworm-backports
bpo_apt() {
    papt_init "$BPO" "deb [signed-by=$KEYRING] $MIRROR bookworm-backports main" \
        "deb-src [signed-by=$KEYRING] $MIRROR bookworm-backports main"
    papt_update "$BPO"
}

# ------------------------------------------------------------ guest kernels

# Make a dpkg -x'd tree self-contained: absolute symlinks (e.g. the headers'
# scripts/ -> /usr/lib/linux-kbuild-*/scripts) are re-pointed into the tree.
fix_abs_symlinks() {
    local root=$1 link target
    while IFS= read -r -d '' link; do
        target=$(readlink "$link")
        case "$target" in
        /*) ln -sfn "$root$target" "$link" ;;
        esac
    done < <(find "$root" -type l -print0)
    # The arch headers' Makefile includes the -common one by absolute path.
    local f
    grep -rIlE '/usr/(src/linux-headers|lib/linux-kbuild)' "$root/usr/src" 2>/dev/null |
        while IFS= read -r f; do
            sed -i -E "s#(^|[^/[:alnum:]._+-])/usr/(src|lib)/linux-#\1$root/usr/\2/linux-#g" "$f"
        done
}

# Build a trivial GPL module: proves the kernel build tree works (pahole,
# kbuild, symlinks) with the make given (KMAKE: make, or make in the root).
verify_kdir() { # kdir kver make...
    local kdir=$1 kver=$2 t vm
    shift 2
    t=$(mktemp -d "$CACHE/kmod-check.XXXXXX")
    cat >"$t/hello.c" <<'EOF'
#include <linux/module.h>
#include <linux/dma-buf.h>
#include <linux/version.h>
static int __init hello_init(void) { pr_info("cxl-accel hello\n"); return 0; }
static void __exit hello_exit(void) { }
module_init(hello_init);
module_exit(hello_exit);
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
MODULE_IMPORT_NS("DMA_BUF");
#else
MODULE_IMPORT_NS(DMA_BUF);
#endif
MODULE_LICENSE("GPL");
EOF
    echo 'obj-m := hello.o' >"$t/Makefile"
    if ! (cd "$t" && with_progress "building a test module for $kver" "$t/build.log" \
        "$@" -C "$kdir" M="$t" modules) || [ ! -f "$t/hello.ko" ]; then
        tail -n 20 "$t/build.log" >&2
        die "cxl-accel setup: test module does not build against $kdir (log: $t/build.log)"
    fi
    vm=$(modinfo -F vermagic "$t/hello.ko")
    case "$vm" in
    "$kver "*) ;;
    *) die "cxl-accel setup: test module vermagic '$vm' does not match kernel $kver" ;;
    esac
    rm -rf "$t"
    log "test module built against $kdir (vermagic: $vm)"
}

kernel_moddir() {
    local d
    for d in "$1/lib/modules/$2" "$1/usr/lib/modules/$2"; do
        [ -d "$d" ] && { echo "$d"; return 0; }
    done
    die "cxl-accel setup: no modules directory for $2 under $1"
}

# Record what the project relies on in a guest kernel's config.
kernel_report() { # config moddir out
    local config=$1 moddir=$2 out=$3 o v
    [ -f "$config" ] || { log "no kernel config at $config; skipping report"; return 0; }
    {
        echo "# Guest kernel: options the project relies on (y=built-in, m=module, n=off)"
        for o in ZONE_DEVICE DEVICE_PRIVATE HMM_MIRROR DEVICE_MIGRATION MMU_NOTIFIER \
            DMA_SHARED_BUFFER UDMABUF DMABUF_HEAPS_SYSTEM PCI_P2PDMA NUMA ACPI_HMAT \
            TEST_HMM GUP_TEST MODULE_SIG MODULE_SIG_FORCE DEBUG_INFO_BTF_MODULES; do
            v=$(sed -n "s/^CONFIG_$o=//p" "$config")
            printf '%-24s %s\n' "$o" "${v:-n}"
        done
        echo "# virtio device IDs with a modular driver (modules.alias)"
        grep -E '^alias virtio:d' "$moddir/modules.alias" | while read -r _ a _; do
            a=${a#virtio:d}
            echo "$((16#${a%%v*}))"
        done | sort -n -u | tr '\n' ' '
        echo
    } >"$out"
}

# Unpack .debs into DIR (which must not exist yet), atomically.
unpack_debs() { # dir deb...
    local dir=$1 d
    shift
    rm -rf "$dir.tmp"
    mkdir -p "$dir.tmp"
    for d in "$@"; do dpkg -x "$d" "$dir.tmp"; done
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
}

# Debian's newest 6.12 generic amd64 kernel, image and headers, from
# bookworm-backports, unpacked into $CACHE/kernel/<kver>/root.
step_kernel_612() {
    if [ -n "${GUEST_KERNEL:-}" ] && [ -n "${KDIR:-}" ]; then
        [ -f "$GUEST_KERNEL" ] || die "cxl-accel setup: GUEST_KERNEL=$GUEST_KERNEL does not exist"
        [ -d "$KDIR" ] || die "cxl-accel setup: KDIR=$KDIR does not exist"
        GUEST_KVER=${GUEST_KVER:-$(cat "$KDIR/include/config/kernel.release" 2>/dev/null || true)}
        GUEST_MODULES=${GUEST_MODULES:-}
        log "using GUEST_KERNEL=$GUEST_KERNEL KDIR=$KDIR (kver ${GUEST_KVER:-unknown})"
        return 0
    fi
    local base=$CACHE/kernel
    if [ ! -e "$base/current/.done" ]; then
        bpo_apt
        local img kver deps pkgs debs root moddir
        img=$(papt_cache "$BPO" pkgnames linux-image-6.12. |
            grep -E '^linux-image-6\.12\.[0-9]+[^-]*-amd64(-unsigned)?$' | sort -V | tail -n 1 || true)
        [ -n "$img" ] || die "cxl-accel setup: cannot find linux-image-6.12.*-amd64 in bookworm-backports; set GUEST_KERNEL= and KDIR="
        kver=${img#linux-image-}
        kver=${kver%-unsigned}
        log "guest kernel package: $img (kver $kver)"
        # Headers pull in -common and linux-kbuild-*: their names come from
        # the Depends line instead of a guess at the naming scheme.
        deps=$(papt_cache "$BPO" show --no-all-versions "linux-headers-$kver" 2>/dev/null |
            sed -n 's/^Depends: //p' | tr ',' '\n' | awk '{print $1}' |
            grep -E '^linux-(headers|kbuild)-' || true)
        [ -n "$deps" ] || die "cxl-accel setup: cannot find linux-headers-$kver in bookworm-backports; set GUEST_KERNEL= and KDIR="
        # shellcheck disable=SC2206
        pkgs=("$img" "linux-headers-$kver" $deps)
        debs=$base/debs/$kver
        mkdir -p "$debs"
        (cd "$debs" && with_progress "downloading ${pkgs[*]}" "$debs/download.log" \
            papt "$BPO" download "${pkgs[@]}") ||
            { tail -n 5 "$debs/download.log" >&2; die "cxl-accel setup: cannot download linux-image/headers $kver from bookworm-backports; set GUEST_KERNEL= and KDIR="; }
        root=$base/$kver/root
        with_progress "unpacking $kver" "$debs/unpack.log" unpack_debs "$root" "$debs"/*.deb ||
            die "cxl-accel setup: cannot unpack $kver (see $debs/unpack.log)"
        fix_abs_symlinks "$root"
        moddir=$(kernel_moddir "$root" "$kver")
        # The package ships no modules.dep/alias (dpkg's postinst makes them).
        depmod -b "$root" "$kver" ||
            die "cxl-accel setup: depmod failed for $kver in $root (kmod too old for .ko.xz?)"
        verify_kdir "$root/usr/src/linux-headers-$kver" "$kver" make
        kernel_report "$root/boot/config-$kver" "$moddir" "$base/$kver/config-report.txt"
        echo "$kver" >"$base/$kver/kver"
        touch "$base/$kver/.done"
        ln -sfn "$kver" "$base/current"
    fi
    GUEST_KVER=$(cat "$base/current/kver")
    local root
    root=$(cd "$base/current/root" && pwd -P)
    GUEST_KERNEL=$root/boot/vmlinuz-$GUEST_KVER
    KDIR=$root/usr/src/linux-headers-$GUEST_KVER
    GUEST_MODULES=$(kernel_moddir "$root" "$GUEST_KVER")
    log "guest kernel $GUEST_KVER ready in $root"
}

# ------------------------------------------------------------- trixie root

TRIXIE=$CACHE/trixie
TROOT=$TRIXIE/root

# A minimal Debian trixie with trixie-backports, for Debian's QEMU 11.1 and
# for building modules for Debian's 7.3 kernel (its build tools need
# trixie's C library).
step_trixie_root() {
    [ -e "$TRIXIE/.root-done" ] && return 0
    [ "$(id -u)" = 0 ] || die "cxl-accel setup: building the Debian trixie root needs root (debootstrap); or set QEMU=/path/to/qemu-system-x86_64 (>= $QEMU_MIN)"
    mkdir -p "$TRIXIE"
    rm -rf "$TROOT.tmp"
    with_progress "debootstrap trixie" "$TRIXIE/debootstrap.log" \
        debootstrap --variant=minbase trixie "$TROOT.tmp" "$MIRROR" ||
        { tail -n 10 "$TRIXIE/debootstrap.log" >&2; rm -rf "$TROOT.tmp"; die "cxl-accel setup: debootstrap of Debian trixie failed (see $TRIXIE/debootstrap.log); or set QEMU=/path/to/qemu-system-x86_64 (>= $QEMU_MIN)"; }
    echo "deb $MIRROR trixie-backports main" >"$TROOT.tmp/etc/apt/sources.list.d/trixie-backports.list"
    rm -rf "$TROOT"
    mv "$TROOT.tmp" "$TROOT"
    write_root_runner
    with_progress "apt index (trixie root)" "$TRIXIE/apt-update.log" "$TRIXIE/run" apt-get update -q ||
        { tail -n 5 "$TRIXIE/apt-update.log" >&2; die "cxl-accel setup: apt-get update in the trixie root failed"; }
    touch "$TRIXIE/.root-done"
}

# $TRIXIE/run CMD...: CMD in the trixie root, in the current directory, with
# the host's /proc, /sys, /dev, /tmp, $HOME and the current directory at the
# same paths. A private mount namespace: nothing stays mounted afterwards.
write_root_runner() {
    cat >"$TRIXIE/run" <<EOF
#!/bin/sh
# Written by ci/setup.sh: runs a command in the cached Debian trixie root.
exec unshare --mount --propagation private -- sh -c '
    root=\$1; shift
    for d in /proc /sys /dev /tmp "\$HOME" "\$PWD"; do
        [ -d "\$d" ] || continue
        mkdir -p "\$root\$d" && mount --rbind "\$d" "\$root\$d" || exit 1
    done
    exec chroot "\$root" /bin/sh -c "cd \"\\\$0\" && exec \"\\\$@\"" "\$PWD" "\$@"
' sh "$TROOT" "\$@"
EOF
    chmod +x "$TRIXIE/run"
}

root_install() { # package... (from trixie-backports where it has them)
    local missing=() p
    for p in "$@"; do
        # shellcheck disable=SC2016 # dpkg-query's format, not ours
        [ "$(chroot "$TROOT" dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" = "install ok installed" ] ||
            missing+=("$p")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    with_progress "installing ${missing[*]} in the trixie root" "$TRIXIE/apt-install.log" \
        "$TRIXIE/run" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends -t trixie-backports "${missing[@]}" ||
        { tail -n 10 "$TRIXIE/apt-install.log" >&2; die "cxl-accel setup: cannot install ${missing[*]} in the trixie root (see $TRIXIE/apt-install.log)"; }
}

# Debian's newest 7.3 kernel from trixie-backports: image, modules and base
# files unpacked into $CACHE/kernel/<kver>/root, headers and compiler installed in
# the trixie root (module builds run there: KMAKE).
step_kernel_73() {
    local base=$CACHE/kernel kver
    step_trixie_root
    if [ ! -e "$base/current-7.3/.done" ]; then
        kver=$(chroot "$TROOT" apt-cache pkgnames linux-headers-7.3. |
            grep -E '^linux-headers-7\.3\.[0-9]+[^-]*-amd64$' | sed 's/^linux-headers-//' | sort -V | tail -n 1 || true)
        [ -n "$kver" ] || die "cxl-accel setup: trixie-backports has no linux-headers-7.3.*-amd64"
        log "guest kernel 7.3: $kver"
        root_install "linux-headers-$kver" make gcc libc6-dev dwarves kmod
        local debs=$base/debs/$kver
        mkdir -p "$debs"
        (cd "$debs" && with_progress "downloading linux-binary/modules $kver" "$debs/download.log" \
            "$TRIXIE/run" apt-get download -q -o APT::Sandbox::User=root \
            "linux-binary-$kver" "linux-modules-$kver" "linux-base-$kver") ||
            { tail -n 5 "$debs/download.log" >&2; die "cxl-accel setup: cannot download the $kver kernel from trixie-backports"; }
        local root=$base/$kver/root moddir
        with_progress "unpacking $kver" "$debs/unpack.log" unpack_debs "$root" "$debs"/*.deb ||
            die "cxl-accel setup: cannot unpack $kver (see $debs/unpack.log)"
        moddir=$(kernel_moddir "$root" "$kver")
        # (the package has no modules.order: depmod says so, harmlessly)
        depmod -b "$root/usr" "$kver" 2>/dev/null ||
            die "cxl-accel setup: depmod failed for $kver in $root"
        verify_kdir "/usr/src/linux-headers-$kver" "$kver" "$TRIXIE/run" make
        kernel_report "$TROOT/usr/src/linux-headers-$kver/.config" "$moddir" \
            "$base/$kver/config-report.txt"
        echo "$kver" >"$base/$kver/kver"
        touch "$base/$kver/.done"
        ln -sfn "$kver" "$base/current-7.3"
    fi
    # ndctl's cxl tool, which the CXL guests carry (run-guest.sh, cxl list)
    root_install cxl
    kver=$(cat "$base/current-7.3/kver")
    local root moddir
    root=$(cd "$base/current-7.3/root" && pwd -P)
    moddir=$(kernel_moddir "$root" "$kver")
    K73_KVER=$kver
    K73_KERNEL=$moddir/vmlinuz
    [ -f "$K73_KERNEL" ] || K73_KERNEL=$root/boot/vmlinuz-$kver
    K73_MODULES=$moddir
    K73_KDIR=/usr/src/linux-headers-$kver
    log "guest kernel $kver ready in $root (modules build in $TROOT)"
}

# -------------------------------------------------------------------- QEMU

has_test_device() {
    "$1" -device help 2>/dev/null | grep -q '"vhost-user-test-device-pci"'
}

QEMU_FW=
step_qemu() {
    local v sys
    if [ -n "${QEMU:-}" ]; then
        [ -x "$QEMU" ] || die "cxl-accel setup: QEMU=$QEMU is not executable"
        v=$(qemu_version "$QEMU")
        version_ge "${v:-0}" "$QEMU_MIN" || log "warning: QEMU=$QEMU is version ${v:-unknown} (< $QEMU_MIN)"
        QEMU_FW=${QEMU_FIRMWARE_ARGS:-}
        log "using QEMU=$QEMU ($v)"
        return 0
    fi
    sys=$(command -v qemu-system-x86_64 || true)
    if [ -n "$sys" ] && version_ge "$(qemu_version "$sys")" "$QEMU_MIN" && has_test_device "$sys"; then
        QEMU=$sys
        log "using $sys ($(qemu_version "$sys"))"
        return 0
    fi
    [ -z "$sys" ] || log "$sys is $(qemu_version "$sys") (needs >= $QEMU_MIN with vhost-user-test-device-pci): using Debian's trixie-backports package"
    step_trixie_root
    root_install qemu-system-x86
    # Run with the root's own loader and libraries: no chroot, so every host
    # path (sockets, memory files) stays visible.
    write_qemu_wrapper "$TRIXIE/qemu-system-x86_64" "$TROOT"
    QEMU=$TRIXIE/qemu-system-x86_64
    QEMU_FW="-L $TROOT/usr/share/seabios -L $TROOT/usr/share/qemu"
    has_test_device "$QEMU" || die "cxl-accel setup: $QEMU has no vhost-user-test-device-pci"
    log "using Debian's QEMU $(qemu_version "$QEMU") from the trixie root"
}

# QEMU 10.2 from Debian's source package: the documented minimum.
QEMU_DIR=$CACHE/qemu
QEMU_FLOOR=$QEMU_DIR/bin/qemu-system-x86_64
UNSTABLE_SRC=unstable-src

fetch_qemu_source() {
    papt_init "$UNSTABLE_SRC" "deb-src [signed-by=$KEYRING] $MIRROR unstable main"
    local src=$QEMU_DIR/src
    mkdir -p "$src"
    if ! compgen -G "$src/qemu_10.2*.dsc" >/dev/null; then
        papt_update "$UNSTABLE_SRC"
        # The index lists versions whose files the mirror may not serve (yet):
        # the newest 10.2.x that downloads.
        local v ok=0
        for v in $(papt_cache "$UNSTABLE_SRC" madison qemu | awk -F'|' '{gsub(/ /, "", $2); print $2}' | sort -rV); do
            case "$(echo "$v" | sed -E 's/^[0-9]+://')" in 10.2.*) ;; *) continue ;; esac
            log "downloading qemu source $v"
            if (cd "$src" && papt "$UNSTABLE_SRC" source --download-only "qemu=$v") >>"$QEMU_DIR/apt-src.log" 2>&1; then
                ok=1
                break
            fi
            log "qemu source $v is listed but not downloadable; trying another"
            rm -f "$src"/qemu_*
        done
        [ "$ok" = 1 ] || { tail -n 5 "$QEMU_DIR/apt-src.log" >&2; die "cxl-accel setup: cannot download a qemu 10.2 source package from Debian unstable"; }
    fi
    QEMU_ORIG=$(printf '%s\n' "$src"/qemu_10.2*.orig.tar.* | sort -V | tail -n 1)
    QEMU_SRC_VERSION=$(basename "$QEMU_ORIG" | sed -E 's/^qemu_([0-9.]+).*/\1/')
}

# build_qemu_10_2 OUT NAME [PATCH...]: QEMU 10.2 from Debian's source package,
# with the patches applied, into OUT (a source and a build directory of its
# own per NAME).
build_qemu_10_2() {
    local out=$1 name=$2
    shift 2
    fetch_qemu_source
    local ver=$QEMU_SRC_VERSION p
    local srcdir=$QEMU_DIR/qemu-$ver$name build=$QEMU_DIR/build-$ver$name venv=$QEMU_DIR/venv
    if [ ! -e "$srcdir/.unpacked" ]; then
        rm -rf "$srcdir" "$srcdir.tmp" "$build"
        mkdir -p "$srcdir.tmp"
        tar -xf "$QEMU_ORIG" -C "$srcdir.tmp" --strip-components=1
        # The +ds tarball strips the EDK2 firmware blobs that the build still
        # lists; empty archives satisfy it (firmware comes from Debian's packages).
        local fd
        # shellcheck disable=SC2013 # names without blanks
        for fd in $(grep -oE "edk2-[a-z0-9_.-]+\.fd" "$srcdir.tmp/pc-bios/meson.build" | sort -u); do
            [ -e "$srcdir.tmp/pc-bios/$fd.bz2" ] || bzip2 -c </dev/null >"$srcdir.tmp/pc-bios/$fd.bz2"
        done
        for p in "$@"; do
            log "applying $(basename "$p")"
            (cd "$srcdir.tmp" && git apply "$p") || die "cxl-accel setup: $p does not apply to QEMU $ver"
        done
        touch "$srcdir.tmp/.unpacked"
        mv "$srcdir.tmp" "$srcdir"
    fi
    # meson from bookworm is too old (1.0); QEMU wants >= 1.5.
    if [ ! -x "$venv/bin/meson" ]; then
        rm -rf "$venv"
        python3 -m venv "$venv"
        with_progress "pip install meson" "$QEMU_DIR/pip.log" "$venv/bin/pip" install -q 'meson>=1.5' pycotap ||
            { tail -n 5 "$QEMU_DIR/pip.log" >&2; die "cxl-accel setup: cannot pip install meson/pycotap from PyPI"; }
    fi
    local blog=$QEMU_DIR/build-$ver$name.log
    log "building QEMU $ver$name in $build (log: $blog, ninja -j$JOBS; about 10 min)"
    mkdir -p "$build"
    if [ ! -f "$build/build.ninja" ]; then
        (cd "$build" && with_progress "QEMU configure" "$blog" env PATH="$venv/bin:$PATH" "$srcdir/configure" \
            --python="$venv/bin/python3" \
            --target-list=x86_64-softmmu --without-default-features --enable-kvm --enable-tcg \
            --enable-vhost-user --disable-docs --disable-tools --disable-werror --disable-rust \
            --disable-install-blobs) ||
            { tail -n 20 "$blog" >&2; rm -f "$build/build.ninja"; die "cxl-accel setup: QEMU configure failed (see $blog)"; }
    fi
    (cd "$build" && with_progress "QEMU build" "$blog.ninja" env PATH="$venv/bin:$PATH" ninja -j"$JOBS" qemu-system-x86_64) ||
        { tail -n 20 "$blog.ninja" >&2; die "cxl-accel setup: QEMU build failed (see $blog.ninja)"; }
    mkdir -p "$(dirname "$out")"
    cp "$build/qemu-system-x86_64" "$out.tmp"
    mv "$out.tmp" "$out"
    log "QEMU $(qemu_version "$out") at $out"
}

step_qemu_floor() {
    if [ -x "$QEMU_FLOOR" ] && version_ge "$(qemu_version "$QEMU_FLOOR")" "$QEMU_MIN"; then
        log "QEMU $(qemu_version "$QEMU_FLOOR") at $QEMU_FLOOR"
        return 0
    fi
    build_qemu_10_2 "$QEMU_FLOOR" ""
}

# --qemu-cxl: QEMU 10.2 with qemu/patches (x-cxl-mem-bar: the CXL windows
# reach a vfio-user device's memory BAR). Named after the patches' hash, so
# that a changed patch builds anew.
CXL_PATCHES=("$HERE"/../qemu/patches/*.patch)
step_qemu_cxl() {
    local hash
    hash=$(cat "${CXL_PATCHES[@]}" | sha256sum | cut -c1-12)
    QEMU_CXL=$QEMU_DIR/bin-cxl-$hash/qemu-system-x86_64
    if [ -x "$QEMU_CXL" ]; then
        log "QEMU $(qemu_version "$QEMU_CXL") with qemu/patches at $QEMU_CXL"
        return 0
    fi
    # earlier versions of the patches: their sources, builds and binaries go
    local d
    for d in "$QEMU_DIR"/qemu-*-cxl-* "$QEMU_DIR"/build-*-cxl-* "$QEMU_DIR"/bin-cxl-*; do
        if [ -e "$d" ] && [[ "$d" != *"-cxl-$hash"* ]]; then
            rm -rf "$d"
        fi
    done
    build_qemu_10_2 "$QEMU_CXL" "-cxl-$hash" "${CXL_PATCHES[@]}"
}

# ------------------------------------------------------------ Linux source

LINUX_SRC=$CACHE/linux-src
# What the kernel's own HMM selftests (tests/kernel/run-hmm-tests.sh) need of
# a Linux source, unpacked into $LINUX_SRC/linux-<version>/; the rest stays
# packed (ci/debug-kernel.sh unpacks the whole 6.12 tree itself).
SRC_PARTS=(
    tools/testing/selftests/mm tools/testing/selftests/kselftest.h
    tools/testing/selftests/kselftest_harness.h tools/include
    'lib/test_hmm*' mm/gup_test.h
)

# SRC_PARTS of the tar.xz that COMMAND writes to its stdout (members under
# TOP/) into DIR.
extract_parts() { # dir top command...
    local dir=$1 top=$2 parts=() p
    shift 2
    for p in "${SRC_PARTS[@]}"; do parts+=("$top/$p"); done
    "$@" | tar -xJf - -C "$dir" --strip-components=1 --wildcards "${parts[@]}"
}

# Unpack SRC_PARTS into DEST (see extract_parts), unless it holds them.
unpack_source_parts() { # dest top command...
    local dest=$1
    shift
    if [ -e "$dest/.parts" ] && [ "$(cat "$dest/.parts")" = "${SRC_PARTS[*]}" ]; then
        log "Linux source: $dest"
        return 0
    fi
    rm -rf "$dest.tmp"
    mkdir -p "$dest.tmp"
    if ! with_progress "unpacking the selftests' part of $(basename "$dest")" "$dest.log" \
        extract_parts "$dest.tmp" "$@"; then
        tail -n 5 "$dest.log" >&2
        rm -rf "$dest.tmp"
        die "cxl-accel setup: cannot unpack the Linux source into $dest (see $dest.log)"
    fi
    echo "${SRC_PARTS[*]}" >"$dest.tmp/.parts"
    rm -rf "$dest"
    mv "$dest.tmp" "$dest"
    log "Linux source: $dest"
}

# Debian's Linux source tarball of the 6.12 series, the version of the 6.12
# guest kernel when bookworm-backports still serves it, else the newest that
# downloads (ci/debug-kernel.sh builds its kernel from it).
step_linux_source_612() {
    local dir=$LINUX_SRC want=${GUEST_KVER%%[+-]*} v tarball
    mkdir -p "$dir"
    if ! compgen -G "$dir/linux_6.12.*.orig.tar.xz" >/dev/null; then
        bpo_apt
        local ok=0 vers
        vers=$(papt_cache "$BPO" madison linux | awk -F'|' '{gsub(/ /, "", $2); print $2}' |
            grep '^6\.12\.' | sort -rV || true)
        # shellcheck disable=SC2046 # versions are words
        for v in $(grep "^$want-" <<<"$vers") $(grep -v "^$want-" <<<"$vers"); do
            if (cd "$dir" && with_progress "downloading the Linux $v source" "$dir/download.log" \
                papt "$BPO" source --download-only --tar-only "linux=$v"); then
                rm -f "$dir"/*.dsc "$dir"/*.debian.tar.*
                ok=1
                break
            fi
            log "linux source $v is listed but not downloadable; trying another"
        done
        [ "$ok" = 1 ] || die "cxl-accel setup: cannot download a Linux 6.12 source tarball from bookworm-backports"
    fi
    # the guest kernel's version if there, else the newest
    tarball=$dir/linux_$want.orig.tar.xz
    [ -f "$tarball" ] || tarball=$(printf '%s\n' "$dir"/linux_6.12.*.orig.tar.xz | sort -V | tail -n 1)
    v=$(basename "$tarball" | sed -E 's/^linux_([0-9.]+)\.orig.*/\1/')
    log "Linux source: $(basename "$tarball")"
    unpack_source_parts "$dir/linux-$v" "linux-$v" cat "$tarball"
}

# Debian's Linux 7.3 source: the binary package linux-source-7.3 of the 7.3
# guest kernel's version (trixie-backports, through the trixie root's apt: a
# 166 MB .deb with /usr/src/linux-source-7.3.tar.xz), downloaded, never
# installed.
step_linux_source_73() {
    local dir=$LINUX_SRC ver deb
    ver=$(dpkg-deb -f "$CACHE/kernel/debs/$K73_KVER/linux-binary-${K73_KVER}_"*.deb Version 2>/dev/null) ||
        die "cxl-accel setup: no linux-binary-$K73_KVER package in $CACHE/kernel/debs/$K73_KVER"
    deb=$dir/linux-source-7.3_${ver}_all.deb
    mkdir -p "$dir"
    if [ ! -f "$deb" ]; then
        # into a directory of its own: an interrupted download leaves no .deb
        rm -rf "$dir/download-7.3"
        mkdir -p "$dir/download-7.3"
        (cd "$dir/download-7.3" && with_progress "downloading linux-source-7.3 $ver (166 MB)" \
            "$dir/download-7.3.log" \
            "$TRIXIE/run" apt-get download -q -o APT::Sandbox::User=root "linux-source-7.3=$ver") ||
            { tail -n 5 "$dir/download-7.3.log" >&2; die "cxl-accel setup: cannot download linux-source-7.3=$ver from trixie-backports"; }
        mv "$dir/download-7.3/$(basename "$deb")" "$deb" ||
            die "cxl-accel setup: apt-get download left no $(basename "$deb")"
        rm -rf "$dir/download-7.3"
    fi
    log "Linux source: $(basename "$deb")"
    unpack_source_parts "$dir/linux-${K73_KVER%%[+-]*}" linux-source-7.3 \
        sh -c 'dpkg-deb --fsys-tarfile "$1" | tar -xOf - ./usr/src/linux-source-7.3.tar.xz' sh "$deb"
}

step_linux_source() {
    step_linux_source_612
    [ "$WANT_73" = 0 ] || step_linux_source_73
}

# ------------------------------------------------------- the virtio peer

# rust-vmm's vhost-device-rng (crates.io), the peer device the latency
# benchmark compares against (tests/guest/host/run-latency.sh): built once with
# cargo into $CACHE/bin (about 4 minutes on 2 cores).
RNG_VERSION=0.1.0
step_peer_rng() {
    local bin=$CACHE/bin/vhost-device-rng root=$CACHE/vhost-device-rng
    if [ -x "$bin" ]; then
        log "vhost-device-rng: $bin"
        return 0
    fi
    command -v cargo >/dev/null || { log "no cargo: vhost-device-rng not installed (the latency benchmark runs without its peer)"; return 0; }
    mkdir -p "$CACHE/bin"
    with_progress "cargo install vhost-device-rng $RNG_VERSION" "$CACHE/vhost-device-rng-install.log" \
        cargo install --locked --quiet -j "$JOBS" --version "$RNG_VERSION" --root "$root" vhost-device-rng ||
        { tail -n 10 "$CACHE/vhost-device-rng-install.log" >&2; die "cxl-accel setup: cannot build vhost-device-rng (see $CACHE/vhost-device-rng-install.log)"; }
    cp "$root/bin/vhost-device-rng" "$bin.tmp"
    mv "$bin.tmp" "$bin"
    rm -rf "$root"
    log "vhost-device-rng installed in $bin"
}

# --------------------------------------------------------------------- env

write_env() { # file kernel kver kdir modules kmake
    {
        echo "# Written by ci/setup.sh on $(date -u +%FT%TZ); source me (ci/lib.sh load_env)."
        printf 'export QEMU=%q\n' "$QEMU"
        printf 'export QEMU_FIRMWARE_ARGS=%q\n' "$QEMU_FW"
        printf 'export GUEST_KERNEL=%q\n' "$2"
        printf 'export GUEST_KVER=%q\n' "$3"
        printf 'export KDIR=%q\n' "$4"
        printf 'export GUEST_MODULES=%q\n' "$5"
        printf 'export KMAKE=%q\n' "$6"
    } >"$1.tmp"
    mv "$1.tmp" "$1"
    log "wrote $1"
}

step_env() {
    write_env "$CACHE/env.sh" "$GUEST_KERNEL" "${GUEST_KVER:-}" "$KDIR" "${GUEST_MODULES:-}" make
    if [ "$WANT_73" = 1 ]; then
        write_env "$CACHE/env-7.3.sh" "$K73_KERNEL" "$K73_KVER" "$K73_KDIR" "$K73_MODULES" "$TRIXIE/run make"
    fi
    if [ "$WANT_FLOOR" = 1 ]; then
        {
            echo "# Written by ci/setup.sh: QEMU 10.2 (CXL_ACCEL_QEMU_ENV=this file)."
            printf 'export QEMU=%q\n' "$QEMU_FLOOR"
            printf 'export QEMU_FIRMWARE_ARGS=%q\n' "-L /usr/share/seabios -L /usr/share/qemu"
        } >"$CACHE/qemu-10.2.env"
        log "wrote $CACHE/qemu-10.2.env"
    fi
    if [ "$WANT_CXL" = 1 ]; then
        {
            echo "# Written by ci/setup.sh: QEMU 10.2 with qemu/patches (CXL_ACCEL_QEMU_ENV=this file)."
            printf 'export QEMU=%q\n' "$QEMU_CXL"
            printf 'export QEMU_FIRMWARE_ARGS=%q\n' "-L /usr/share/seabios -L /usr/share/qemu"
        } >"$CACHE/qemu-cxl.env"
        log "wrote $CACHE/qemu-cxl.env"
    fi
}

main() {
    local t0
    if [ "$CHECK_HOST" = 1 ]; then
        step_host
        return 0
    fi
    t0=$(now)
    run_step host step_host
    run_step packages step_packages
    run_step kernel-6.12 step_kernel_612
    run_step qemu step_qemu
    [ "$WANT_73" = 0 ] || run_step kernel-7.3 step_kernel_73
    [ "$WANT_FLOOR" = 0 ] || run_step qemu-10.2 step_qemu_floor
    [ "$WANT_CXL" = 0 ] || run_step qemu-cxl step_qemu_cxl
    [ "$WANT_SRC" = 0 ] || run_step linux-source step_linux_source
    [ "$WANT_RNG" = 0 ] || run_step peer-rng step_peer_rng
    run_step env step_env
    echo "cxl-accel setup: timings" >&2
    printf '  %s\n' "${TIMINGS[@]}" "$(printf '%-12s %7ss' total "$(elapsed "$t0")")" >&2
    cat "$CACHE/env.sh"
}

# All in functions, so that editing this file while it runs is harmless.
main "$@"
exit
