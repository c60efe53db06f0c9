// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: data commands (COPY, FILL, CHECKSUM, ATOMIC) on user memory
 * and device-memory buffers.
 *
 * User memory is pinned with pin_user_pages_fast() for the life of the
 * command and described to the device page by page by guest-physical
 * address (physically contiguous neighbours merged into one segment). A
 * page that belongs to this device's own memory (a pointer into an mmap of
 * a buffer) is sent as a device-memory offset instead. Large transfers are
 * split into chunks that respect the device's segment and request limits;
 * up to CXLA_PIPELINE chunks are in flight at once so several DMA engines
 * can work on them, except for CHECKSUM, where each chunk's crc seeds the
 * next one.
 */
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "cxl_accel.h"
#include "compat.h"
#include "core.h"
#include "devmem.h"
#include "dmabuf.h"
#include "ops.h"
#include "pool.h"
#include "private.h"
#include "vq.h"

#define CXLA_CHUNK		SZ_16M
#define CXLA_PIPELINE		8
/* data commands moving at most this much are polled for (the daemon runs them inline) */
#define CXLA_POLL_BYTES		SZ_64K

struct cxla_operand {
	struct cxla_buf *buf;	/* NULL: user memory */
	struct cxla_import *imp;	/* imported DMA-BUF (dmabuf.c) */
	u64 addr;		/* user address, or offset in buf */
};

struct cxla_xfer {
	u16 opcode;
	u16 hflags;
	struct cxla_operand *src;
	struct cxla_operand *dst;
	u64 len;
	u64 pattern;
	u32 crc;		/* CHECKSUM: seed in, crc out */
	unsigned int timeout_ms;
};

/*
 * Unpin in runs: the kernel then drops a large folio's pins at once (one
 * atomic for a 2 MiB page instead of 512). Device memory pages have no page
 * cache to dirty.
 */
void cxla_pin_release(struct cxla_pin *pin)
{
	unsigned int i, run;

	if (pin->imp)
		cxla_import_unpin(pin);
	if (!pin->pages)
		return;
	for (i = 0; i < pin->npages; i += run) {
		bool dirty = pin->write && !is_zone_device_page(pin->pages[i]);

		for (run = 1; i + run < pin->npages &&
		     is_zone_device_page(pin->pages[i + run]) ==
		     is_zone_device_page(pin->pages[i]); run++)
			;
		if (dirty)
			unpin_user_pages_dirty_lock(pin->pages + i, run, true);
		else
			unpin_user_pages(pin->pages + i, run);
	}
	kvfree(pin->pages);
	pin->pages = NULL;
	pin->npages = 0;
}

/*
 * The release hook of a request that carries user pages (req->pins) and
 * buffer references (req->bufs): vq.c calls it when the request is freed,
 * once the device returned it (also after quarantine) or it never went.
 */
void cxla_req_release_operands(struct cxla_req *req)
{
	int i;

	for (i = 0; i < CXLA_REQ_PINS; i++)
		cxla_pin_release(&req->pins[i]);
	for (i = 0; i < CXLA_REQ_BUFS; i++) {
		if (req->bufs[i])
			cxla_buf_put(req->bufs[i]);
		req->bufs[i] = NULL;
	}
}

/*
 * Pin npages user pages from first. pin_user_pages_fast() may pin fewer
 * than asked (it stops at a page it cannot take at once, such as a device
 * page that a long-term pin must move first, or an unmapped one): ask again
 * for the rest, whose error then says why (-EFAULT: not mapped, -EBUSY: the
 * page cannot be moved now). Returns npages or an error, nothing pinned.
 */
int cxla_pin_user(unsigned long first, unsigned long npages,
		  unsigned int gup_flags, struct page **pages)
{
	unsigned long done = 0;
	int got;

	while (done < npages) {
		got = pin_user_pages_fast(first + (done << PAGE_SHIFT),
					  npages - done, gup_flags, pages + done);
		if (got <= 0) {
			if (done)
				unpin_user_pages(pages, done);
			return got ?: -EFAULT;
		}
		done += got;
	}
	return done;
}

