#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Guest side of the CXL suite (busybox sh; tests/guest/host/run-cxl.sh boots
# it with --attach cxl on a kernel with the CXL Type-2 accelerator API): what
# the kernel's CXL core made of each device, as a Type-2 driver developer
# would check it in sysfs. Per device: the memdev on our PCI function, its
# endpoint decoder (target_type accelerator, locked, the region's range), the
# host bridge decoder above it (locked), the region (committed, our decoder
# its target), the range our driver reports (cxl); one MSI-X vector per
# queue. Then the topology the host asked for (cxlaccel.hostbridges: both
# devices under one host bridge, or each under its own), teardown and
# re-probe (unbind and bind our driver: the memdev stays; unload and load
# the module: it goes and comes back), and a
# kernel log without warnings. Prints "RESULT <name> PASS|FAIL <detail>".

GL=$(dirname "$0")/guest-lib.sh
[ -f "$GL" ] || GL=/cxl/guest-lib.sh
# shellcheck source=tests/guest/scripts/guest-lib.sh
. "$GL"
KO=$(find_file cxl_accel.ko /lib/modules/extra)
TESTS=$(find_file cxl-accel-tests)
CXL=/sys/bus/cxl/devices
want_hb=$(sed -n 's/.*cxlaccel\.hostbridges=\([a-z]*\).*/\1/p' /proc/cmdline)
if grep -q 'cxlaccel\.region=backed' /proc/cmdline; then
    want_backing=backed qemu_kind="QEMU with x-cxl-mem-bar"
else
    want_backing=not-backed qemu_kind="stock QEMU"
fi

if ! lsmod | grep -q '^cxl_accel '; then
    insmod "$KO" || { result cxl.load FAIL "insmod $KO"; exit 1; }
fi
ensure_nodes
expected=$(expected_devices)

