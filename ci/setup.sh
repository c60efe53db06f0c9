#!/usr/bin/env bash
# shellcheck disable=SC2317 # steps are called through run_step
# Bring a Debian bookworm host to the point where cxl-accel guests can boot:
# host packages, a Debian 6.12 guest kernel + headers unpacked into the cache
# (never installed on the host), and a QEMU >= 10.2.
# Every step is skipped when already done; the result is "$CACHE/env.sh".
#
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

case "${1:-}" in
-h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed '/shellcheck/d; $d; s/^# \{0,1\}//'
    exit 0
    ;;
esac

mkdir -p "$CACHE"
TIMINGS=()

run_step() {
    local name=$1 t0 dt
    shift
    t0=$(now)
    log "== $name"
    "$@"
    dt=$(elapsed "$t0")
    TIMINGS+=("$(printf '%-10s %7ss' "$name" "$dt")")
    log "== $name done in ${dt}s"
}

# ---------------------------------------------------------------- packages

HOST_PACKAGES=(
    build-essential busybox-static dwarves seabios qemu-system-data
    xz-utils bzip2 cpio kmod python3 python3-venv ca-certificates curl
    ninja-build libglib2.0-dev libfdt-dev libpixman-1-dev flex bison
    device-tree-compiler pkg-config dpkg-dev
)

APT_UPDATED=0
apt_update() {
    [ "$APT_UPDATED" = 1 ] && return 0
    log "apt-get update"
    if ! apt-get update -q >"$CACHE/apt-update.log" 2>&1; then
        tail -n 20 "$CACHE/apt-update.log" >&2
        die "cxl-accel setup: apt-get update failed (see $CACHE/apt-update.log); fix the apt sources or network"
    fi
    APT_UPDATED=1
}

# The guest kernel comes from bookworm-backports. Backports is NotAutomatic,
# so adding it never changes what the host itself installs or upgrades.
BACKPORTS_LIST=/etc/apt/sources.list.d/cxl-accel-backports.sources
have_backports_source() {
    grep -qsE '^[^#]*bookworm-backports' /etc/apt/sources.list \
        /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources
}
have_backports_index() {
    compgen -G '/var/lib/apt/lists/*_dists_bookworm-backports_main_binary-amd64_Packages*' >/dev/null
}

step_packages() {
    local missing=() p
    for p in "${HOST_PACKAGES[@]}"; do
        pkg_installed "$p" || missing+=("$p")
    done
    local need_backports=1
    if [ -n "${GUEST_KERNEL:-}" ] && [ -n "${KDIR:-}" ]; then need_backports=0; fi
    [ -e "$CACHE/kernel/current/.done" ] && need_backports=0

    if [ "${#missing[@]}" -eq 0 ] && { [ "$need_backports" = 0 ] || { have_backports_source && have_backports_index; }; }; then
        log "all host packages present"
        return 0
    fi
    [ "$(id -u)" = 0 ] || die "cxl-accel setup: need root to install ${missing[*]:-the bookworm-backports source}; rerun as root or install them yourself"

    if [ "$need_backports" = 1 ] && ! have_backports_source; then
        log "adding $BACKPORTS_LIST"
        cat >"$BACKPORTS_LIST" <<EOF
# Added by cxl-accel ci/setup.sh: the guest kernel comes from here.
Types: deb
URIs: $MIRROR
Suites: bookworm-backports
Components: main
Signed-By: $KEYRING
EOF
    fi
    apt_update
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing: ${missing[*]}"
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
            >"$CACHE/apt-install.log" 2>&1; then
            tail -n 20 "$CACHE/apt-install.log" >&2
            die "cxl-accel setup: cannot install host packages (${missing[*]}); see $CACHE/apt-install.log"
        fi
    fi
}

# ------------------------------------------------------------ guest kernel

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