static int cxla_operand_get(struct cxla_file *cf, const struct cxl_accel_mem *m,
			    u64 len, struct cxla_operand *op)
{
	op->buf = NULL;
	op->imp = NULL;
	op->addr = m->addr;
	if (m->reserved)
		return -EINVAL;
	if (m->handle & CXL_ACCEL_HANDLE_IMPORTED)
		return cxla_import_operand_get(cf, m->handle, m->addr, len,
					       &op->imp);
	if (!m->handle) {
		if (m->addr + len < m->addr ||
		    !access_ok(u64_to_user_ptr(m->addr), len))
			return -EFAULT;
		return 0;
	}
	op->buf = cxla_file_buf_get(cf, m->handle);
	if (!op->buf)
		return -ENOENT;
	if (m->addr > op->buf->size || len > op->buf->size - m->addr) {
		cxla_buf_put(op->buf);
		op->buf = NULL;
		return -EINVAL;
	}
	return 0;
}

static void cxla_operand_put(struct cxla_operand *op)
{
	if (op->buf)
		cxla_buf_put(op->buf);
	op->buf = NULL;
	if (op->imp)
		cxla_import_put(op->imp);
	op->imp = NULL;
}

static void cxla_sge_set(struct cxla_sge *sge, u64 addr, u32 len, u16 space)
{
	sge->addr = cpu_to_le64(addr);
	sge->len = cpu_to_le32(len);
	sge->space = cpu_to_le16(space);
	sge->reserved = 0;
}

/* Pin the user pages of bytes [pos, pos + len) of an operand into pin. */
static int cxla_operand_pin(struct cxla_operand *op, u64 pos, u64 len,
			    bool write, struct cxla_pin *pin)
{
	unsigned long start, first, npages;
	int got;

	if (op->buf || op->imp)
		return 0;
	start = op->addr + pos;
	first = start & PAGE_MASK;
	npages = (PAGE_ALIGN(start + len) - first) >> PAGE_SHIFT;
	pin->pages = kvmalloc_array(npages, sizeof(*pin->pages), GFP_KERNEL);
	if (!pin->pages)
		return -ENOMEM;
	pin->write = write;
	got = cxla_pin_user(first, npages, write ? FOLL_WRITE : 0, pin->pages);
	if (got < 0) {
		kvfree(pin->pages);
		pin->pages = NULL;
		return got;
	}
	pin->npages = got;
	return 0;
}

/*
 * Segments of pinned user memory from byte off of the first page, len bytes:
 * physically contiguous pages merge (a large folio, in order, in one step).
 * Written to sge when given, else only counted. Returns the count.
 */
static int cxla_pin_sges(struct cxla_dev *cd, const struct cxla_pin *pin,
			 unsigned long off, u64 len, struct cxla_sge *sge,
			 unsigned int max)
{
	u64 left = len, last_end = 0;
	unsigned long i, run;
	u16 last_space = 0;
	unsigned int n = 0;

	for (i = 0; i < pin->npages && left; i += run) {
		struct page *page = pin->pages[i];
		struct folio *folio = page_folio(page);
		unsigned long idx = folio_page_idx(folio, page);
		unsigned long in_folio = folio_nr_pages(folio) - idx;
		u64 addr = page_to_phys(page) + off, chunk;
		u16 space = CXLA_SPACE_GPA;

		for (run = 1; run < in_folio && i + run < pin->npages &&
		     pin->pages[i + run] == folio_page(folio, idx + run); run++)
			;
		chunk = min_t(u64, ((u64)run << PAGE_SHIFT) - off, left);
		if (cxla_page_is_ours(cd, page)) {
			addr -= cd->devmem_gpa;
			space = CXLA_SPACE_DEVMEM;
		}
		if (n && last_space == space && last_end == addr) {
			if (sge)
				le32_add_cpu(&sge[n - 1].len, chunk);
		} else {
			if (n == max)
				return -E2BIG;
			if (sge)
				cxla_sge_set(&sge[n], addr, chunk, space);
			n++;
		}
		last_space = space;
		last_end = addr + chunk;
		left -= chunk;
		off = 0;
	}
	return n;
}

/*
 * Describe bytes [pos, pos + len) of an operand as segments (at most max);
 * user pages were pinned into pin (cxla_operand_pin), an import is pinned
 * into it here. Without sge, only counts (not for imports: max then).
 * Returns the segment count.
 */