# the PCI function (BDF) under device $1 (cxl-accelN)
pci_of() { basename "$(readlink -f "/sys/class/cxl-accel/$1/device/..")"; }
# the memdev whose parent is PCI function $1
memdev_of() {
    for _m in "$CXL"/mem*; do
        [ -e "$_m" ] || continue
        case "$(readlink -f "$_m")" in */"$1"/*) basename "$_m"; return ;; esac
    done
}
# the endpoint port of memdev $1
endpoint_of() {
    for _e in "$CXL"/endpoint*; do
        [ -e "$_e/uport" ] || continue
        [ "$(basename "$(readlink -f "$_e/uport")")" = "$1" ] && basename "$_e" && return
    done
}
# the port an endpoint hangs off: the directory above it
parent_port_of() { basename "$(dirname "$(readlink -f "$CXL/$1")")"; }
attr() { cat "$CXL/$1/$2" 2>/dev/null; }
hex() { printf '0x%x' "$1"; }
# waits up to $2 tenths of a second for command $1 to succeed
wait_until() {
    _t=0
    until eval "$1"; do
        [ $_t -ge "$2" ] && return 1
        sleep 0.1
        _t=$((_t + 1))
    done
}

# check_device DEV PREFIX: every CXL object of one device; sets PORT_OF_DEV
check_device() {
    dev=$1 p=$2
    bdf=$(pci_of "$dev")
    range=$(cat "/sys/class/cxl-accel/$dev/cxl")
    case "$range" in
    "region "*) ;;
    *) result "$p.registered" FAIL "$dev ($bdf): the driver says '$range'"; return ;;
    esac
    r=${range#region }
    backing=${r##* }
    r=${r%% *}
    start=${r%-*}
    # Stock QEMU routes CXL window accesses only to cxl-type3: the driver must
    # say so. With qemu/patches (run-guest --cxl-mem-bar) the region is backed.
    if [ "$backing" = "$want_backing" ]; then
        result "$p.region_backing" PASS "$dev: the region's range is $backing (the driver wrote a word through the BAR and read the region at that offset)"
    else
        result "$p.region_backing" FAIL "$dev: the driver says '$backing', expected $want_backing ($qemu_kind)"
    fi
    size=$(hex $((${r#*-} - start + 1)))
    mem=$(memdev_of "$bdf")
    ep=$([ -n "$mem" ] && endpoint_of "$mem")
    if [ -n "$mem" ] && [ -n "$ep" ]; then
        result "$p.memdev" PASS "$dev: $mem on $bdf, endpoint $ep, region $start size $size"
    else
        result "$p.memdev" FAIL "$dev: no memdev on $bdf or no endpoint (memdev '$mem')"
        return
    fi
    # The endpoint decoder: an accelerator's, locked, decoding the region.
    epd=$(basename "$(ls -d "$CXL/$ep"/decoder*.0 2>/dev/null | head -n 1)")
    got="target_type $(attr "$epd" target_type) locked $(attr "$epd" locked) start $(attr "$epd" start) size $(attr "$epd" size) region $(attr "$epd" region)"
    region=$(attr "$epd" region)
    if [ "$got" = "target_type accelerator locked 1 start $start size $size region $region" ] &&
        [ -n "$region" ]; then
        result "$p.endpoint_decoder" PASS "$epd: $got"
    else
        result "$p.endpoint_decoder" FAIL "$epd: $got (want accelerator, locked, $start size $size)"
    fi
    # The host bridge's decoder that routes the region down to it, locked.
    port=$(parent_port_of "$ep")
    PORT_OF_DEV=$port
    hbd= hbgot=
    for d in "$CXL/$port"/decoder*; do
        [ -e "$d" ] || continue
        if [ "$(cat "$d/start")" = "$start" ]; then
            hbd=$(basename "$d")
            hbgot="target_type $(cat "$d/target_type") locked $(cat "$d/locked") size $(cat "$d/size")"
        fi
    done
    if [ -n "$hbd" ] && [ "$hbgot" = "target_type accelerator locked 1 size $size" ]; then
        result "$p.host_bridge_decoder" PASS "$port $hbd: $hbgot"
    else
        result "$p.host_bridge_decoder" FAIL "$port: no locked accelerator decoder at $start ('$hbd': $hbgot)"
    fi
    # The region the core assembled from the locked decoders.
    rgot="resource $(attr "$region" resource) size $(attr "$region" size) commit $(attr "$region" commit) target0 $(attr "$region" target0)"
    if [ "$rgot" = "resource $start size $size commit 1 target0 $epd" ]; then
        result "$p.region" PASS "$region: $rgot"
    else
        result "$p.region" FAIL "$region: $rgot (want $start, $size, committed, target0 $epd)"
    fi
    # One MSI-X vector per queue (and the configuration vector).
    vdev=$(basename "$(readlink -f "/sys/class/cxl-accel/$dev/device")")
    vecs=$(grep -c "PCI-MSIX-$bdf" /proc/interrupts)
    names=$(grep "PCI-MSIX-$bdf" /proc/interrupts | awk '{print $NF}' | sort | uniq -c | tr -s ' ' | tr '\n' ',')
    if [ "$vecs" -ge 3 ] && grep "PCI-MSIX-$bdf" /proc/interrupts | grep -q "$vdev-event" &&
        grep "PCI-MSIX-$bdf" /proc/interrupts | grep -q "$vdev-command"; then
        result "$p.msix_per_queue" PASS "$vecs MSI-X vectors on $bdf:$names"
    else
        result "$p.msix_per_queue" FAIL "$vecs MSI-X vectors on $bdf:$names"
    fi
}

# check_all PREFIX: every device, then the topology
check_all() {
    ports=
    n=0
    for dev in $(device_list); do
        PORT_OF_DEV=
        check_device "$dev" "$dev.$1"
        ports="$ports $PORT_OF_DEV"
        n=$((n + 1))
    done
    distinct=$(echo "$ports" | tr ' ' '\n' | grep -c .)
    distinct_u=$(echo "$ports" | tr ' ' '\n' | grep . | sort -u | grep -c .)
    case "$want_hb:$n" in
    one:*) ok=$([ "$distinct_u" = 1 ] && [ "$distinct" = "$n" ] && echo yes) ;;
    each:*) ok=$([ "$distinct_u" = "$n" ] && echo yes) ;;
    *) ok= ;;
    esac
    if [ -n "$ok" ]; then
        result "$1.topology" PASS "$n devices under host bridge port(s)$ports (asked: $want_hb)"
    else
        result "$1.topology" FAIL "$n devices under host bridge port(s)$ports (asked: ${want_hb:-?})"
    fi
}

# What ndctl's cxl tool shows a developer (its JSON without blanks): per
# device the memdev on our PCI function, its endpoint decoder in the region,
# the region committed with that decoder, under a root decoder that takes
# accelerator memory. libcxl's mailbox queries fail on a Type-2 device
# without a mailbox, as on such hardware: counted, not failed.
check_cxl_list() {
    if ! command -v cxl >/dev/null; then
        result cxl.cxl_list SKIP "no cxl tool in this guest (ci/setup.sh --kernel 7.3 installs it)"
        return
    fi
    if ! cxl list -vvv >/tmp/cxl-list.json 2>/tmp/cxl-list.err; then
        result cxl.cxl_list FAIL "cxl list -vvv failed: $(head -n 3 /tmp/cxl-list.err | tr '\n' ' ')"
        return
    fi
    echo "cxl list -vvv:"
    sed 's/^/  | /' /tmp/cxl-list.json
    j=$(tr -d ' \n\t' </tmp/cxl-list.json)
    bad= seen=
    for dev in $(device_list); do
        bdf=$(pci_of "$dev")
        mem=$(memdev_of "$bdf")
        region=$(attr "$(basename "$(ls -d "$CXL/$(endpoint_of "$mem")"/decoder*.0 2>/dev/null | head -n 1)")" region)
        epd=$(basename "$(ls -d "$CXL/$(endpoint_of "$mem")"/decoder*.0 2>/dev/null | head -n 1)")
        case "$j" in
        *"\"memdev\":{\"memdev\":\"$mem\",\"host\":\"$bdf\""*) ;;
        *) bad="$bad $dev: no memdev $mem on $bdf;" ;;
        esac
        # the endpoint decoder's own fields (it holds no object; a region's
        # mapping names the decoder last, with no comma after it)
        fields=$(echo "$j" | sed -n "s/.*\"decoder\":\"$epd\",\([^}]*\)}.*/\1/p")
        case "$fields" in
        *"\"region\":\"$region\""*) ;;
        *) bad="$bad $dev: endpoint decoder $epd not in $region ($fields);" ;;
        esac
        case "$j" in
        *"\"region\":\"$region\""*"\"decode_state\":\"commit\",\"mappings\":[{\"position\":0,\"memdev\":\"$mem\",\"decoder\":\"$epd\"}]"*) ;;
        *) bad="$bad $dev: $region not committed with $mem/$epd;" ;;
        esac
        seen="$seen $mem@$bdf $epd $region,"
    done
    case "$j" in
    *'"accelmem_capable":true'*) ;;
    *) bad="$bad no root decoder takes accelerator memory;" ;;
    esac
    if [ -z "$bad" ]; then
        result cxl.cxl_list PASS "cxl list -vvv:$seen root decoder accelmem_capable; libcxl's mailbox queries refused $(grep -c 'query commands failed' /tmp/cxl-list.err) times (a Type-2 device has no mailbox)"
    else
        result cxl.cxl_list FAIL "$bad"
    fi
}

