// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: command queue (requests, completion, timeouts, quarantine) and
 * event queue.
 *
 * Request life cycle, all state changes under the lock of the command queue
 * the request is on (req->q->lock):
 *
 *   NEW -> INFLIGHT (added to the virtqueue) -> DONE (used by the device,
 *   the waiter is woken and owns the request again).
 *
 *   INFLIGHT -> ABANDONED when the waiter gives up (timeout or signal). The
 *   request then belongs to the queue: its buffers, pinned pages and device
 *   buffer references stay alive, because the device may still read or
 *   write them, until the device hands the chain back (the completion
 *   handler moves it to reap_list) or the device is reset on removal
 *   (cxla_cancel_all). Only then is the memory released.
 *
 * Latency (tests/guest/progs/lat-bench.c, trace.h): each CPU submits on a command
 * queue of its own when the device has enough of them; small requests live
 * in a per-queue cache with their buffers inside them (no allocation per
 * command); a waiter whose command the device answers fast (req->poll)
 * polls the used ring for up to poll_us before it sleeps, with the queue's
 * interrupts off meanwhile: every interrupt of a vhost-user-test-device is
 * a shared INTx (QEMU gives it one MSI-X vector, which Linux cannot use),
 * so one not taken is the biggest single saving.
 */
#include <linux/delay.h>
#include <linux/jiffies.h>
#include <linux/sched/signal.h>
#include <linux/scatterlist.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>
#include <linux/virtio.h>
#include <linux/virtio_config.h>

#include "cxl_accel.h"
#include "core.h"
#include "vq.h"

#define CREATE_TRACE_POINTS
#include "trace.h"

#define CXLA_EVENT_BUFS		32	/* buffers posted on the event queue */
#define CXLA_REQ_CACHE		16	/* small requests kept per queue for reuse */
#define CXLA_POLL_MAX_US	1000	/* poll_us is capped: preemption is off */
/* the highest status the protocol defines: above it, a protocol error */
#define CXLA_S_LAST		CXLA_S_MEDIA_ERROR

static unsigned int cxla_poll_us = 50;
module_param_named(poll_us, cxla_poll_us, uint, 0644);
MODULE_PARM_DESC(poll_us,
		 "How long a waiter polls for the answer to a fast command before it sleeps (us, 0 = never, at most 1000)");

static int cxla_status_to_errno(u32 status)
{
	switch (status) {
	case CXLA_S_OK:
		return 0;
	case CXLA_S_UNSUPPORTED:
		return -EOPNOTSUPP;
	case CXLA_S_INVALID:
	case CXLA_S_OVERFLOW:
	case CXLA_S_UNALIGNED:
	case CXLA_S_LENGTH_MISMATCH:
		return -EINVAL;
	case CXLA_S_TOO_LARGE:
		return -E2BIG;
	case CXLA_S_BAD_GPA:
	case CXLA_S_BAD_DEVMEM:
		return -EFAULT;
	case CXLA_S_NO_SPACE:
		return -ENOSPC;
	case CXLA_S_NOT_FOUND:
		return -ENOENT;
	case CXLA_S_NOT_READY:
		return -EAGAIN;
	case CXLA_S_EXISTS:
		return -EEXIST;
	case CXLA_S_INTERRUPTED:	/* destination contents undefined */
		return -EIO;
	case CXLA_S_MEDIA_ERROR:	/* poisoned device memory (poison.c) */
		return -EIO;
	default:	/* TRUNCATED, BAD_CHAIN, INTERNAL: a driver/device mismatch */
		return -EIO;
	}
}

/*
 * The command queue of the CPU we run on; EXPORT and UNEXPORT always on the
 * first. A fence orders a command only after those the device has taken
 * from a ring: an EXPORT interrupted on one CPU's queue could still be
 * waiting in it while the fenced UNEXPORT of its UUID and the next EXPORT ran
 * from another's, and land after them (the buffer then exported under a UUID
 * nobody knows, every later EXPORT refused). One ring keeps them in order.
 */
static struct cxla_cmdq *cxla_cmdq_for(struct cxla_dev *cd, u16 opcode)
{
	if (opcode == CXLA_OP_EXPORT || opcode == CXLA_OP_UNEXPORT)
		return &cd->cmdq[0];
	return &cd->cmdq[raw_smp_processor_id() % cd->nr_cmdq];
}

static struct cxla_cmdq *cxla_vq_cmdq(struct cxla_dev *cd,
				       struct virtqueue *vq)
{
	unsigned int k = vq->index ? vq->index - 1 : 0;	/* 1 is events */

	return &cd->cmdq[min(k, cd->nr_cmdq - 1)];
}

/* A small request from the queue's cache, else a new one; zeroed. */
static struct cxla_req *cxla_req_get(struct cxla_cmdq *q)
{
	struct cxla_req *req = NULL;
	unsigned long flags;