static int cxla_operand_sges(struct cxla_dev *cd, struct cxla_operand *op,
			     u64 pos, u64 len, struct cxla_pin *pin,
			     struct cxla_sge *sge, unsigned int max)
{
	if (op->buf) {
		if (sge)
			cxla_sge_set(sge, op->buf->offset + op->addr + pos, len,
				     CXLA_SPACE_DEVMEM);
		return 1;
	}
	if (op->imp)
		return sge ? cxla_import_sges(cd, op->imp, op->addr + pos, len,
					      pin, sge, max) : max;
	return cxla_pin_sges(cd, pin, offset_in_page(op->addr + pos), len, sge,
			     max);
}

/* Bytes per command so that a chunk fits the device's limits. */
static u64 cxla_chunk_bytes(struct cxla_dev *cd)
{
	u64 by_segs = (u64)(cd->max_segments - 2) << PAGE_SHIFT;
	u64 by_req = (u64)((cd->max_request - 64) / (2 * sizeof(struct cxla_sge)) - 2)
			<< PAGE_SHIFT;

	return max_t(u64, PAGE_SIZE, min3((u64)CXLA_CHUNK, by_segs, by_req));
}

static struct cxla_req *cxla_build_chunk(struct cxla_dev *cd,
					 struct cxla_xfer *x, u64 pos, u64 clen)
{
	unsigned int max = (clen >> PAGE_SHIFT) + 2;
	struct cxla_operand *ops[CXLA_REQ_PINS] = { x->src, x->dst };
	struct cxla_pin pins[CXLA_REQ_PINS] = { };
	int want[CXLA_REQ_PINS] = { }, got[CXLA_REQ_PINS] = { };
	unsigned int nsrc, ndst, k;
	size_t head, plen;
	struct cxla_sge *sge;
	struct cxla_req *req;
	void *p;
	int n = 0;

	switch (x->opcode) {
	case CXLA_OP_COPY:
		head = sizeof(struct cxla_copy);
		break;
	case CXLA_OP_FILL:
		head = sizeof(struct cxla_fill);
		break;
	default:
		head = sizeof(struct cxla_checksum);
		break;
	}
	/*
	 * Pin first and count the segments: the request is as long as they
	 * are (a THP-backed 16 MiB is 8 segments, not 4096), so it is neither
	 * allocated nor cleared at its worst-case size.
	 */
	for (k = 0; k < CXLA_REQ_PINS; k++) {
		if (!ops[k])
			continue;
		n = cxla_operand_pin(ops[k], pos, clen, k == 1, &pins[k]);
		if (!n)
			n = want[k] = cxla_operand_sges(cd, ops[k], pos, clen,
							&pins[k], NULL, max);
		if (n < 0)
			goto unpin;
	}
	plen = head + (want[0] + want[1]) * sizeof(*sge);
	req = cxla_req_alloc(cd, x->opcode, x->hflags, plen, 0);
	if (IS_ERR(req)) {
		n = PTR_ERR(req);
		goto unpin;
	}
	memcpy(req->pins, pins, sizeof(pins));	/* released with the request */
	req->release = cxla_req_release_operands;
	p = cxla_req_payload(req);
	sge = p + head;
	for (k = 0; k < CXLA_REQ_PINS; k++) {
		if (!ops[k])
			continue;
		n = cxla_operand_sges(cd, ops[k], pos, clen, &req->pins[k],
				      sge + got[0], want[k]);
		if (n < 0)
			goto err;
		got[k] = n;
		if (ops[k]->buf) {
			cxla_buf_get(ops[k]->buf);
			req->bufs[k] = ops[k]->buf;
		}
	}
	nsrc = got[0];
	ndst = got[1];