if [ "$expected" -lt 1 ] || [ "$(device_list | wc -l)" != "$expected" ]; then
    result cxl.devices FAIL "$(device_list | wc -l) of $expected devices bound"
    exit 1
fi
check_all probe
check_cxl_list

# Unbind and bind: the CXL registration belongs to the PCI function, not to
# one binding of our driver, so the memdev stays across an unbind and our
# driver finds it again at bind (the same region).
dev=$(device_list | head -n 1)
bdf=$(pci_of "$dev")
vdev=$(basename "$(readlink -f "/sys/class/cxl-accel/$dev/device")")
mem_before=$(memdev_of "$bdf")
region_before=$(cat "/sys/class/cxl-accel/$dev/cxl")
echo "$vdev" >/sys/bus/virtio/drivers/cxl_accel/unbind
sleep 1
mem_unbound=$(memdev_of "$bdf")
echo "$vdev" >/sys/bus/virtio/drivers/cxl_accel/bind
wait_until '[ "$(device_list | wc -l)" = "$expected" ]' 300
ensure_nodes
dev=$(device_list | while read -r d; do
    [ "$(pci_of "$d")" = "$bdf" ] && echo "$d"; done | head -n 1)
region_after=$(cat "/sys/class/cxl-accel/$dev/cxl" 2>/dev/null)
if [ -n "$mem_before" ] && [ "$mem_unbound" = "$mem_before" ] &&
    [ "$(memdev_of "$bdf")" = "$mem_before" ] &&
    [ "$region_after" = "$region_before" ]; then
    result cxl.unbind_rebind PASS "$dev: $mem_before stayed across the unbind; bound again with the same region ($region_after)"