	spin_lock_irqsave(&q->lock, flags);
	if (q->ncache) {
		req = list_first_entry(&q->cache, struct cxla_req, node);
		list_del(&req->node);
		q->ncache--;
	}
	spin_unlock_irqrestore(&q->lock, flags);
	if (req)
		memset(req, 0, offsetof(struct cxla_req, inline_buf));
	else
		req = kzalloc(sizeof(*req), GFP_KERNEL);
	return req;
}

static void cxla_req_put(struct cxla_req *req)
{
	struct cxla_cmdq *q = req->q;
	unsigned long flags;

	if (req->small && q) {
		spin_lock_irqsave(&q->lock, flags);
		if (q->ncache < CXLA_REQ_CACHE) {
			list_add(&req->node, &q->cache);
			q->ncache++;
			req = NULL;
		}
		spin_unlock_irqrestore(&q->lock, flags);
	}
	kfree(req);
}

struct cxla_req *cxla_req_alloc(struct cxla_dev *cd, u16 opcode, u16 flags,
				size_t payload_len, size_t resp_payload_len)
{
	size_t out_len = sizeof(struct cxla_cmd_hdr) + payload_len;
	size_t in_len = sizeof(struct cxla_resp) + resp_payload_len;
	struct cxla_cmdq *q = cxla_cmdq_for(cd, opcode);
	struct cxla_cmd_hdr *hdr;
	struct cxla_req *req;

	if (out_len > cd->max_request)
		return ERR_PTR(-E2BIG);

	req = cxla_req_get(q);
	if (!req)
		return ERR_PTR(-ENOMEM);
	req->q = q;
	req->out_len = out_len;
	req->in_len = in_len;
	if (ALIGN(out_len, 8) + in_len <= CXLA_REQ_INLINE) {
		req->small = true;
		req->out = req->inline_buf;
		req->in = req->inline_buf + ALIGN(out_len, 8);
		memset(req->inline_buf, 0, ALIGN(out_len, 8) + in_len);
	} else {
		/* large scatter-gather lists need not be physically contiguous */
		req->out = kvzalloc(out_len, GFP_KERNEL);
		req->in = kzalloc(in_len, GFP_KERNEL);
		if (!req->out || !req->in) {
			kvfree(req->out);
			kfree(req->in);
			kfree(req);
			return ERR_PTR(-ENOMEM);
		}
	}
	init_completion(&req->done);
	INIT_LIST_HEAD(&req->node);
	req->state = CXLA_REQ_NEW;
	req->opcode = opcode;
	/*
	 * The device answers these at once (state changes wait for its DMA
	 * engines); data commands decide for themselves.
	 */
	switch (opcode) {
	case CXLA_OP_NOP:
	case CXLA_OP_IDENTIFY:
	case CXLA_OP_STATS:
	case CXLA_OP_SET_DEVMEM_BASE:
	case CXLA_OP_SIGNAL:
		req->poll = !(flags & CXLA_FLAG_FENCE);
		break;
	default:
		req->poll = false;
	}
	hdr = req->out;
	hdr->opcode = cpu_to_le16(opcode);
	hdr->flags = cpu_to_le16(flags);
	trace_cxla_req_start(q->index, opcode, 0);
	return req;
}

void cxla_req_free(struct cxla_dev *cd, struct cxla_req *req)
{
	if (!req)
		return;
	trace_cxla_req_end(req->q ? req->q->index : 0, req->opcode, req->tag);
	if (req->release)
		req->release(req);
	if (!req->small) {
		kvfree(req->out);
		kfree(req->in);
	}
	cxla_req_put(req);
}

/*
 * Task work queued with TWA_SIGNAL (io_uring does, e.g. when a ring is
 * closed) sets TIF_NOTIFY_SIGNAL, which ends interruptible waits although
 * no signal is pending: the work runs on the way back to user space.
 * Failing a command with -EINTR for that would be spurious (and abandon
 * it); such waits go on, killable, in slices that notice a real signal.
 */
#define CXLA_NOTIFY_SLICE	max_t(unsigned long, HZ / 100, 1)

static bool cxla_notify_only(void)
{
	return signal_pending(current) && !task_sigpending(current);
}

/*
 * After an interruptible wait ended early: was it for a real signal? Task
 * work may also have been cancelled, and its flag cleared, since it woke us.
 * TIF_SIGPENDING may be stale too (a process-wide signal another thread
 * took first): it is recomputed before a command is given up for it.
 */
static bool cxla_real_signal(void)
{
	if (!task_sigpending(current))
		return false;
	spin_lock_irq(&current->sighand->siglock);
	recalc_sigpending();
	spin_unlock_irq(&current->sighand->siglock);
	return task_sigpending(current);
}