	switch (x->opcode) {
	case CXLA_OP_COPY: {
		struct cxla_copy *c = p;

		c->nr_src = cpu_to_le32(nsrc);
		c->nr_dst = cpu_to_le32(ndst);
		break;
	}
	case CXLA_OP_FILL: {
		struct cxla_fill *f = p;

		f->pattern = cpu_to_le64(x->pattern);
		f->nr_dst = cpu_to_le32(ndst);
		break;
	}
	default: {
		struct cxla_checksum *c = p;

		c->nr_src = cpu_to_le32(nsrc);
		c->seed = cpu_to_le32(x->crc);
		break;
	}
	}
	req->out_len = sizeof(struct cxla_cmd_hdr) + head +
		       (nsrc + ndst) * sizeof(*sge);
	req->poll = clen <= CXLA_POLL_BYTES && !(x->hflags & CXLA_FLAG_FENCE);
	return req;
unpin:
	for (k = 0; k < CXLA_REQ_PINS; k++)
		cxla_pin_release(&pins[k]);
	return ERR_PTR(n);
err:
	cxla_req_free(cd, req);
	return ERR_PTR(n);
}

/* Wait for one chunk and free it; CHECKSUM results feed x->crc. */
static int cxla_finish_chunk(struct cxla_dev *cd, struct cxla_xfer *x,
			     struct cxla_req *req, u64 clen, unsigned long timeout)
{
	int ret = cxla_req_wait(cd, &req, timeout, true);

	if (!req)
		return ret;	/* abandoned to the queue */
	if (!ret && x->opcode == CXLA_OP_CHECKSUM) {
		struct cxla_resp *resp = cxla_req_resp(req);

		if (le64_to_cpu(resp->result1) != clen) {
			cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_PROTOCOL);
			dev_err_ratelimited(&cd->dev,
					    "CHECKSUM of %llu bytes reports %llu bytes\n",
					    clen, le64_to_cpu(resp->result1));
			ret = -EIO;
		} else {
			x->crc = (u32)le64_to_cpu(resp->result0);
		}
	}
	cxla_req_free(cd, req);
	return ret;
}

static int cxla_run_xfer(struct cxla_dev *cd, struct cxla_xfer *x)
{
	struct {
		struct cxla_req *req;
		u64 len;
	} ring[CXLA_PIPELINE];
	unsigned long timeout = cxla_timeout_jiffies(x->timeout_ms);
	unsigned int depth, head = 0, count = 0;
	u64 chunk = cxla_chunk_bytes(cd);
	u64 pos = 0;
	int ret = 0, r;

	depth = clamp_t(unsigned int, cd->num_dma_engines + 1, 1, CXLA_PIPELINE);
	if (x->opcode == CXLA_OP_CHECKSUM)
		depth = 1;	/* chained through the seed */

	while (pos < x->len) {
		u64 clen = min(chunk, x->len - pos);
		struct cxla_req *req;

		if (count == depth) {
			r = cxla_finish_chunk(cd, x, ring[head].req,
					      ring[head].len, timeout);
			head = (head + 1) % depth;
			count--;
			if (r) {
				ret = r;
				break;
			}
		}
		req = cxla_build_chunk(cd, x, pos, clen);
		if (IS_ERR(req)) {
			ret = PTR_ERR(req);
			break;
		}
		r = cxla_req_submit(cd, req, jiffies + timeout, true);
		if (r) {
			cxla_req_free(cd, req);
			ret = r;
			break;
		}
		ring[(head + count) % depth].req = req;
		ring[(head + count) % depth].len = clen;
		count++;
		pos += clen;
		if (fatal_signal_pending(current)) {
			ret = -EINTR;
			break;
		}
	}
	while (count) {
		r = cxla_finish_chunk(cd, x, ring[head].req, ring[head].len,
				      timeout);
		head = (head + 1) % depth;
		count--;
		if (r && !ret)
			ret = r;
	}
	return ret;
}

static u16 cxla_hflags(u32 flags)
{
	return (flags & CXL_ACCEL_OP_FENCE) ? CXLA_FLAG_FENCE : 0;
}

/*
 * The common part of COPY, FILL and CHECKSUM: check the length and the
 * flags, resolve the source and the destination that are given (NULL: the
 * command has none), run the transfer and drop the operands again.
 */
