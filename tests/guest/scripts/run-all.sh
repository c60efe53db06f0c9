#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Guest side of the cxl-accel driver tests (busybox sh). Loads cxl_accel.ko,
# runs cxl-accel-tests on every device, the multi-device, DMA-BUF, migration,
# race and demo programs, then the removal tests: unbind a device while a
# process holds mapped buffers, bind it again, unload and reload the module.
#
# Files are looked for next to this script, then in /cxl, then (programs) in
# PATH and (module) in /lib/modules/extra: cxl_accel.ko, cxl-accel-tests,
# cxl-accel-demo. If /init already loaded the module, it is used as it is.
# Prints "RESULT <name> PASS|FAIL <detail>".
# Environment: CXLA_TESTS="name ..." runs only these tests of the table;
# CXLA_QUICK=1 skips the slow ones (exhaustion, timeout).
# Kernel command line: cxlaccel.only=NAME[,NAME...] (ci/run-guest.sh --only)
# runs only these (module load and device checks always run). NAME is a
# suite: tests (cxl-accel-tests' table on every device), multi, dmabuf, hmm,
# stress, race, demo, removal (unbind, rebind, unload); or one test,
# SUITE.TEST as its RESULT line names it (hmm.migrate, dmabuf.fd_passing,
# race.garbage_ioctl_args, with or without the cxl-acceleN. in front) or a
# test of cxl-accel-tests' table (copy_roundtrip). A suite's extras (the
# benchmarks, the removal cases of hmm, race.unload_reload) run only when the
# whole suite is named.

# result, find_file, device_list, ensure_nodes, wait_for_line...
GL=$(dirname "$0")/guest-lib.sh
[ -f "$GL" ] || GL=/cxl/guest-lib.sh
# shellcheck source=tests/guest/scripts/guest-lib.sh
. "$GL"
KO=$(find_file cxl_accel.ko /lib/modules/extra)
TESTS=$(find_file cxl-accel-tests)
DEMO=$(find_file cxl-accel-demo)
if [ -z "$TESTS" ] || [ -z "$DEMO" ]; then
    result module_load FAIL "cxl-accel-tests or cxl-accel-demo not found"
    exit 1
fi

# cxlaccel.only: names without a device prefix; bare names of the table are "tests.NAME"
SUITES="tests multi dmabuf hmm stress race demo removal"
ONLY=
for o in $(sed -n 's/.*cxlaccel\.only=\([^ ]*\).*/\1/p' /proc/cmdline | tr ',' ' '); do
    o=$(echo "$o" | sed 's/^cxl-accel[0-9]*\.//')
    case " $SUITES " in
    *" ${o%%.*} "*) ;;
    *) if "$TESTS" -l | grep -qx "$o"; then o=tests.$o; else echo "run-all: cxlaccel.only: no suite or test '$o'"; fi ;;
    esac
    ONLY="$ONLY $o"
done
[ -z "$ONLY" ] || echo "run-all: only$ONLY"
want() { # suite: does any of it run?
    [ -z "$ONLY" ] && return 0
    for o in $ONLY; do
        case "$o" in "$1" | "$1".*) return 0 ;; esac
    done
    return 1
}
whole() { # suite: does all of it run?
    [ -z "$ONLY" ] && return 0
    for o in $ONLY; do [ "$o" = "$1" ] && return 0; done
    return 1
}
picks() { # suite: "-t TEST" for each SUITE.TEST named
    for o in $ONLY; do
        case "$o" in "$1".*) printf ' -t %s' "${o#"$1".}" ;; esac
    done
}

expected=$(expected_devices)

if [ -d /sys/module/cxl_accel ]; then
    how="loaded by /init"
elif [ -z "$KO" ]; then
    result module_load FAIL "cxl_accel.ko not found and the module is not loaded"
    exit 1
else
    how="insmod $KO"
    # shellcheck disable=SC2086
    insmod "$KO" ${CXLA_PARAMS:-} || how=
fi
if [ -n "$how" ]; then
    ensure_nodes
    n=$(device_list | wc -l)
    if [ "$n" = "$expected" ] && [ "$n" -gt 0 ]; then
        result module_load PASS "$how; $n device(s) bound: $(device_list | tr '\n' ' ')"
    else
        result module_load FAIL "$n device(s) bound, $expected virtio function(s) with ID 21"
    fi