/* wait_for_completion_interruptible_timeout(), task work aside */
static long cxla_wait_done(struct completion *done, unsigned long timeout)
{
	unsigned long end = jiffies + timeout;
	long left;

	left = wait_for_completion_interruptible_timeout(done, timeout);
	while (left == -ERESTARTSYS && !cxla_real_signal()) {
		long rest = (long)(end - jiffies);	/* one read: no wrap */

		if (rest <= 0)
			return 0;
		if (!signal_pending(current)) {	/* the task work's flag went */
			left = wait_for_completion_interruptible_timeout(done,
									 rest);
			continue;
		}
		left = wait_for_completion_killable_timeout(done,
				min_t(long, rest, CXLA_NOTIFY_SLICE));
		if (!left)
			left = -ERESTARTSYS;	/* slice over: signals? */
	}
	return left;
}

/* Under the queue's lock: after removal's stop the vq may be freed. */
static bool cxla_cmd_room(struct cxla_dev *cd, struct cxla_cmdq *q,
			  unsigned int needed)
{
	unsigned long flags;
	bool room;

	spin_lock_irqsave(&q->lock, flags);
	room = cd->stopped || (cd->cmds_held && cd->reset_owner != current) ||
	       q->vq->num_free >= needed;
	spin_unlock_irqrestore(&q->lock, flags);
	return room;
}

/* Describe a vmalloc'ed buffer page by page. */
static void cxla_sg_vmalloc(struct scatterlist *sg, unsigned int nents,
			    void *buf, size_t len)
{
	unsigned int n = 0;

	sg_init_table(sg, nents);
	while (len && n < nents) {
		size_t chunk = min_t(size_t, len, PAGE_SIZE - offset_in_page(buf));

		sg_set_page(&sg[n++], vmalloc_to_page(buf), chunk,
			    offset_in_page(buf));
		buf += chunk;
		len -= chunk;
	}
}

/*
 * Add a request to the command queue and notify the device. Waits (until
 * deadline) while the queue is full. The notify happens under cmd_lock so
 * that removal can never free the queue under a submitter.
 */
int cxla_req_submit(struct cxla_dev *cd, struct cxla_req *req,
		    unsigned long deadline, bool intr)
{
	struct scatterlist out_one, in_sg, *out_sg = &out_one, *sgs[2];
	struct cxla_cmd_hdr *hdr = req->out;
	struct cxla_cmdq *q = req->q;
	unsigned int nents = 1, needed, room_but_full = 0;
	unsigned long flags;
	long left, rest;
	int ret;

	/* after removal the queues are gone: nothing below may touch them */
	if (READ_ONCE(cd->stopped) && !READ_ONCE(cd->cmds_held))
		return -ENODEV;
	if (is_vmalloc_addr(req->out)) {
		nents = DIV_ROUND_UP(offset_in_page(req->out) + req->out_len,
				     PAGE_SIZE);
		out_sg = kmalloc_array(nents, sizeof(*out_sg), GFP_KERNEL);
		if (!out_sg)
			return -ENOMEM;
		cxla_sg_vmalloc(out_sg, nents, req->out, req->out_len);
	} else {
		sg_init_one(out_sg, req->out, req->out_len);
	}
	sg_init_one(&in_sg, req->in, req->in_len);
	sgs[0] = out_sg;
	sgs[1] = &in_sg;
	/* an indirect table takes one ring slot, else one per segment */
	needed = cd->indirect ? 1 : nents + 1;
	if (needed > q->size) {
		ret = -E2BIG;
		goto out;
	}

	for (;;) {
		spin_lock_irqsave(&q->lock, flags);
		if (cd->cmds_held && cd->reset_owner != current) {
			ret = -EAGAIN;	/* a function reset: wait for its end */
		} else if (cd->stopped) {
			ret = -ENODEV;
		} else {
			req->tag = atomic64_inc_return(&cd->next_tag);
			hdr->tag = cpu_to_le64(req->tag);
			trace_cxla_submit(q->index, req->opcode, req->tag);
			ret = virtqueue_add_sgs(q->vq, sgs, 1, 1, req,
						GFP_ATOMIC);
			if (!ret) {
				req->state = CXLA_REQ_INFLIGHT;
				virtqueue_kick(q->vq);
				trace_cxla_kicked(q->index, req->opcode, req->tag);
			}
		}
		spin_unlock_irqrestore(&q->lock, flags);
		if (ret == -EAGAIN) {
			unsigned long held_since = jiffies;

			ret = cxla_reset_wait(cd, &cd->cmds_held);
			if (ret)
				break;
			/* the reset's time does not count against the command */
			deadline += jiffies - held_since;
			continue;
		}
		if (ret != -ENOSPC)
			break;

		rest = (long)(deadline - jiffies);	/* one read: no wrap */
		if (rest <= 0) {
			cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_TIMEOUTS);
			ret = -ETIMEDOUT;
			break;
		}
		/*
		 * Room again: completions came since the add, try at once. Room
		 * twice in a row and still no space: the indirect table could
		 * not be allocated (GFP_ATOMIC); back off rather than spin,
		 * still answering signals.
		 */
		if (cxla_cmd_room(cd, q, needed)) {
			if (intr && cxla_real_signal()) {
				cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_INTERRUPTED);
				ret = -EINTR;
				break;
			}
			if (room_but_full++)
				usleep_range(1000, 2000);
			continue;
		}
		room_but_full = 0;
		if (intr && !cxla_notify_only())
			left = wait_event_interruptible_timeout(q->space,
								cxla_cmd_room(cd, q, needed),
								rest);
		else	/* task work only: a slice, then look again */
			left = wait_event_timeout(q->space,
						  cxla_cmd_room(cd, q, needed),
						  intr ? min_t(long, rest,
							       CXLA_NOTIFY_SLICE) :
							 rest);
		if (left < 0 && !cxla_real_signal())
			continue;	/* task work came during the wait */
		if (left < 0) {
			cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_INTERRUPTED);
			ret = -EINTR;
			break;
		}
	}
	if (!ret)
		cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_SUBMITTED);