else
    result cxl.unbind_rebind FAIL "memdev before '$mem_before', unbound '$mem_unbound', after '$(memdev_of "$bdf")'; region before '$region_before', after '$region_after'"
fi
check_all rebind

# Unload: every memdev goes (the CXL core then lets go of each function, and
# it comes back to virtio-pci); load again, every device registers anew.
if rmmod cxl_accel; then
    wait_until '[ -z "$(ls -d "$CXL"/mem* 2>/dev/null)" ]' 100
    left=$(ls -d "$CXL"/mem* 2>/dev/null | wc -l)
    insmod "$KO"
    wait_until '[ "$(device_list | wc -l)" = "$expected" ]' 300
    ensure_nodes
    if [ "$left" = 0 ] && [ "$(device_list | wc -l)" = "$expected" ]; then
        result cxl.unload_reload PASS "no memdev left after rmmod; $expected devices registered again after insmod"
    else
        result cxl.unload_reload FAIL "$left memdevs left after rmmod; $(device_list | wc -l) of $expected devices after insmod"
    fi
    check_all reload
else
    result cxl.unload_reload FAIL "rmmod cxl_accel failed"
fi

# The devices still work: a copy through each.
for dev in $(device_list); do
    if "$TESTS" -d "/dev/$dev" -t copy_roundtrip >/tmp/t.out 2>&1; then
        result "$dev.works_after_reprobe" PASS "copy_roundtrip"
    else
        result "$dev.works_after_reprobe" FAIL "$(tail -n 3 /tmp/t.out | tr '\n' ' ')"
    fi
done

# Resets of each function: a Function Level Reset through the PCI core's
# sysfs reset while a thread runs device ATOMICs, CXL Resets through the
# driver's sysfs cxl_reset, without and with Mem Clr, and a secondary bus
# reset (the kernel's cxl_bus method) under ATOMICs again; pages are
# migrated there each time. The driver quiesces and rebuilds its queues
# (reset_prepare/reset_done), nothing is lost that the reset keeps, and the
# CXL state is as the specification says: FLR leaves CXL.mem alone, CXL
# Reset keeps what firmware locked, and after the bus reset, which returns
# the endpoint's decoder to its defaults, the driver's firmware stand-in
# commits it again (once). The same memdev, decoders and region after all.
for dev in $(device_list); do
    bdf=$(pci_of "$dev")
    region_before=$(cat "/sys/class/cxl-accel/$dev/cxl")
    before=$(dmesg | wc -l)
    "$TESTS" -d "/dev/$dev" -p "$dev." -t function_reset -t cxl_reset >/tmp/t.out 2>&1
    CXLA_RESET_METHOD=cxl_bus "$TESTS" -d "/dev/$dev" -p "$dev.bus_reset." -t function_reset >>/tmp/t.out 2>&1
    cat /tmp/t.out
    region_after=$(cat "/sys/class/cxl-accel/$dev/cxl")
    served=$(dmesg | tail -n +$((before + 1)) | grep -c "function reset: serving again")
    cxlr=$(dmesg | tail -n +$((before + 1)) | grep -c "CXL reset.* complete")
    again=$(dmesg | tail -n +$((before + 1)) | grep -c "$bdf: HDM decoder 0 committed again")
    if [ "$(grep -c "reset PASS" /tmp/t.out)" = 3 ] && [ "$served" = 4 ] && [ "$cxlr" = 2 ] &&
        [ "$again" = 1 ] && [ "$region_after" = "$region_before" ]; then
        result "$dev.reset_region_kept" PASS "$bdf: an FLR, two CXL Resets and a bus reset, the driver served again after each, the decoder committed again after the bus reset, region unchanged ($region_after)"
    else
        result "$dev.reset_region_kept" FAIL "$bdf: tests '$(grep -o '[a-z_]*reset [A-Z]*' /tmp/t.out | tr '\n' ' ')', 'serving again' $served times, CXL resets $cxlr, decoder committed again $again times, region '$region_before' -> '$region_after'"
    fi