# Build a trivial GPL module: proves KDIR works (pahole, kbuild, symlinks).
verify_kdir() {
    local kdir=$1 kver=$2 t
    t=$(mktemp -d)
    cat >"$t/hello.c" <<'EOF'
#include <linux/module.h>
#include <linux/dma-buf.h>
static int __init hello_init(void) { pr_info("cxl-accel hello\n"); return 0; }
static void __exit hello_exit(void) { }
module_init(hello_init);
module_exit(hello_exit);
MODULE_IMPORT_NS(DMA_BUF);
MODULE_LICENSE("GPL");
EOF
    echo 'obj-m := hello.o' >"$t/Makefile"
    if ! make -C "$kdir" M="$t" modules >"$t/build.log" 2>&1 || [ ! -f "$t/hello.ko" ]; then
        tail -n 20 "$t/build.log" >&2
        die "cxl-accel setup: test module does not build against KDIR=$kdir (log: $t/build.log); install dwarves (pahole) or set KDIR="
    fi
    local vm
    vm=$(modinfo -F vermagic "$t/hello.ko")
    case "$vm" in
    "$kver "*) ;;
    *) die "cxl-accel setup: test module vermagic '$vm' does not match kernel $kver" ;;
    esac
    rm -rf "$t"
    log "test module built against $kdir (vermagic: $vm)"
}