out:
	if (out_sg != &out_one)
		kfree(out_sg);
	return ret;
}

static int cxla_req_result(struct cxla_dev *cd, struct cxla_req *req)
{
	struct cxla_resp *resp = req->in;
	u32 status;

	/* taken back at a reset the driver survives: the command's outcome is unknown */
	if (req->cancelled)
		return READ_ONCE(cd->dead) ? -ENODEV : -EIO;
	if (req->used_len < sizeof(*resp) || req->used_len > req->in_len) {
		cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_PROTOCOL);
		dev_err_ratelimited(&cd->dev,
				    "opcode %#x tag %llu: used length %u (response needs %zu)\n",
				    req->opcode, req->tag, req->used_len,
				    sizeof(*resp));
		return -EIO;
	}
	if (le64_to_cpu(resp->tag) != req->tag) {
		cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_PROTOCOL);
		dev_err_ratelimited(&cd->dev,
				    "opcode %#x: response tag %llu, expected %llu\n",
				    req->opcode, le64_to_cpu(resp->tag), req->tag);
		return -EIO;
	}
	WRITE_ONCE(cd->wedged, false);
	status = le32_to_cpu(resp->status);
	if (status > CXLA_S_LAST) {
		/*
		 * No version of the protocol this driver speaks defines it: the
		 * device is broken or speaks another protocol, so the outcome
		 * of the command is unknown.
		 */
		cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_PROTOCOL);
		dev_err_ratelimited(&cd->dev,
				    "opcode %#x tag %llu: undefined status %u\n",
				    req->opcode, req->tag, status);
		return -EIO;
	}
	if (status) {
		cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_ERRORS);
		dev_dbg(&cd->dev, "opcode %#x tag %llu: status %u detail %u\n",
			req->opcode, req->tag, status,
			le32_to_cpu(resp->detail));
		return cxla_status_to_errno(status);
	}
	return 0;
}

static bool cxla_poll_answer(struct cxla_cmdq *q, struct cxla_req *req);

/*
 * Wait for a submitted request. On timeout or signal the request is
 * abandoned to the queue and *reqp is set to NULL: the caller must not touch
 * it any more. Otherwise the caller still owns *reqp and frees it.
 */
int cxla_req_wait(struct cxla_dev *cd, struct cxla_req **reqp,
		  unsigned long timeout, bool intr)
{
	struct cxla_req *req = *reqp;
	struct cxla_cmdq *q = req->q;
	unsigned long flags;
	long left = 1;

	if (req->poll && READ_ONCE(cxla_poll_us) && cxla_poll_answer(q, req)) {
		cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_POLLED);
		goto done;
	}
	if (!completion_done(&req->done))
		cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_SLEPT);
	if (intr)
		left = cxla_wait_done(&req->done, timeout);
	else
		left = wait_for_completion_timeout(&req->done, timeout);
	if (left <= 0) {
		spin_lock_irqsave(&q->lock, flags);
		if (req->state == CXLA_REQ_INFLIGHT) {
			/* the queue owns it once unlocked: the reaper may free it */
			u16 opcode = req->opcode;
			u64 tag = req->tag;

			req->state = CXLA_REQ_ABANDONED;
			cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_QUARANTINED);
			spin_unlock_irqrestore(&q->lock, flags);
			*reqp = NULL;
			if (left == 0) {
				cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_TIMEOUTS);
				WRITE_ONCE(cd->wedged, true);
				dev_warn_ratelimited(&cd->dev,
						     "opcode %#x tag %llu: no completion after %u ms, request quarantined\n",
						     opcode, tag,
						     jiffies_to_msecs(timeout));
				return -ETIMEDOUT;
			}
			cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_INTERRUPTED);
			return -EINTR;
		}
		spin_unlock_irqrestore(&q->lock, flags);
		/* completed while we gave up: use the result */
	}