done
check_all reset

# Loads and stores through each region: the device memory behind it (a QEMU
# with x-cxl-mem-bar), or an mmap refused with ENXIO (stock QEMU).
want_path='refused with ENXIO'
[ "$want_backing" = not-backed ] || want_path='stored through the region'
for dev in $(device_list); do
    if "$TESTS" -d "/dev/$dev" -t region_mmap >/tmp/t.out 2>&1 &&
        grep -q "$want_path" /tmp/t.out; then
        result "$dev.region_data_path" PASS "$(sed -n 's/.*region_mmap PASS //p' /tmp/t.out | head -n 1)"
    else
        result "$dev.region_data_path" FAIL "$want_backing: $(tail -n 3 /tmp/t.out | tr '\n' ' ')"
    fi
done

# The coherence tests on device memory with each buffer mapped through the
# region, and (for their figures, in the same boot) through the BAR.
if [ "$want_backing" = backed ]; then
    for dev in $(device_list); do
        for via in region bar; do
            env CXLA_MAP_REGION="$([ $via = region ] && echo 1 || echo 0)" \
                "$TESTS" -d "/dev/$dev" -p "$dev.via_$via." \
                -t devmem_cpu_write_dev_checksum -t devmem_dev_fill_cpu_read \
                -t copy_dev_to_dev -t atomics_devmem -t msgpass_dev_to_cpu_devmem \
                -t msgpass_cpu_to_dev_devmem || RC=1
        done
    done
fi

# The sample Type-2 driver (samples/cxl-type2) in place of ours: it registers
# each function with the CXL core itself, gets its region, runs one FILL and
# reads it back (through the region where QEMU backs it, else the BAR), and
# goes again without leaving a memdev.
SAMPLE=$(find_file cxl_type2_sample.ko /cxl)
if [ -z "$SAMPLE" ]; then
    result cxl.sample_type2 SKIP "samples/cxl-type2 not built for this kernel"
elif rmmod cxl_accel && wait_until '[ -z "$(ls -d "$CXL"/mem* 2>/dev/null)" ]' 100 &&
    wait_until '[ "$(ls /sys/bus/virtio/devices | wc -l)" -ge "$expected" ]' 100; then
    before=$(dmesg | wc -l)
    if insmod "$SAMPLE"; then
        wait_until '[ "$(dmesg | tail -n +$((before + 1)) | grep -c "read back through the")" -ge "$expected" ]' 300
        got=$(dmesg | tail -n +$((before + 1)) | grep -c "read back through the")
        line=$(dmesg | tail -n +$((before + 1)) | grep "read back through the" | head -n 1 | sed 's/^\[[^]]*\] //')
        mems=$(ls -d "$CXL"/mem* 2>/dev/null | wc -l)
        rmmod cxl_type2_sample
        wait_until '[ -z "$(ls -d "$CXL"/mem* 2>/dev/null)" ]' 100
        left=$(ls -d "$CXL"/mem* 2>/dev/null | wc -l)
        if [ "$got" = "$expected" ] && [ "$mems" = "$expected" ] && [ "$left" = 0 ]; then
            result cxl.sample_type2 PASS "$got devices, $mems memdevs while loaded, none after rmmod: $line"
        else
            result cxl.sample_type2 FAIL "$got of $expected devices checked, $mems memdevs while loaded, $left after rmmod: $(dmesg | tail -n +$((before + 1)) | grep -i sample | tail -n 3 | tr '\n' '|')"
        fi
    else
        result cxl.sample_type2 FAIL "insmod $SAMPLE"
    fi
else
    result cxl.sample_type2 FAIL "cxl_accel would not go, or its functions did not come back"
fi

# (an unsigned module's taint note is not a failure of ours)
warn=$(dmesg | grep -E 'WARNING:|BUG:|Call Trace|cxl.*(error|failed)' |
    grep -v 'module verification failed' | head -n 5)
if [ -z "$warn" ]; then
    result cxl.kernel_log PASS "no warnings, bugs or CXL errors"
else
    result cxl.kernel_log FAIL "$(echo "$warn" | tr '\n' '|')"
fi
exit "$RC"