else
    result module_load FAIL "insmod failed"
    dmesg | tail -n 20
    exit 1
fi
dmesg | grep -i 'cxl.accel' | sed 's/^/  dmesg: /'

# sysfs attributes agree with IDENTIFY's view
for dev in $(device_list); do
    s=/sys/class/cxl-accel/$dev
    size=$(cat "$s/devmem_size")
    free=$(cat "$s/devmem_free")
    gpa=$(cat "$s/devmem_gpa")
    subm=$(cat "$s/commands_submitted")
    if [ "$size" -gt 0 ] && [ "$free" = "$size" ] && [ "$gpa" != 0x0 ] && [ "$subm" -gt 0 ]; then
        result "$dev.sysfs" PASS "size $size free $free gpa $gpa mem_function $(cat "$s/mem_function") engines $(cat "$s/dma_engines") submitted $subm errors $(cat "$s/command_errors")"
    else
        result "$dev.sysfs" FAIL "size $size free $free gpa $gpa submitted $subm"
    fi
done

# How the device looks on PCI, as the host set it up (run-guest.sh passes
# cxlaccel.attach): shmem, one function whose own BAR is the memory; bar, the
# memory is BAR2 of an ivshmem-plain sibling in the same slot; cxl, one function
# (served over vfio-user) whose BAR4 is the memory.
want_attach=$(sed -n 's/.*cxlaccel\.attach=\([a-z]*\).*/\1/p' /proc/cmdline)
for dev in $(device_list); do
    s=/sys/class/cxl-accel/$dev
    vfn=$(basename "$(readlink -f "$s/device/..")")	# the virtio function
    slot=${vfn%.*}
    nfn=$(ls -d /sys/bus/pci/devices/"$slot".* | wc -l)
    attach=$(cat "$s/attach")
    mem=$(cat "$s/mem_function")
    detail="attach '$attach' (host: ${want_attach:-unknown}), memory in $mem, virtio function $vfn, $nfn PCI function(s) in slot $slot"
    case "$want_attach:$attach" in
    shmem:"shmem BAR"*)
        ok=$([ "$mem" = "$vfn" ] && [ "$nfn" = 1 ] && echo yes) ;;
    bar:"bar BAR2")
        ok=$([ "$mem" = "$slot.1" ] && [ "$nfn" = 2 ] && echo yes) ;;
    cxl:"shmem BAR4")
        ok=$([ "$mem" = "$vfn" ] && [ "$nfn" = 1 ] && echo yes) ;;
    *) ok= ;;
    esac
    if [ -n "$ok" ]; then
        result "$dev.pci_layout" PASS "$detail"
    else
        result "$dev.pci_layout" FAIL "$detail"
    fi
done

select_tests() {
    args=
    if ! whole tests; then
        args=$(picks tests)
    elif [ -n "${CXLA_TESTS:-}" ]; then
        for t in $CXLA_TESTS; do args="$args -t $t"; done
    elif [ -n "${CXLA_QUICK:-}" ]; then
        for t in $("$TESTS" -l); do
            case "$t" in
            alloc_exhaustion | timeout_quarantine | kill_during_command) ;;
            *) args="$args -t $t" ;;
            esac
        done
    fi
    echo "$args"
}

# the test table, on every device (in parallel when there are several)
if want tests; then
pids=
for dev in $(device_list); do
    # shellcheck disable=SC2046
    "$TESTS" -d "/dev/$dev" -p "$dev." $(select_tests) >"/tmp/$dev.out" 2>&1 &
    pids="$pids $!"
done
for p in $pids; do wait "$p" || RC=1; done
for dev in $(device_list); do cat "/tmp/$dev.out"; done
fi

if want multi; then "$TESTS" --multi || RC=1; fi

# DMA-BUF export/import, peer-to-peer, revocation (tests/guest/progs/dmabuf-tests.c),
# then the quick form of its benchmark (P2P copy next to a bounce through RAM).
DMABUF=$(find_file dmabuf-tests)
if ! want dmabuf; then
    :