done:
	trace_cxla_woken(q->index, req->opcode, req->tag);
	return cxla_req_result(cd, req);
}

/* uninterruptible waits stay well below the hung task detector's limit */
#define CXLA_MAX_NOINTR_JIFFIES	(30 * HZ)

int cxla_exec(struct cxla_dev *cd, struct cxla_req **reqp,
	      unsigned int timeout_ms, bool intr)
{
	unsigned long timeout = cxla_timeout_jiffies(timeout_ms);
	int ret;

	if (!intr)
		timeout = min_t(unsigned long, timeout, CXLA_MAX_NOINTR_JIFFIES);

	ret = cxla_req_submit(cd, *reqp, jiffies + timeout, intr);
	if (ret)
		return ret;
	return cxla_req_wait(cd, reqp, timeout, intr);
}

/* Submit without waiting; the request is freed when the device returns it. */
void cxla_req_fire_and_forget(struct cxla_dev *cd, struct cxla_req *req)
{
	unsigned long timeout = min_t(unsigned long, cxla_timeout_jiffies(0),
				      CXLA_MAX_NOINTR_JIFFIES);
	unsigned long flags;
	bool free_now = true;

	if (!cxla_req_submit(cd, req, jiffies + timeout, false)) {
		spin_lock_irqsave(&req->q->lock, flags);
		if (req->state == CXLA_REQ_INFLIGHT) {
			req->state = CXLA_REQ_ABANDONED;
			free_now = false;
			cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_QUARANTINED);
		}
		spin_unlock_irqrestore(&req->q->lock, flags);
	}
	if (free_now)
		cxla_req_free(cd, req);
}

int cxla_simple_cmd(struct cxla_dev *cd, u16 opcode, const void *payload,
		    size_t len, void *resp_payload, size_t resp_len,
		    struct cxla_resp *resp_out, unsigned int timeout_ms,
		    bool intr)
{
	struct cxla_req *req;
	int ret;

	req = cxla_req_alloc(cd, opcode, 0, len, resp_len);
	if (IS_ERR(req))
		return PTR_ERR(req);
	if (len)
		memcpy(cxla_req_payload(req), payload, len);
	ret = cxla_exec(cd, &req, timeout_ms, intr);
	if (!req)
		return ret;	/* abandoned */
	if (resp_out && !req->cancelled && req->used_len >= sizeof(*resp_out))
		memcpy(resp_out, req->in, sizeof(*resp_out));
	if (!ret && resp_len) {
		if (req->used_len < sizeof(struct cxla_resp) + resp_len) {
			cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_PROTOCOL);
			dev_err_ratelimited(&cd->dev,
					    "opcode %#x: response payload of %zu bytes, expected %zu\n",
					    opcode,
					    req->used_len - sizeof(struct cxla_resp),
					    resp_len);
			ret = -EIO;
		} else {
			memcpy(resp_payload, req->in + sizeof(struct cxla_resp),
			       resp_len);
		}
	}
	cxla_req_free(cd, req);
	return ret;
}

/*
 * A request the device returned, or one taken back from a dead queue: to
 * its waiter, or to the reaper when the waiter gave up. Returns true in
 * the latter case. Called with the queue's lock held.
 */
static bool cxla_req_handback(struct cxla_dev *cd, struct cxla_req *req)
{
	if (req->state == CXLA_REQ_ABANDONED) {
		spin_lock(&cd->cmd_lock);
		list_add_tail(&req->node, &cd->reap_list);
		spin_unlock(&cd->cmd_lock);
		return true;
	}
	req->state = CXLA_REQ_DONE;
	complete(&req->done);
	return false;
}

/*
 * Hand the requests the device returned on q back to their waiters (or to
 * the reaper, when abandoned). Called with q->lock held; returns how many,
 * *reap set when the reaper has work.
 */
static unsigned int cxla_cmdq_reap(struct cxla_dev *cd, struct cxla_cmdq *q,
				   bool *reap)
{
	struct cxla_req *req;
	unsigned int len, n = 0;

	while ((req = virtqueue_get_buf(q->vq, &len))) {
		trace_cxla_used(q->index, req->opcode, req->tag);
		req->used_len = len;
		n++;
		cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_COMPLETED);
		if (cxla_req_handback(cd, req))
			*reap = true;
	}
	return n;
}