static int cxla_ioc_xfer(struct cxla_file *cf, struct cxla_xfer *x,
			 const struct cxl_accel_mem *msrc,
			 const struct cxl_accel_mem *mdst,
			 u64 len, u32 flags, u32 timeout_ms)
{
	struct cxla_operand src, dst;
	int ret;

	if (!len || (flags & ~CXL_ACCEL_OP_FENCE))
		return -EINVAL;
	if (msrc) {
		ret = cxla_operand_get(cf, msrc, len, &src);
		if (ret)
			return ret;
		x->src = &src;
	}
	if (mdst) {
		ret = cxla_operand_get(cf, mdst, len, &dst);
		if (ret)
			goto out_src;
		x->dst = &dst;
	}
	x->hflags = cxla_hflags(flags);
	x->len = len;
	x->timeout_ms = timeout_ms;
	ret = cxla_run_xfer(cf->dev, x);
	if (mdst)
		cxla_operand_put(&dst);
out_src:
	if (msrc)
		cxla_operand_put(&src);
	x->src = NULL;
	x->dst = NULL;
	return ret;
}

long cxla_ioc_copy(struct cxla_file *cf, void __user *arg)
{
	struct cxla_xfer x = { .opcode = CXLA_OP_COPY };
	struct cxl_accel_copy c;

	if (copy_from_user(&c, arg, sizeof(c)))
		return -EFAULT;
	return cxla_ioc_xfer(cf, &x, &c.src, &c.dst, c.len, c.flags,
			     c.timeout_ms);
}

long cxla_ioc_fill(struct cxla_file *cf, void __user *arg)
{
	struct cxla_xfer x = { .opcode = CXLA_OP_FILL };
	struct cxl_accel_fill f;

	if (copy_from_user(&f, arg, sizeof(f)))
		return -EFAULT;
	x.pattern = f.pattern;
	return cxla_ioc_xfer(cf, &x, NULL, &f.dst, f.len, f.flags,
			     f.timeout_ms);
}

long cxla_ioc_checksum(struct cxla_file *cf, void __user *arg)
{
	struct cxla_xfer x = { .opcode = CXLA_OP_CHECKSUM };
	struct cxl_accel_checksum c;
	int ret;

	if (copy_from_user(&c, arg, sizeof(c)))
		return -EFAULT;
	x.crc = c.seed;
	ret = cxla_ioc_xfer(cf, &x, &c.src, NULL, c.len, c.flags,
			    c.timeout_ms);
	if (ret)
		return ret;
	c.crc = x.crc;
	return copy_to_user(arg, &c, sizeof(c)) ? -EFAULT : 0;
}

static void cxla_atomic_payload(struct cxla_atomic *p,
				const struct cxl_accel_atomic *a, u64 addr,
				u16 space)
{
	p->op = cpu_to_le16(a->op);
	p->width = cpu_to_le16(a->width);
	p->space = cpu_to_le16(space);
	p->addr = cpu_to_le64(addr);
	p->operand = cpu_to_le64(a->operand);
	p->compare = cpu_to_le64(a->compare);
	p->repeat = cpu_to_le64(a->repeat ? a->repeat : 1);
}

/*
 * ATOMIC with CXL_ACCEL_ATOMIC_EXCLUSIVE: the page becomes device-exclusive
 * and stays locked while the device works on it, so a CPU access waits
 * until the device is done (and then takes the page back). A command that
 * times out lets the lock go (the CPU could race with a late device write,
 * into a page still held); the result is unknown then.
 */
static long cxla_atomic_exclusive(struct cxla_file *cf,
				  struct cxl_accel_atomic *a, void __user *arg)
{
	struct cxla_dev *cd = cf->dev;
	struct mm_struct *mm = current->mm;
	struct cxla_page_hold *hold;
	struct cxla_req *req;
	struct page *page;
	u64 addr;
	u16 space;
	int ret;

