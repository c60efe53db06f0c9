/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel tracepoints: the stages of one command, for latency work
 * (tests/guest/scripts/lat-stages.sh turns them into per-stage medians):
 *
 *   cxla_req_start   request allocated (ioctl entry, payload not built yet)
 *   cxla_submit      payload built, pages pinned: going on the ring
 *   cxla_kicked      on the ring, device notified (or told it need not be)
 *   cxla_irq         command queue interrupt (callback entry)
 *   cxla_used        the device returned it (found by the interrupt or a poll)
 *   cxla_woken       the waiter has its result
 *   cxla_req_end     request freed (the ioctl copies out and returns)
 */
#undef TRACE_SYSTEM
#define TRACE_SYSTEM cxl_accel

#if !defined(CXLA_TRACE_H) || defined(TRACE_HEADER_MULTI_READ)
#define CXLA_TRACE_H

#include <linux/tracepoint.h>

DECLARE_EVENT_CLASS(cxla_req_class,
	TP_PROTO(unsigned int queue, u16 opcode, u64 tag),
	TP_ARGS(queue, opcode, tag),
	TP_STRUCT__entry(
		__field(unsigned int, queue)
		__field(u16, opcode)
		__field(u64, tag)
	),
	TP_fast_assign(
		__entry->queue = queue;
		__entry->opcode = opcode;
		__entry->tag = tag;
	),
	TP_printk("q=%u op=%#x tag=%llu", __entry->queue, __entry->opcode,
		  __entry->tag)
);

DEFINE_EVENT(cxla_req_class, cxla_req_start,
	TP_PROTO(unsigned int queue, u16 opcode, u64 tag),
	TP_ARGS(queue, opcode, tag));
DEFINE_EVENT(cxla_req_class, cxla_submit,
	TP_PROTO(unsigned int queue, u16 opcode, u64 tag),
	TP_ARGS(queue, opcode, tag));
DEFINE_EVENT(cxla_req_class, cxla_kicked,
	TP_PROTO(unsigned int queue, u16 opcode, u64 tag),
	TP_ARGS(queue, opcode, tag));
DEFINE_EVENT(cxla_req_class, cxla_used,
	TP_PROTO(unsigned int queue, u16 opcode, u64 tag),
	TP_ARGS(queue, opcode, tag));
DEFINE_EVENT(cxla_req_class, cxla_woken,
	TP_PROTO(unsigned int queue, u16 opcode, u64 tag),
	TP_ARGS(queue, opcode, tag));
DEFINE_EVENT(cxla_req_class, cxla_req_end,
	TP_PROTO(unsigned int queue, u16 opcode, u64 tag),
	TP_ARGS(queue, opcode, tag));

TRACE_EVENT(cxla_irq,
	TP_PROTO(unsigned int queue),
	TP_ARGS(queue),
	TP_STRUCT__entry(__field(unsigned int, queue)),
	TP_fast_assign(__entry->queue = queue;),
	TP_printk("q=%u", __entry->queue)
);

#endif /* CXLA_TRACE_H */

#undef TRACE_INCLUDE_PATH
#define TRACE_INCLUDE_PATH .
#undef TRACE_INCLUDE_FILE
#define TRACE_INCLUDE_FILE trace
#include <trace/define_trace.h>