/* After a reap outside the interrupt: wake whoever waits for it. */
static void cxla_cmdq_reaped(struct cxla_dev *cd, struct cxla_cmdq *q,
			     unsigned int n, bool reap)
{
	if (reap)
		cxla_defer(cd, &cd->reap_work);
	if (n)
		wake_up_all(&q->space);
}

/* Command queue interrupt: hand finished requests back. */
void cxla_cmd_done(struct virtqueue *vq)
{
	struct cxla_dev *cd = vq->vdev->priv;
	struct cxla_cmdq *q = cxla_vq_cmdq(cd, vq);
	unsigned long flags;
	bool reap = false;
	unsigned int n;

	trace_cxla_irq(q->index);
	spin_lock_irqsave(&q->lock, flags);
	n = cxla_cmdq_reap(cd, q, &reap);
	spin_unlock_irqrestore(&q->lock, flags);
	if (reap)
		cxla_defer(cd, &cd->reap_work);
	wake_up_all(&q->space);
	(void)n;
}

/*
 * Poll q's used ring until req is answered, for up to poll_us. The queue's
 * interrupts are off while anyone polls it (the last poller turns them on
 * again and hands back what came meanwhile), so an answer found by polling
 * costs no interrupt. Gives up early when the CPU is wanted elsewhere or a
 * signal is pending. Returns whether req is done.
 */
static bool cxla_poll_answer(struct cxla_cmdq *q, struct cxla_req *req)
{
	struct cxla_dev *cd = q->cd;
	unsigned int us = min(READ_ONCE(cxla_poll_us), CXLA_POLL_MAX_US);
	u64 end = ktime_get_ns() + (u64)us * NSEC_PER_USEC;
	unsigned long flags;
	unsigned int n;
	bool reap = false;

	/*
	 * Not preempted while the queue's interrupts are off: the other
	 * waiters of this queue would sleep unwoken meanwhile. need_resched()
	 * ends the poll instead. (On PREEMPT_RT the queue's lock may sleep.)
	 */
	if (!IS_ENABLED(CONFIG_PREEMPT_RT))
		preempt_disable();
	spin_lock_irqsave(&q->lock, flags);
	/* removal stops the queues before it frees them: look under the lock */
	if (!q->pollers++ && !cd->stopped)
		virtqueue_disable_cb(q->vq);
	spin_unlock_irqrestore(&q->lock, flags);

	while (!completion_done(&req->done)) {
		n = 0;
		spin_lock_irqsave(&q->lock, flags);
		if (!cd->stopped)
			n = cxla_cmdq_reap(cd, q, &reap);
		spin_unlock_irqrestore(&q->lock, flags);
		cxla_cmdq_reaped(cd, q, n, reap);
		if (completion_done(&req->done) || need_resched() ||
		    signal_pending(current) || ktime_get_ns() > end)
			break;
		cpu_relax();
	}

	spin_lock_irqsave(&q->lock, flags);
	n = 0;
	if (!--q->pollers && !cd->stopped)
		while (!virtqueue_enable_cb(q->vq))
			n += cxla_cmdq_reap(cd, q, &reap);
	spin_unlock_irqrestore(&q->lock, flags);
	if (!IS_ENABLED(CONFIG_PREEMPT_RT))
		preempt_enable();
	cxla_cmdq_reaped(cd, q, n, reap);
	return completion_done(&req->done);
}

/* An abandoned ALLOC that succeeded late: give the memory back. */
static void cxla_reap_orphan_alloc(struct cxla_dev *cd, struct cxla_req *req)
{
	struct cxla_resp *resp = req->in;
	struct cxla_free *f;
	struct cxla_req *fr;

	if (req->cancelled || req->used_len < sizeof(*resp) ||
	    le32_to_cpu(resp->status) != CXLA_S_OK)
		return;
	fr = cxla_req_alloc(cd, CXLA_OP_FREE, 0, sizeof(*f), 0);
	if (IS_ERR(fr))
		return;
	f = cxla_req_payload(fr);
	f->id = resp->result0;
	dev_info(&cd->dev, "freeing buffer %llu of a timed-out ALLOC\n",
		 le64_to_cpu(resp->result0));
	cxla_req_fire_and_forget(cd, fr);
}

void cxla_reap_work(struct work_struct *work)
{
	struct cxla_dev *cd = container_of(work, struct cxla_dev, reap_work);
	struct cxla_req *req, *tmp;
	LIST_HEAD(list);

	spin_lock_irq(&cd->cmd_lock);
	list_splice_init(&cd->reap_list, &list);
	spin_unlock_irq(&cd->cmd_lock);

	list_for_each_entry_safe(req, tmp, &list, node) {
		list_del(&req->node);
		cxla_dstat_dec(cd, CXL_ACCEL_DSTAT_QUARANTINED);
		if (req->opcode == CXLA_OP_ALLOC)
			cxla_reap_orphan_alloc(cd, req);
		cxla_req_free(cd, req);
	}
	cxla_deferred_done(cd);
}