# Record what the project relies on in the guest kernel config.
kernel_report() {
    local root=$1 kver=$2 moddir=$3 config out
    config=$root/boot/config-$kver
    out=$CACHE/kernel/$kver/config-report.txt
    [ -f "$config" ] || { log "no kernel config at $config; skipping report"; return 0; }
    {
        echo "# Guest kernel $kver: options the project relies on (y=built-in, m=module, n=off)"
        local o v
        for o in ZONE_DEVICE HMM_MIRROR DEVICE_MIGRATION MMU_NOTIFIER DMA_SHARED_BUFFER \
            UDMABUF DMABUF_HEAPS_SYSTEM NUMA ACPI_HMAT DEVICE_PRIVATE PCI_P2PDMA TEST_HMM \
            GUP_TEST MODULE_SIG MODULE_SIG_FORCE DEBUG_INFO_BTF_MODULES; do
            v=$(sed -n "s/^CONFIG_$o=//p" "$config")
            printf '%-24s %s\n' "$o" "${v:-n}"
        done
        echo "# virtio options"
        grep -E '^CONFIG_[A-Z0-9_]*VIRTIO[A-Z0-9_]*=' "$config" | sed 's/^CONFIG_//; s/=/ /' |
            awk '{ printf "%-24s %s\n", $1, $2 }'
        echo "# built-in virtio modules (modules.builtin)"
        grep -i virtio "$moddir/modules.builtin" | sed 's#.*/##; s/\.ko$//' | sort | tr '\n' ' '
        echo
        # Device IDs in aliases are hex (virtio:d0000001Bv* is ID 27).
        echo "# virtio device IDs with a modular driver (modules.alias; built-in drivers"
        echo "# such as virtio_console (3) and virtiofs (26) have no alias in 6.12)"
        grep -E '^alias virtio:d' "$moddir/modules.alias" | while read -r _ a m; do
            a=${a#virtio:d}
            echo "$((16#${a%%v*})) $m"
        done | sort -n -u | tr '\n' ' '
        echo
    } >"$out"
    cat "$out" >&2
}

step_kernel() {
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
        apt_update_if_no_kernel_candidates
        # Newest Debian 6.12 generic amd64 image (signed or -unsigned).
        local img kver
        img=$(apt-cache pkgnames linux-image-6.12. |
            grep -E '^linux-image-6\.12\.[0-9]+[^-]*-amd64(-unsigned)?$' | sort -V | tail -n 1 || true)
        [ -n "$img" ] || die "cxl-accel setup: cannot find linux-image-6.12.*-amd64 in bookworm-backports; set GUEST_KERNEL= and KDIR="
        kver=${img#linux-image-}
        kver=${kver%-unsigned}
        log "guest kernel package: $img (kver $kver)"

        # Headers pull in -common and linux-kbuild-*: take their exact names
        # from the Depends line instead of guessing the naming scheme.
        local deps pkgs
        deps=$(apt-cache show --no-all-versions "linux-headers-$kver" 2>/dev/null |
            sed -n 's/^Depends: //p' | tr ',' '\n' | awk '{print $1}' |
            grep -E '^linux-(headers|kbuild)-' || true)
        [ -n "$deps" ] || die "cxl-accel setup: cannot find linux-headers-$kver in bookworm-backports; set GUEST_KERNEL= and KDIR="
        # shellcheck disable=SC2206
        pkgs=("$img" "linux-headers-$kver" $deps)

        local debs=$base/debs/$kver
        mkdir -p "$debs"
        log "downloading ${pkgs[*]}"
        (cd "$debs" && apt-get download -q -o APT::Sandbox::User=root "${pkgs[@]}") >"$debs/download.log" 2>&1 ||
            { tail -n 5 "$debs/download.log" >&2; die "cxl-accel setup: cannot download linux-image/headers $kver from bookworm-backports; set GUEST_KERNEL= and KDIR="; }

        local root=$base/$kver/root
        rm -rf "$base/$kver.tmp"
        mkdir -p "$base/$kver.tmp"
        local d
        for d in "$debs"/*.deb; do dpkg -x "$d" "$base/$kver.tmp"; done
        rm -rf "$root"
        mkdir -p "$base/$kver"
        mv "$base/$kver.tmp" "$root"
        fix_abs_symlinks "$root"

        local moddir
        moddir=$(kernel_moddir "$root" "$kver")
        # The package ships no modules.dep/alias (dpkg's postinst makes them).
        depmod -b "$root" "$kver" ||
            die "cxl-accel setup: depmod failed for $kver in $root (kmod too old for .ko.xz?)"
        verify_kdir "$root/usr/src/linux-headers-$kver" "$kver"
        kernel_report "$root" "$kver" "$moddir"
        echo "$kver" >"$base/$kver/kver"
        touch "$base/$kver/.done"
        ln -sfn "$kver" "$base/current"
    fi
    GUEST_KVER=$(cat "$base/current/kver")
    local root=$base/current/root
    root=$(cd "$root" && pwd -P)
    GUEST_KERNEL=${GUEST_KERNEL:-$root/boot/vmlinuz-$GUEST_KVER}
    KDIR=${KDIR:-$root/usr/src/linux-headers-$GUEST_KVER}
    GUEST_MODULES=${GUEST_MODULES:-$(kernel_moddir "$root" "$GUEST_KVER")}
    log "guest kernel $GUEST_KVER ready in $root"
}

kernel_moddir() {
    local d
    for d in "$1/lib/modules/$2" "$1/usr/lib/modules/$2"; do
        [ -d "$d" ] && { echo "$d"; return 0; }
    done
    die "cxl-accel setup: no modules directory for $2 under $1"
}

apt_update_if_no_kernel_candidates() {
    if ! apt-cache pkgnames linux-image-6.12. | grep -q .; then
        have_backports_source || die "cxl-accel setup: no bookworm-backports apt source; rerun as root or set GUEST_KERNEL= and KDIR="
        apt_update
    fi
}

# -------------------------------------------------------------------- QEMU

# Prints "major.minor.patch" of a qemu binary, or nothing.
qemu_version() {
    "$1" --version 2>/dev/null | head -n 1 | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -n 1 || true
}

version_ge() { # $1 >= $2 ?
    [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n 1)" = "$2" ]
}

QEMU_DIR=$CACHE/qemu
QEMU_CACHED=$QEMU_DIR/bin/qemu-system-x86_64

step_qemu() {
    local v
    if [ -n "${QEMU:-}" ]; then
        [ -x "$QEMU" ] || die "cxl-accel setup: QEMU=$QEMU is not executable"
        v=$(qemu_version "$QEMU")
        version_ge "${v:-0}" "$QEMU_MIN" || log "warning: QEMU=$QEMU is version ${v:-unknown} (< $QEMU_MIN)"
        log "using QEMU=$QEMU ($v)"
        return 0
    fi
    local sys
    sys=$(command -v qemu-system-x86_64 || true)
    if [ -n "$sys" ] && version_ge "$(qemu_version "$sys")" "$QEMU_MIN"; then
        QEMU=$sys
        log "using $sys ($(qemu_version "$sys"))"
        return 0
    fi
    if [ -x "$QEMU_CACHED" ] && version_ge "$(qemu_version "$QEMU_CACHED")" "$QEMU_MIN"; then
        QEMU=$QEMU_CACHED
        log "using cached $QEMU ($(qemu_version "$QEMU"))"
        return 0
    fi
    build_qemu
    QEMU=$QEMU_CACHED
}

# A private apt configuration that only knows the *source* index of unstable:
# without a binary index for unstable no binary package can ever come from it,
# and the host's own apt state is left untouched.
UNSTABLE_APT=$CACHE/apt-unstable-src
unstable_apt() {
    apt-get -q \
        -o Dir::Etc::SourceList="$UNSTABLE_APT/sources.list" \
        -o Dir::Etc::SourceParts="$UNSTABLE_APT/parts" \
        -o Dir::Etc::Preferences="$UNSTABLE_APT/preferences" \
        -o Dir::Etc::PreferencesParts="$UNSTABLE_APT/parts" \
        -o Dir::State::Lists="$UNSTABLE_APT/lists" \
        -o Dir::Cache="$UNSTABLE_APT/cache" \
        -o APT::Sandbox::User=root \
        "$@"
}

unstable_apt_cache() {
    apt-cache \
        -o Dir::Etc::SourceList="$UNSTABLE_APT/sources.list" \
        -o Dir::Etc::SourceParts="$UNSTABLE_APT/parts" \
        -o Dir::State::Lists="$UNSTABLE_APT/lists" \
        -o Dir::Cache="$UNSTABLE_APT/cache" \
        "$@"
}

fetch_qemu_source() {
    mkdir -p "$UNSTABLE_APT/parts" "$UNSTABLE_APT/lists/partial" "$UNSTABLE_APT/cache/archives/partial"
    echo "deb-src [signed-by=$KEYRING] $MIRROR unstable main" >"$UNSTABLE_APT/sources.list"
    : >"$UNSTABLE_APT/preferences"
    local src=$QEMU_DIR/src
    mkdir -p "$src"
    if ! compgen -G "$src/qemu_*.dsc" >/dev/null; then
        unstable_apt update >"$QEMU_DIR/apt-src.log" 2>&1 ||
            { tail -n 5 "$QEMU_DIR/apt-src.log" >&2; die "cxl-accel setup: cannot fetch Debian unstable Sources index; set QEMU=/path/to/qemu-system-x86_64 (>= $QEMU_MIN)"; }
        # The Sources index can list versions (several, even) whose files the
        # mirror does not serve (yet): try the newest first, then older ones.
        local v ok=0
        for v in $(unstable_apt_cache madison qemu | awk -F'|' '{gsub(/ /, "", $2); print $2}' | sort -rV); do
            version_ge "$(echo "$v" | sed -E 's/^[0-9]+://; s/[+~-].*//')" "$QEMU_MIN" || continue
            log "downloading qemu source $v"
            if (cd "$src" && unstable_apt source --download-only "qemu=$v") >>"$QEMU_DIR/apt-src.log" 2>&1; then
                ok=1
                break
            fi
            log "qemu source $v is listed but not downloadable; trying an older one"
            rm -f "$src"/qemu_*
        done
        [ "$ok" = 1 ] || { tail -n 5 "$QEMU_DIR/apt-src.log" >&2; die "cxl-accel setup: cannot download a qemu source package >= $QEMU_MIN from Debian unstable; set QEMU=/path/to/qemu-system-x86_64 (>= $QEMU_MIN)"; }
    fi
    # Newest downloaded orig tarball, e.g. qemu_10.2.2+ds.orig.tar.xz.
    local orig
    orig=$(printf '%s\n' "$src"/qemu_*.orig.tar.* | sort -V | tail -n 1)
    QEMU_SRC_VERSION=$(basename "$orig" | sed -E 's/^qemu_([0-9.]+).*/\1/')
    QEMU_ORIG=$orig
    version_ge "$QEMU_SRC_VERSION" "$QEMU_MIN" ||
        die "cxl-accel setup: Debian unstable has qemu $QEMU_SRC_VERSION (< $QEMU_MIN); set QEMU=/path/to/qemu-system-x86_64 (>= $QEMU_MIN)"
}

build_qemu() {
    fetch_qemu_source
    local ver=$QEMU_SRC_VERSION
    local srcdir=$QEMU_DIR/qemu-$ver build=$QEMU_DIR/build-$ver venv=$QEMU_DIR/venv
    if [ ! -e "$srcdir/.unpacked" ]; then
        rm -rf "$srcdir" "$srcdir.tmp"
        mkdir -p "$srcdir.tmp"
        tar -xf "$QEMU_ORIG" -C "$srcdir.tmp" --strip-components=1
        # The +ds tarball strips the EDK2 firmware blobs that the build still
        # lists; empty archives satisfy it (firmware comes from Debian's packages).
        local fd
        # shellcheck disable=SC2013 # names without blanks
        for fd in $(grep -oE "edk2-[a-z0-9_.-]+\.fd" "$srcdir.tmp/pc-bios/meson.build" | sort -u); do
            [ -e "$srcdir.tmp/pc-bios/$fd.bz2" ] || bzip2 -c </dev/null >"$srcdir.tmp/pc-bios/$fd.bz2"
        done
        touch "$srcdir.tmp/.unpacked"
        mv "$srcdir.tmp" "$srcdir"
    fi
    # meson from bookworm is too old (1.0); QEMU wants >= 1.5.
    if [ ! -x "$venv/bin/meson" ]; then
        rm -rf "$venv"
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q 'meson>=1.5' pycotap >"$QEMU_DIR/pip.log" 2>&1 ||
            { tail -n 5 "$QEMU_DIR/pip.log" >&2; die "cxl-accel setup: cannot pip install meson/pycotap from PyPI; set QEMU=/path/to/qemu-system-x86_64 (>= $QEMU_MIN)"; }
    fi
    local blog=$QEMU_DIR/build-$ver.log
    log "building QEMU $ver in $build (log: $blog, ninja -j$JOBS; 4-10 min)"
    mkdir -p "$build"
    if [ ! -f "$build/build.ninja" ]; then
        (cd "$build" && PATH="$venv/bin:$PATH" "$srcdir/configure" \
            --python="$venv/bin/python3" \
            --target-list=x86_64-softmmu --without-default-features --enable-kvm --enable-tcg \
            --enable-vhost-user --disable-docs --disable-tools --disable-werror --disable-rust \
            --disable-install-blobs) >"$blog" 2>&1 ||
            { tail -n 20 "$blog" >&2; rm -f "$build/build.ninja"; die "cxl-accel setup: QEMU configure failed (see $blog); set QEMU=/path/to/qemu-system-x86_64 (>= $QEMU_MIN)"; }
    fi
    (cd "$build" && PATH="$venv/bin:$PATH" ninja -j"$JOBS" qemu-system-x86_64) >>"$blog" 2>&1 ||
        { tail -n 20 "$blog" >&2; die "cxl-accel setup: QEMU build failed (see $blog); set QEMU=/path/to/qemu-system-x86_64 (>= $QEMU_MIN)"; }
    mkdir -p "$QEMU_DIR/bin"
    cp "$build/qemu-system-x86_64" "$QEMU_CACHED.tmp"
    mv "$QEMU_CACHED.tmp" "$QEMU_CACHED"
    log "QEMU $(qemu_version "$QEMU_CACHED") at $QEMU_CACHED"
}

# --------------------------------------------------------------------- env

step_env() {
    local fw="-L /usr/share/seabios -L /usr/share/qemu"
    # Sanity: the generic vhost-user device must be there and creatable.
    if ! "$QEMU" -device help 2>/dev/null | grep -q '"vhost-user-test-device-pci"'; then
        log "warning: $QEMU has no vhost-user-test-device-pci (needs QEMU >= $QEMU_MIN)"
    fi
    local env=$CACHE/env.sh
    {
        echo "# Written by ci/setup.sh on $(date -u +%FT%TZ); source me."
        printf 'export QEMU=%q\n' "$QEMU"
        printf 'export QEMU_FIRMWARE_ARGS=%q\n' "$fw"
        printf 'export GUEST_KERNEL=%q\n' "$GUEST_KERNEL"
        printf 'export GUEST_KVER=%q\n' "${GUEST_KVER:-}"
        printf 'export KDIR=%q\n' "$KDIR"
        printf 'export GUEST_MODULES=%q\n' "${GUEST_MODULES:-}"
    } >"$env.tmp"
    mv "$env.tmp" "$env"
    log "wrote $env"
}

main() {
    local t0
    t0=$(now)
    run_step packages step_packages
    run_step kernel step_kernel
    run_step qemu step_qemu
    run_step env step_env
    echo "cxl-accel setup: timings" >&2
    printf '  %s\n' "${TIMINGS[@]}" "$(printf '%-10s %7ss' total "$(elapsed "$t0")")" >&2
    cat "$CACHE/env.sh"
}

# All in functions, so that editing this file while it runs is harmless.
main "$@"
exit
