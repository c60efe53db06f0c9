/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: command queues and the requests on them (vq.c), the event
 * queue.
 */
#ifndef CXL_ACCEL_VQ_H
#define CXL_ACCEL_VQ_H

#include <linux/cache.h>
#include <linux/completion.h>
#include <linux/list.h>
#include <linux/spinlock.h>
#include <linux/types.h>
#include <linux/wait.h>

#include "cxl_accel_proto.h"

struct cxla_buf;
struct cxla_dev;
struct cxla_import;
struct page;
struct virtqueue;
struct work_struct;

#define CXLA_REQ_INLINE		256	/* request + response bytes inside the request */

/*
 * A command queue. Each CPU submits on one of them (cxla_cmdq_here()), so
 * threads on different CPUs take different locks and notify different
 * rings.
 */
struct cxla_cmdq {
	struct cxla_dev *cd;
	struct virtqueue *vq;
	unsigned int size;		/* of the vring, kept: vq goes at removal */
	unsigned int index;		/* 0 .. nr_cmdq - 1 */
	spinlock_t lock;		/* vq, states of its requests, pollers, cache */
	wait_queue_head_t space;	/* room in this queue */
	unsigned int pollers;		/* waiters polling: interrupts off */
	struct list_head cache;		/* free small requests */
	unsigned int ncache;
} ____cacheline_aligned_in_smp;

/* Pinned user pages attached to a request */
struct cxla_pin {
	struct page **pages;
	unsigned int npages;
	bool write;
	struct cxla_import *imp;	/* imported DMA-BUF in use (dmabuf.c) */
};

#define CXLA_REQ_PINS	2
#define CXLA_REQ_BUFS	2

enum cxla_req_state {
	CXLA_REQ_NEW,
	CXLA_REQ_INFLIGHT,
	CXLA_REQ_DONE,
	CXLA_REQ_ABANDONED,
};

struct cxla_req {
	struct list_head node;		/* reap_list, or a queue's cache */
	struct completion done;
	struct cxla_cmdq *q;		/* where it is submitted */
	enum cxla_req_state state;	/* under q->lock */
	bool cancelled;			/* device removed before completion */
	bool poll;			/* the device answers fast: poll before sleeping */
	bool small;			/* out and in point into inline[] */
	u16 opcode;
	u64 tag;
	void *out;			/* header + payload, device-readable */
	size_t out_len;
	void *in;			/* response + payload, device-writable */
	size_t in_len;
	u32 used_len;
	/* what the owner attaches (ops.c), released by its release hook */
	struct cxla_pin pins[CXLA_REQ_PINS];
	struct cxla_buf *bufs[CXLA_REQ_BUFS];
	/* owner's clean-up when the request is freed, also after quarantine */
	void (*release)(struct cxla_req *req);
	void *release_data;
	u8 inline_buf[CXLA_REQ_INLINE] __aligned(8);	/* small requests */
};

struct cxla_req *cxla_req_alloc(struct cxla_dev *cd, u16 opcode, u16 flags,
				size_t payload_len, size_t resp_payload_len);
static inline void *cxla_req_payload(struct cxla_req *req)
{
	return req->out + sizeof(struct cxla_cmd_hdr);
}

static inline struct cxla_resp *cxla_req_resp(struct cxla_req *req)
{
	return req->in;
}

void cxla_req_free(struct cxla_dev *cd, struct cxla_req *req);
/*
 * intr: the wait ends early on a signal (user commands). Driver-internal
 * commands (probe, FREE on release or removal) wait uninterruptibly, still
 * bounded by the timeout: a release running with SIGKILL pending must not
 * give up on its FREEs.
 */
int cxla_req_submit(struct cxla_dev *cd, struct cxla_req *req,
		    unsigned long deadline, bool intr);
int cxla_req_wait(struct cxla_dev *cd, struct cxla_req **reqp,
		  unsigned long timeout, bool intr);
int cxla_exec(struct cxla_dev *cd, struct cxla_req **reqp,
	      unsigned int timeout_ms, bool intr);
void cxla_req_fire_and_forget(struct cxla_dev *cd, struct cxla_req *req);
void cxla_cmd_done(struct virtqueue *vq);
int cxla_cmdq_init(struct cxla_dev *cd, struct virtqueue **vqs, unsigned int n);
void cxla_cmdq_free(struct cxla_dev *cd);
void cxla_cmdq_stop(struct cxla_dev *cd);
unsigned int cxla_cmdq_hold(struct cxla_dev *cd, unsigned long timeout);
void cxla_cmdq_detach(struct cxla_dev *cd);
void cxla_cmdq_restart(struct cxla_dev *cd);
void cxla_cmdq_release(struct cxla_dev *cd);
void cxla_reap_work(struct work_struct *work);
void cxla_cancel_all(struct cxla_dev *cd);
int cxla_evt_init(struct cxla_dev *cd);
void cxla_evt_set_handler(struct cxla_dev *cd, u32 type,
			  void (*fn)(struct cxla_dev *cd));
void cxla_evt_done(struct virtqueue *vq);
int cxla_simple_cmd(struct cxla_dev *cd, u16 opcode, const void *payload,
		    size_t len, void *resp_payload, size_t resp_len,
		    struct cxla_resp *resp_out, unsigned int timeout_ms,
		    bool intr);

#endif /* CXL_ACCEL_VQ_H */