/*
 * Called after the device was reset: nothing will complete any more. Wake
 * the waiters of live requests and reap the abandoned ones.
 */
void cxla_cancel_all(struct cxla_dev *cd)
{
	struct cxla_req *req;
	unsigned long flags;
	unsigned int i;

	for (i = 0; i < cd->nr_cmdq; i++) {
		struct cxla_cmdq *q = &cd->cmdq[i];

		spin_lock_irqsave(&q->lock, flags);
		while (q->vq && (req = virtqueue_detach_unused_buf(q->vq))) {
			req->cancelled = true;
			cxla_req_handback(cd, req);
		}
		spin_unlock_irqrestore(&q->lock, flags);
		wake_up_all(&q->space);
	}
	cxla_defer(cd, &cd->reap_work);
}

/*
 * Command queues: vqs[k] is command queue k. After a function reset the
 * queues exist and get their new virtqueues.
 */
int cxla_cmdq_init(struct cxla_dev *cd, struct virtqueue **vqs, unsigned int n)
{
	unsigned int i;

	if (cd->cmdq) {
		if (n != cd->nr_cmdq)
			return -EIO;
		for (i = 0; i < n; i++) {
			cd->cmdq[i].vq = vqs[i];
			cd->cmdq[i].size = virtqueue_get_vring_size(vqs[i]);
		}
		return 0;
	}
	cd->cmdq = kcalloc(n, sizeof(*cd->cmdq), GFP_KERNEL);
	if (!cd->cmdq)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		struct cxla_cmdq *q = &cd->cmdq[i];

		q->cd = cd;
		q->vq = vqs[i];
		q->size = virtqueue_get_vring_size(vqs[i]);
		q->index = i;
		spin_lock_init(&q->lock);
		init_waitqueue_head(&q->space);
		INIT_LIST_HEAD(&q->cache);
	}
	cd->nr_cmdq = n;
	return 0;
}

/*
 * Sets a flag of cd that submitters read under their queue's lock: once
 * every queue's lock was taken after it, each of them sees it.
 */
static void cxla_cmdq_flag(struct cxla_dev *cd, bool *flag, bool value)
{
	unsigned int i;

	for (i = 0; i < cd->nr_cmdq; i++) {
		spin_lock_irq(&cd->cmdq[i].lock);
		if (i == 0)
			WRITE_ONCE(*flag, value);
		spin_unlock_irq(&cd->cmdq[i].lock);
	}
	if (!cd->nr_cmdq)
		WRITE_ONCE(*flag, value);
}

/* No new commands on any queue. */
void cxla_cmdq_stop(struct cxla_dev *cd)
{
	cxla_cmdq_flag(cd, &cd->stopped, true);
}

/* every descriptor back (read unlocked: a wait condition, woken on completions) */
static bool cxla_cmdq_idle(struct cxla_cmdq *q)
{
	return READ_ONCE(q->vq->num_free) == q->size;
}

/*
 * A function reset is coming: submitters wait from now on (cmds_held), the
 * requests in flight get until timeout to come back, then the queues stop.
 * Returns how many queues still had requests (cxla_cancel_all() takes them
 * back after the device reset).
 */
unsigned int cxla_cmdq_hold(struct cxla_dev *cd, unsigned long timeout)
{
	unsigned long deadline = jiffies + timeout;
	unsigned int i, busy = 0;

	cxla_cmdq_flag(cd, &cd->cmds_held, true);
	for (i = 0; i < cd->nr_cmdq; i++) {
		struct cxla_cmdq *q = &cd->cmdq[i];
		long rest = max_t(long, (long)(deadline - jiffies), 1);

		if (!wait_event_timeout(q->space, cxla_cmdq_idle(q), rest))
			busy++;
	}
	cxla_cmdq_stop(cd);
	return busy;
}

/* The virtqueues went with the device reset: nothing may touch them. */
void cxla_cmdq_detach(struct cxla_dev *cd)
{
	unsigned int i;

	for (i = 0; i < cd->nr_cmdq; i++) {
		spin_lock_irq(&cd->cmdq[i].lock);
		cd->cmdq[i].vq = NULL;
		spin_unlock_irq(&cd->cmdq[i].lock);
	}
}

/*
 * After the reset, with new virtqueues: the queues run again, only for
 * cd->reset_owner (what the device needs before the rest) until
 * cxla_cmdq_release().
 */
void cxla_cmdq_restart(struct cxla_dev *cd)
{
	cxla_cmdq_flag(cd, &cd->stopped, false);
}

