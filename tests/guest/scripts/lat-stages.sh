#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Guest side: where one command's round trip goes, from the driver's
# tracepoints (guest-driver/trace.h). Runs N calls of one kind with lat-bench
# while the cxl_accel events are traced, then prints the median of each stage
# in microseconds:
#
#   STAGE <label> <kind> build=<start->submit> ring=<submit->kicked>
#         device=<kicked->used> wake=<used->woken> finish=<woken->end>
#         irq=<share of commands that took an interrupt> n=<commands>
#
# "device" is everything between the notification and the driver seeing the
# answer: the transport, the daemon, and the interrupt (or the poll).
# Usage: lat-stages.sh LABEL KIND [N] [DEV]   (KIND: nop, atomic, copy4k)
LABEL=$1
KIND=$2
N=${3:-300}
DEV=${4:-/dev/cxl-accel0}
T=/sys/kernel/tracing
[ -d $T/events ] || T=/sys/kernel/debug/tracing
[ -d $T/events/cxl_accel ] || { echo "lat-stages: no cxl_accel tracepoints"; exit 0; }
BENCH=$(command -v lat-bench || echo /cxl/lat-bench)

echo 0 >$T/tracing_on
echo >$T/trace
echo 4096 >$T/buffer_size_kb
echo 1 >$T/events/cxl_accel/enable
echo 1 >$T/tracing_on
$BENCH --kinds "$KIND" --rounds 1 --calls "$N" --threads 0 "$DEV" >/dev/null
echo 0 >$T/tracing_on
echo 0 >$T/events/cxl_accel/enable

# One line per command: the time of each of its events (in us), by tag; the
# start of a request has no tag yet, so it is the last start of its task.
awk '
function us(ts) { sub(":", "", ts); return ts * 1e6 }
/cxla_/ {
    for (i = 1; i <= NF; i++) if ($i ~ /^cxla_[a-z_]+:$/) break
    ev = $i; sub(":", "", ev); t = us($(i - 1)); task = $1
    tag = ""; for (j = i + 1; j <= NF; j++) if ($j ~ /^tag=/) { tag = substr($j, 5) }
    if (ev == "cxla_req_start") { start[task] = t; next }
    if (ev == "cxla_irq") { lastirq = t; next }
    if (ev == "cxla_submit") { s[tag] = start[task]; sub_t[tag] = t; next }
    if (ev == "cxla_kicked") { k[tag] = t; next }
    if (ev == "cxla_used") { u[tag] = t; irq[tag] = (lastirq > k[tag]); next }
    if (ev == "cxla_woken") { w[tag] = t; next }
    if (ev == "cxla_req_end" && (tag in w) && (tag in s) && s[tag] > 0) {
        printf "%.2f %.2f %.2f %.2f %.2f %d\n", sub_t[tag] - s[tag], k[tag] - sub_t[tag],
            u[tag] - k[tag], w[tag] - u[tag], t - w[tag], irq[tag]
    }
}' $T/trace >/tmp/stages.txt
echo >$T/trace

n=$(wc -l </tmp/stages.txt)
[ "$n" -gt 0 ] || { echo "STAGE $LABEL $KIND no complete commands traced"; exit 0; }
med() { # column
    cut -d' ' -f"$1" /tmp/stages.txt | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}
irqs=$(awk '{ s += $6 } END { printf "%d%%", 100 * s / NR }' /tmp/stages.txt)
echo "STAGE $LABEL $KIND build=$(med 1) ring=$(med 2) device=$(med 3) wake=$(med 4) finish=$(med 5) irq=$irqs n=$n"