	if (a->target.handle || a->target.reserved || !mm)
		return -EINVAL;		/* user memory only */
	if (!cd->priv)
		return -EOPNOTSUPP;	/* no CONFIG_DEVICE_PRIVATE */
	hold = cxla_page_hold_alloc(1);
	req = cxla_req_alloc(cd, CXLA_OP_ATOMIC, cxla_hflags(a->flags),
			     sizeof(struct cxla_atomic), 0);
	if (!hold || IS_ERR(req)) {
		cxla_page_hold_free(hold);
		return IS_ERR(req) ? PTR_ERR(req) : -ENOMEM;
	}
	ret = mmap_read_lock_killable(mm);
	if (ret)
		goto err;
	page = cxla_make_exclusive(mm, a->target.addr & PAGE_MASK, cd->mig);
	mmap_read_unlock(mm);
	if (IS_ERR(page)) {
		ret = PTR_ERR(page);
		/* busy and unsupported as they are; anything else: no such page */
		if (ret != -EOPNOTSUPP && ret != -EBUSY)
			ret = -EFAULT;
		goto err;
	}
	ret = cxla_page_dev_addr(cd, page, &addr, &space);
	if (ret) {
		unlock_page(page);
		put_page(page);
		goto err;
	}
	hold->pages[hold->n++] = page;	/* our reference: the request's */
	cxla_req_set_hold(req, hold);
	cxla_atomic_payload(cxla_req_payload(req), a,
			    addr + offset_in_page(a->target.addr), space);
	cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_EXCLUSIVE);
	ret = cxla_exec(cd, &req, a->timeout_ms, true);
	unlock_page(page);
	if (!ret) {
		struct cxla_resp *resp = cxla_req_resp(req);

		a->result = le64_to_cpu(resp->result0);
		a->count = le64_to_cpu(resp->result1);
		if (copy_to_user(arg, a, sizeof(*a)))
			ret = -EFAULT;
	}
	cxla_req_free(cd, req);		/* NULL if quarantined */
	return ret;

err:
	cxla_page_hold_free(hold);
	cxla_req_free(cd, req);
	return ret;
}

long cxla_ioc_atomic(struct cxla_file *cf, void __user *arg)
{
	struct cxla_dev *cd = cf->dev;
	struct cxl_accel_atomic a;
	struct cxla_operand op;
	struct cxla_atomic *p;
	struct cxla_resp *resp;
	struct cxla_req *req;
	struct cxla_sge sge;
	int ret;

	if (copy_from_user(&a, arg, sizeof(a)))
		return -EFAULT;
	if (a.op > CXL_ACCEL_ATOMIC_SWAP || (a.width != 4 && a.width != 8) ||
	    a.reserved ||
	    (a.flags & ~(CXL_ACCEL_OP_FENCE | CXL_ACCEL_ATOMIC_EXCLUSIVE)) ||
	    !IS_ALIGNED(a.target.addr, a.width) ||
	    (a.op != CXL_ACCEL_ATOMIC_FETCH_ADD && a.repeat > 1) ||
	    a.repeat > CXLA_MAX_ATOMIC_REPEAT)
		return -EINVAL;
	if (a.flags & CXL_ACCEL_ATOMIC_EXCLUSIVE)
		return cxla_atomic_exclusive(cf, &a, arg);
	ret = cxla_operand_get(cf, &a.target, a.width, &op);
	if (ret)
		return ret;

	req = cxla_req_alloc(cd, CXLA_OP_ATOMIC, cxla_hflags(a.flags),
			     sizeof(*p), 0);
	if (IS_ERR(req)) {
		cxla_operand_put(&op);
		return PTR_ERR(req);
	}
	req->release = cxla_req_release_operands;
	/* reuse the segment builder for the one word, then unpack it */
	ret = cxla_operand_pin(&op, 0, a.width, true, &req->pins[0]);
	if (!ret)
		ret = cxla_operand_sges(cd, &op, 0, a.width, &req->pins[0], &sge, 1);
	if (ret < 0)
		goto out;
	req->bufs[0] = op.buf;	/* the request owns the reference now */
	op.buf = NULL;

	p = cxla_req_payload(req);
	cxla_atomic_payload(p, &a, le64_to_cpu(sge.addr), le16_to_cpu(sge.space));
	/* each repetition moves a word each way: small ones run at once */
	req->poll = le64_to_cpu(p->repeat) <= CXLA_POLL_BYTES / 16 &&
		    !(a.flags & CXL_ACCEL_OP_FENCE);

	ret = cxla_exec(cd, &req, a.timeout_ms, true);
	if (!ret) {
		resp = cxla_req_resp(req);
		a.result = le64_to_cpu(resp->result0);
		a.count = le64_to_cpu(resp->result1);
		if (copy_to_user(arg, &a, sizeof(a)))
			ret = -EFAULT;
	}
out:
	cxla_req_free(cd, req);
	cxla_operand_put(&op);
	return ret;
}