/* Every submitter goes on. */
void cxla_cmdq_release(struct cxla_dev *cd)
{
	cxla_cmdq_flag(cd, &cd->cmds_held, false);
	wake_up_all(&cd->unpaused);
}

/* The device is gone and no request lives any more: the caches go. */
void cxla_cmdq_free(struct cxla_dev *cd)
{
	struct cxla_req *req, *tmp;
	unsigned int i;

	for (i = 0; i < cd->nr_cmdq; i++)
		list_for_each_entry_safe(req, tmp, &cd->cmdq[i].cache, node)
			kfree(req);
	kfree(cd->cmdq);
	cd->cmdq = NULL;
	cd->nr_cmdq = 0;
}

/* Event queue */

static int cxla_evt_post(struct cxla_dev *cd, struct cxla_event *ev, gfp_t gfp)
{
	struct scatterlist sg;

	memset(ev, 0, sizeof(*ev));
	sg_init_one(&sg, ev, sizeof(*ev));
	return virtqueue_add_inbuf(cd->evt_vq, &sg, 1, ev, gfp);
}

int cxla_evt_init(struct cxla_dev *cd)
{
	unsigned long flags;
	int i, ret = 0;

	/* after a function reset: the same buffers, on the new queue */
	if (!cd->evt_bufs)
		cd->evt_bufs = kcalloc(CXLA_EVENT_BUFS, sizeof(*cd->evt_bufs),
				       GFP_KERNEL);
	if (!cd->evt_bufs)
		return -ENOMEM;
	spin_lock_irqsave(&cd->evt_lock, flags);
	for (i = 0; i < CXLA_EVENT_BUFS; i++) {
		ret = cxla_evt_post(cd, &cd->evt_bufs[i], GFP_ATOMIC);
		if (ret)
			break;
	}
	virtqueue_kick(cd->evt_vq);
	spin_unlock_irqrestore(&cd->evt_lock, flags);
	/* a smaller queue than CXLA_EVENT_BUFS is fine */
	return (ret && i == 0) ? ret : 0;
}

static void cxla_evt_record(struct cxla_dev *cd, const struct cxla_event *ev)
{
	struct cxl_accel_event *rec;

	rec = &cd->evt_ring[cd->evt_head % CXLA_EVENT_RING];
	rec->type = le32_to_cpu(ev->kind);
	rec->reserved = 0;
	rec->seq = le64_to_cpu(ev->seq);
	rec->value0 = le64_to_cpu(ev->value0);
	rec->value1 = le64_to_cpu(ev->value1);
	cd->evt_head++;
	cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_EVENTS);

	switch (rec->type) {
	case CXLA_EVENT_ERROR:
		dev_warn_ratelimited(&cd->dev,
				     "device error event: opcode %#llx status %llu\n",
				     rec->value0, rec->value1);
		break;
	case CXLA_EVENT_DEVMEM_MAPPED:
		dev_info_ratelimited(&cd->dev,
				     "device memory mapped at %#llx\n",
				     rec->value0);
		break;
	default:
		/* the part that set a handler (poison.c, ras.c) acts on it later */
		if (rec->type < CXLA_EVT_HANDLERS && cd->evt_handler[rec->type])
			cd->evt_handler[rec->type](cd);
		break;
	}
}

/*
 * The handler of an event type: called in interrupt context with evt_lock
 * held, when the event has been recorded in the event ring; it defers its
 * work.
 */
void cxla_evt_set_handler(struct cxla_dev *cd, u32 type,
			  void (*fn)(struct cxla_dev *cd))
{
	if (WARN_ON_ONCE(type >= CXLA_EVT_HANDLERS))
		return;
	spin_lock_irq(&cd->evt_lock);
	cd->evt_handler[type] = fn;
	spin_unlock_irq(&cd->evt_lock);
}

void cxla_evt_done(struct virtqueue *vq)
{
	struct cxla_dev *cd = vq->vdev->priv;
	struct cxla_event *ev;
	unsigned long flags;
	unsigned int len;
	bool got = false;

	spin_lock_irqsave(&cd->evt_lock, flags);
	while ((ev = virtqueue_get_buf(vq, &len))) {
		if (len >= sizeof(*ev)) {
			cxla_evt_record(cd, ev);
		} else {
			cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_PROTOCOL);
			dev_err_ratelimited(&cd->dev,
					    "event of %u bytes ignored\n", len);
		}
		if (!cd->stopped)
			cxla_evt_post(cd, ev, GFP_ATOMIC);
		got = true;
	}
	if (got && !cd->stopped)
		virtqueue_kick(vq);
	spin_unlock_irqrestore(&cd->evt_lock, flags);
	if (got)
		wake_up_interruptible_all(&cd->evt_wait);
}