elif [ -n "$DMABUF" ]; then
    # shellcheck disable=SC2046
    "$DMABUF" $(picks dmabuf) || RC=1
    if whole dmabuf; then "$DMABUF" --bench || RC=1; fi
else
    result dmabuf FAIL "dmabuf-tests not found"
fi

# Page migration and shared virtual memory (tests/guest/progs/hmm-tests.c): the
# table on every device in parallel, the two-device tests, the quick form of
# the migration benchmark, then unbind and module unload while a process has
# pages on device memory (they must come back to system RAM intact).
HMM=$(find_file hmm-tests)
HMMBENCH=$(find_file hmm-bench)
if ! want hmm; then
    :
elif ! whole hmm && [ -n "$HMM" ]; then
    # named tests only: the table on every device, the two-device ones
    for dev in $(device_list); do
        # shellcheck disable=SC2046
        "$HMM" -d "/dev/$dev" -p "$dev.hmm." -s 6 $(picks hmm) || RC=1
    done
    # shellcheck disable=SC2046
    set -- $(device_list)
    if [ $# -ge 2 ]; then
        # shellcheck disable=SC2046
        "$HMM" -d "/dev/$1" -P "/dev/$2" --peer-only -p "hmm." $(picks hmm) || RC=1
    fi
elif [ -n "$HMM" ] && [ -n "$HMMBENCH" ]; then
    pids=
    for dev in $(device_list); do
        "$HMM" -d "/dev/$dev" -p "$dev.hmm." -s 6 >"/tmp/$dev.hmm.out" 2>&1 &
        pids="$pids $!"
    done
    for p in $pids; do wait "$p" || RC=1; done
    # a private_thp test killed by its alarm cannot set the parameter back
    p=/sys/module/cxl_accel/parameters/private_thp
    [ ! -w "$p" ] || echo 1 >"$p"
    for dev in $(device_list); do cat "/tmp/$dev.hmm.out"; done
    # shellcheck disable=SC2046
    set -- $(device_list)
    if [ $# -ge 2 ]; then
        "$HMM" -d "/dev/$1" -P "/dev/$2" --peer-only -p "hmm." || RC=1
    fi
    # migrate_vma next to move_pages() to a RAM node (run-guest.sh --ram-node), same boot
    "$HMMBENCH" -d "/dev/$1" --quick || RC=1
    # where the driver's CPU copy of small windows stops paying (cpu_copy_pages)
    "$HMMBENCH" -d "/dev/$1" --sweep --rounds 3 || RC=1
    # coherent against private memory, same workloads, same boot (7.x)
    MODEBENCH=$(find_file mode-bench)
    if [ -n "$MODEBENCH" ]; then
        "$MODEBENCH" -d "/dev/$1" --quick || RC=1
    else
        result mode_bench FAIL "mode-bench not found"
    fi

    # unbind the last device while a process has 8 MiB on its memory
    hdev=$(device_list | tail -n 1)
    hvdev=$(basename "$(readlink "/sys/class/cxl-accel/$hdev/device")")
    rm -f /tmp/hmm-go
    "$HMM" --hold-migrated "/dev/$hdev" >/tmp/hmm-hold.out 2>&1 &
    holder=$!
    wait_for_line /tmp/hmm-hold.out 'HOLD READY' 300
    echo "$hvdev" >/sys/bus/virtio/drivers/cxl_accel/unbind
    # the holder closes its dead file first, so the device keeps its name
    wait_for_line /tmp/hmm-hold.out 'HOLD ioctl after removal' 100
    sleep 0.2
    echo "$hvdev" >/sys/bus/virtio/drivers/cxl_accel/bind
    ensure_nodes
    touch /tmp/hmm-go
    wait "$holder"
    hold_rc=$?
    sed 's/^/  /' /tmp/hmm-hold.out
    moved=$(dmesg | grep -o '[0-9]* migrated pages moved back to system RAM at removal, [0-9]* of them by CPU copy' | tail -n 1)
    if [ $hold_rc = 0 ] && grep -q 'HOLD DONE ok' /tmp/hmm-hold.out; then
        result hmm.unbind_with_migrated_pages PASS "unbind of $hdev: ${moved:-no eviction message}; data intact, process went on"
    else
        result hmm.unbind_with_migrated_pages FAIL "holder rc $hold_rc"
    fi

    # unload the module while a process (file closed) has pages on devices
    if [ -n "$KO" ]; then
        rm -f /tmp/hmm-go
        "$HMM" --hold-migrated "/dev/$1" --close >/tmp/hmm-hold.out 2>&1 &
        holder=$!
        wait_for_line /tmp/hmm-hold.out 'HOLD READY' 300
        if rmmod cxl_accel; then
            # shellcheck disable=SC2086
            insmod "$KO" ${CXLA_PARAMS:-}
            ensure_nodes
            touch /tmp/hmm-go
            wait "$holder"
            hold_rc=$?
            sed 's/^/  /' /tmp/hmm-hold.out
            if [ $hold_rc = 0 ] && grep -q 'HOLD DONE ok' /tmp/hmm-hold.out &&
                [ "$(device_list | wc -l)" = "$expected" ]; then
                result hmm.unload_with_migrated_pages PASS "rmmod with 8 MiB of a live process on /dev/$1: data intact in RAM; insmod again"
            else
                result hmm.unload_with_migrated_pages FAIL "holder rc $hold_rc, $(device_list | wc -l) devices after insmod"
            fi
        else
            touch /tmp/hmm-go
            wait "$holder"
            result hmm.unload_with_migrated_pages FAIL "rmmod failed"
        fi
    fi

    # unbind while only a pipe holds migrated pages (of a process that
    # exited): unbind does not wait for them, the memory stays mapped until
    # the pipe lets go; meanwhile the device cannot bind again and the module
    # cannot be unloaded
    hdev=$(device_list | tail -n 1)
    hvdev=$(basename "$(readlink "/sys/class/cxl-accel/$hdev/device")")
    rm -f /tmp/splice-go
    # a VIRTIO shared memory region: the unbind's device reset takes the memory
    # away (a CXL endpoint's BAR4 stays, as a real device's memory would)
    lost=
    case "$want_attach:$(cat "/sys/class/cxl-accel/$hdev/attach")" in
    cxl:*) ;;
    *:shmem*) lost=zeros ;;
    esac
    # shellcheck disable=SC2086 # empty or one word
    "$HMM" --hold-spliced "/dev/$hdev" 120 $lost >/tmp/splice.out 2>&1 &
    holder=$!
    wait_for_line /tmp/splice.out 'SPLICE READY' 300
    t0=$(date +%s)
    echo "$hvdev" >/sys/bus/virtio/drivers/cxl_accel/unbind
    t1=$(date +%s)
    echo "$hvdev" >/sys/bus/virtio/drivers/cxl_accel/bind 2>/dev/null
    if [ -e "/sys/bus/virtio/drivers/cxl_accel/$hvdev" ]; then rebound=yes; else rebound=no; fi
    if rmmod cxl_accel 2>/dev/null; then unloaded=yes; else unloaded=no; fi
    touch /tmp/splice-go
    wait "$holder"
    hold_rc=$?
    sed 's/^/  /' /tmp/splice.out
    i=0
    while ! dmesg | grep -q 'removed device memory was released' && [ $i -lt 50 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    released=$(dmesg | grep -c 'the last page of removed device memory was released')
    echo "$hvdev" >/sys/bus/virtio/drivers/cxl_accel/bind
    ensure_nodes
    if [ $hold_rc = 0 ] && [ $((t1 - t0)) -le 10 ] && [ $rebound = no ] &&
        [ $unloaded = no ] && [ "$released" -ge 1 ] &&
        [ "$(device_list | wc -l)" = "$expected" ]; then
        result hmm.unbind_with_spliced_pages PASS "unbind took $((t1 - t0)) s, bind and rmmod refused while the pipe held the pages, the pipe delivered $([ -n "$lost" ] && echo 'zeros (shared memory went with the reset)' || echo 'their data'), then the memory was released and the device bound again"
    else
        result hmm.unbind_with_spliced_pages FAIL "holder rc $hold_rc, unbind $((t1 - t0)) s, rebound while held: $rebound, unloaded while held: $unloaded, released: $released, devices $(device_list | wc -l)"
    fi

    # unload while a pipe holds migrated pages: rmmod waits until it lets go
    if [ -n "$KO" ]; then
        rm -f /tmp/splice-go
        "$HMM" --hold-spliced "/dev/$1" 3 >/tmp/splice.out 2>&1 &
        holder=$!
        wait_for_line /tmp/splice.out 'SPLICE READY' 300
        t0=$(date +%s)
        if rmmod cxl_accel; then unloaded=yes; else unloaded=no; fi
        t1=$(date +%s)
        wait "$holder"
        hold_rc=$?
        sed 's/^/  /' /tmp/splice.out
        # shellcheck disable=SC2086
        [ $unloaded = yes ] && insmod "$KO" ${CXLA_PARAMS:-}
        ensure_nodes
        if [ $hold_rc = 0 ] && [ $unloaded = yes ] && [ $((t1 - t0)) -ge 2 ] &&
            [ "$(device_list | wc -l)" = "$expected" ]; then
            result hmm.unload_with_spliced_pages PASS "rmmod waited $((t1 - t0)) s for the pipe to release the pages, then unloaded; insmod again"
        else
            result hmm.unload_with_spliced_pages FAIL "holder rc $hold_rc, unloaded: $unloaded after $((t1 - t0)) s, devices $(device_list | wc -l)"
        fi
    fi
else
    result hmm FAIL "hmm-tests or hmm-bench not found"
fi

# Seeded random stress with oracles on two devices (tests/guest/progs/mm-stress.c,
# through stress-guest.sh): migrations, SVM writes given up and landing
# late, pins, EVICT, fork, kills, vmsplice; every process checks its memory
# after every operation.
STRESSRUN=$(find_file stress-guest.sh)
if want stress && [ -z "$STRESSRUN" ]; then
    result mm_stress FAIL "stress-guest.sh not found"
elif whole stress; then
    sh "$STRESSRUN" || RC=1
fi
# The oracle's own test (mm-stress -B, "stress.oracle" alone): a page changed
# behind its back after 10 operations must be found, counted and described,
# the device asked.
if want stress && [ -n "$STRESSRUN" ]; then
    dev=$(device_list | head -n 1)
    out=$("$(find_file mm-stress)" -t 15 -n 1 -B -d "/dev/$dev" 2>&1)
    if echo "$out" | grep -q 'CORRUPTION' &&
        echo "$out" | grep -q 'holds nothing this run wrote there; the device reads the same' &&
        echo "$out" | grep -q ' 1 of [0-9]* pages wrong; 0 read differently after a TLB flush'; then
        result mm_stress_oracle PASS "$(echo "$out" | grep -E 'holds nothing|pages wrong' | sed 's/^mm-stress: *//' | tr '\n' ';' | sed 's/;$//; s/;\([^ ]\)/; \1/g')"
    else
        echo "$out" | grep -v '^RESULT' | tail -n 20
        result mm_stress_oracle FAIL "the page changed behind the oracle's back was not reported as expected"
    fi
fi

# Garbage arguments and races (tests/guest/progs/race-tests.c) on every device in
# turn, another device importing its DMA-BUFs; not in parallel: each run
# checks the exact leak counters of both. Then the module must unload:
# nothing the races left behind may hold it.
RACE=$(find_file race-tests)
if ! want race; then
    :
elif [ -n "$RACE" ]; then
    for dev in $(device_list); do
        peer=$(device_list | grep -vx "$dev" | head -n 1)
        # shellcheck disable=SC2046
        if [ -n "$peer" ]; then
            "$RACE" -d "/dev/$dev" -P "/dev/$peer" -p "$dev.race." $(picks race) || RC=1
        else
            "$RACE" -d "/dev/$dev" -p "$dev.race." $(picks race) || RC=1
        fi
    done
    if ! whole race; then
        :
    elif [ -z "$KO" ]; then
        result race.unload_reload FAIL "cxl_accel.ko not found"
    elif rmmod cxl_accel; then
        # shellcheck disable=SC2086
        insmod "$KO" ${CXLA_PARAMS:-}
        ensure_nodes
        if [ "$(device_list | wc -l)" = "$expected" ]; then
            result race.unload_reload PASS "rmmod after the race tests, insmod: $expected device(s) again"
        else
            result race.unload_reload FAIL "$(device_list | wc -l) device(s) after insmod, $expected expected"
        fi
    else
        result race.unload_reload FAIL "rmmod refused after the race tests (module refcnt $(cat /sys/module/cxl_accel/refcnt))"
    fi
else
    result race FAIL "race-tests not found"
fi

if ! want demo; then
    :
elif echo "----- cxl-accel-demo" && "$DEMO" /dev/cxl-accel0 32 >/tmp/demo.out 2>&1; then
    cat /tmp/demo.out
    result demo PASS "$(grep -c . /tmp/demo.out) lines"
else
    cat /tmp/demo.out
    result demo FAIL "exit status $?"
fi
want demo && echo "-----"
if ! whole removal; then
    exit $RC
fi

# Removal while a process holds allocated, mapped buffers.
dev=$(device_list | head -n 1)
vdev=$(basename "$(readlink "/sys/class/cxl-accel/$dev/device")")
"$TESTS" --hold "/dev/$dev" >/tmp/hold.out 2>&1 &
holder=$!
wait_for_line /tmp/hold.out 'HOLD READY' 100
t0=$(date +%s)
echo "$vdev" >/sys/bus/virtio/drivers/cxl_accel/unbind
t1=$(date +%s)
wait "$holder"
hold_rc=$?
sed 's/^/  /' /tmp/hold.out
if [ $hold_rc = 0 ] && grep -q 'HOLD DONE ok' /tmp/hold.out && [ ! -e "/sys/class/cxl-accel/$dev" ]; then
    result unbind_with_open_buffers PASS "unbind took $((t1 - t0)) s with 4 buffers (2 mapped) open; ioctls ENODEV, mapping SIGBUS"
else
    result unbind_with_open_buffers FAIL "holder rc $hold_rc"
fi
echo "$vdev" >/sys/bus/virtio/drivers/cxl_accel/bind
ensure_nodes
dev2=$(for s in /sys/class/cxl-accel/*; do
    [ "$(basename "$(readlink "$s/device")")" = "$vdev" ] && basename "$s"
done)
if [ -n "$dev2" ] && [ "$(cat "/sys/class/cxl-accel/$dev2/devmem_free")" = \
    "$(cat "/sys/class/cxl-accel/$dev2/devmem_size")" ]; then
    result rebind PASS "$vdev is $dev2 again, all device memory free"
    "$TESTS" -d "/dev/$dev2" -p "rebind.$dev2." -t copy_roundtrip \
        -t atomics_devmem -t alloc_many || RC=1
else
    result rebind FAIL "device '$dev2' free $(cat "/sys/class/cxl-accel/$dev2/devmem_free" 2>/dev/null) of $(cat "/sys/class/cxl-accel/$dev2/devmem_size" 2>/dev/null)"
fi

# A Function Level Reset of the PCI function under load: the driver quiesces
# and sets the device up again (virtio's reset_prepare/reset_done, which
# Debian's 6.12 lacks: there a reset would take the device from under it).
case "$(uname -r)" in
6.*) result "reset.function_reset" SKIP "$(uname -r): virtio has no reset_prepare/reset_done" ;;
*) "$TESTS" -d "/dev/$dev2" -p "reset.$dev2." -t function_reset || RC=1 ;;
esac

# Unload (a process left buffers behind at exit: released on close), reload.
"$TESTS" -d /dev/cxl-accel0 -p unload. -t exit_with_buffers || RC=1
if rmmod cxl_accel && [ ! -d /sys/class/cxl-accel ]; then
    if [ -n "$KO" ] && insmod "$KO" && ensure_nodes &&
        [ "$(device_list | wc -l)" = "$expected" ] &&
        "$TESTS" -d /dev/cxl-accel0 -p reload. -t identify -t crc_known >/tmp/reload.out &&
        rmmod cxl_accel; then
        cat /tmp/reload.out
        result unload_reload PASS "rmmod, insmod, identify, rmmod"
    else
        cat /tmp/reload.out 2>/dev/null
        result unload_reload FAIL "reload cycle failed"
    fi
else
    result unload_reload FAIL "rmmod failed"
fi
dmesg | grep -iE 'cxl.accel|cxl_accel' | tail -n 20 | sed 's/^/  dmesg: /'
exit "$RC"
