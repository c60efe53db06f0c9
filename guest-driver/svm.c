// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: shared virtual memory. The device reads and writes a process's
 * virtual addresses directly.
 *
 * Mirrors. Each open file has one device mirror per process (mm) that uses
 * it: an xarray from virtual page to the pfn the device may use (and
 * whether it may write it), filled from hmm_range_fault() and emptied by an
 * mmu_interval_notifier over the whole address space on every
 * invalidation: munmap, mprotect, COW break, migration (ours included),
 * reclaim, exit. An access first looks for the window in the mirror; if
 * anything is missing it faults the window in with hmm_range_fault() and
 * checks the notifier sequence (mmu_interval_read_begin / read_retry)
 * under the mirror lock before using the pfns.
 *
 * Device accesses in flight. The device has no page table of its own: a
 * command carries the physical addresses. While the mirror lock is held
 * (no invalidation can run for the mirror), the access takes a reference
 * on each page and registers its range as in flight; then it drops the
 * lock and lets the device work. An invalidation that overlaps a range in
 * flight waits until the device has finished with it before it returns, so
 * after munmap(), mprotect() or fork() returns, the device no longer
 * touches the old pages. The range stays registered, and the page
 * references stay taken, until the device hands the command back, also
 * when the ioctl gave up on it (timeout, signal: quarantine, vq.c): a late
 * device write must neither land in a page that went back to the
 * allocator nor in one that fork() has shared with a child since. So a
 * mirror lives as long as its last access, after its file is closed too,
 * and keeps its notifier registered until then. Nothing that can allocate
 * memory runs with the mirror lock held or between registering a range and
 * submitting the command: reclaim could call the notifier of the same
 * mirror.
 *
 * Windows are at most CXLA_SVM_WINDOW pages, so that a request fits one
 * page and the submission path needs no allocation.
 */
#include <linux/hmm.h>
#include <linux/memremap.h>
#include <linux/mm.h>
#include <linux/mmap_lock.h>
#include <linux/mmu_notifier.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/xarray.h>

#include "cxl_accel.h"
#include "compat.h"
#include "core.h"
#include "devmem.h"
#include "migrate.h"
#include "ops.h"
#include "pool.h"
#include "private.h"
#include "svm.h"
#include "vq.h"

#define CXLA_SVM_WINDOW		240	/* pages per device command */
#define CXLA_SVM_SNAP_WINDOW	512	/* pages per hmm_range_fault() of SNAPSHOT */
#define CXLA_SVM_MAX_MIRRORS	64	/* live processes per file */
#define CXLA_SVM_MAX_LEN	SZ_1G
#define CXLA_PIN_MAX_LEN	SZ_256M
#define CXLA_SVM_FAULT_MS	2000	/* retry budget of one window */
#define CXLA_SVM_INVAL_WAIT	(60 * HZ)
#define CXLA_SVM_MAX_TIMEOUT_MS	30000

struct cxla_svm_file {
	struct mutex lock;		/* mirrors */
	struct list_head mirrors;
	unsigned int nmirrors;
};

struct cxla_mirror {
	struct kref ref;		/* the file's list, accesses in flight */
	struct list_head node;		/* cxla_svm_file.mirrors */
	struct cxla_dev *cd;		/* holds a device reference */
	struct mmu_interval_notifier notifier;
	struct mutex lock;		/* pt; the invalidation takes it */
	struct xarray pt;		/* page index -> pfn << 1 | writable */
	spinlock_t wlock;		/* windows */
	struct list_head windows;	/* device accesses in flight */
	wait_queue_head_t wq;		/* a window finished */
};

struct cxla_window {
	struct list_head node;
	unsigned long start;
	unsigned long end;
	bool given_up;		/* an invalidation waited in vain: not again */
};

/* A device access in flight: the release data of its request */
struct cxla_svm_access {
	struct cxla_window w;		/* on m->windows */
	struct cxla_mirror *m;		/* a mirror reference */
	struct cxla_page_hold *hold;
};

static bool cxla_mirror_busy(struct cxla_mirror *m, unsigned long start,
			     unsigned long end)
{
	struct cxla_window *w;
	bool busy = false;

	spin_lock(&m->wlock);
	list_for_each_entry(w, &m->windows, node) {
		if (w->start < end && start < w->end && !w->given_up) {
			busy = true;
			break;
		}
	}
	spin_unlock(&m->wlock);
	return busy;
}

/* A device that does not finish in CXLA_SVM_INVAL_WAIT is not waited for again. */
static void cxla_mirror_give_up(struct cxla_mirror *m, unsigned long start,
				unsigned long end)
{
	struct cxla_window *w;

	spin_lock(&m->wlock);
	list_for_each_entry(w, &m->windows, node)
		if (w->start < end && start < w->end)
			w->given_up = true;
	spin_unlock(&m->wlock);
}

static bool cxla_mirror_invalidate(struct mmu_interval_notifier *mni,
				   const struct mmu_notifier_range *range,
				   unsigned long cur_seq)
{
	struct cxla_mirror *m = container_of(mni, struct cxla_mirror, notifier);
	struct cxla_mig *mig = m->cd->mig;
	unsigned long start = range->start, end = range->end, idx, n = 0;
	bool blockable = mmu_notifier_range_blockable(range);
	void *entry;

	if (blockable)
		mutex_lock(&m->lock);
	else if (!mutex_trylock(&m->lock))
		return false;
	if (!blockable && cxla_mirror_busy(m, start, end)) {
		mutex_unlock(&m->lock);
		return false;
	}
	mmu_interval_set_seq(mni, cur_seq);
	xa_for_each_range(&m->pt, idx, entry, start >> PAGE_SHIFT,
			  (end - 1) >> PAGE_SHIFT) {
		xa_erase(&m->pt, idx);
		n++;
	}
	mutex_unlock(&m->lock);
	if (n)
		atomic64_inc(&mig->stat[CXLA_MS_SVM_INVAL]);

	/* the device must be done with the old pages when we return */
	if (blockable && cxla_mirror_busy(m, start, end)) {
		atomic64_inc(&mig->stat[CXLA_MS_SVM_INVAL_WAITS]);
		if (!wait_event_timeout(m->wq, !cxla_mirror_busy(m, start, end),
					CXLA_SVM_INVAL_WAIT)) {
			cxla_mirror_give_up(m, start, end);
			dev_warn_ratelimited(&m->cd->dev,
					     "invalidation of %#lx-%#lx gave up waiting for a device access (device not answering)\n",
					     start, end);
		}
	}
	return true;
}

static const struct mmu_interval_notifier_ops cxla_mirror_ops = {
	.invalidate = cxla_mirror_invalidate,
};

static void cxla_mirror_release(struct kref *ref)
{
	struct cxla_mirror *m = container_of(ref, struct cxla_mirror, ref);
	struct cxla_dev *cd = m->cd;

	mmu_interval_notifier_remove(&m->notifier);
	xa_destroy(&m->pt);
	atomic64_dec(&cd->mig->stat[CXLA_MS_SVM_MIRRORS]);
	kfree(m);
	put_device(&cd->dev);
}

/* May sleep: the last reference removes the notifier. */
static void cxla_mirror_put(struct cxla_mirror *m)
{
	kref_put(&m->ref, cxla_mirror_release);
}

/* The device returned the command (or was reset): the access is over. */
static void cxla_svm_access_release(struct cxla_req *req)
{
	struct cxla_svm_access *a = req->release_data;
	struct cxla_mirror *m = a->m;

	spin_lock(&m->wlock);
	list_del(&a->w.node);
	spin_unlock(&m->wlock);
	wake_up_all(&m->wq);
	cxla_page_hold_free(a->hold);
	kfree(a);
	req->release_data = NULL;
	req->release = NULL;
	cxla_req_release_operands(req);	/* the buffer of READ, WRITE */
	cxla_mirror_put(m);
}

static struct cxla_svm_file *cxla_svm_file_get(struct cxla_file *cf)
{
	struct cxla_svm_file *sf = READ_ONCE(cf->svm);

	if (sf)
		return sf;
	sf = kzalloc(sizeof(*sf), GFP_KERNEL);
	if (!sf)
		return NULL;
	mutex_init(&sf->lock);
	INIT_LIST_HEAD(&sf->mirrors);
	if (cmpxchg(&cf->svm, NULL, sf)) {
		kfree(sf);
		sf = READ_ONCE(cf->svm);
	}
	return sf;
}

/*
 * mmu_interval_notifier_insert() for a system call. An mm's first notifier
 * takes all its locks, which gives up with -EINTR when anything is pending:
 * a signal, but also task work (TIF_NOTIFY_SIGNAL, io_uring's when a ring
 * closes), which only runs on the way back to user space. -ERESTARTSYS lets
 * it run and the call start again; a signal with a handler still ends the
 * call with EINTR.
 */
int cxla_notifier_insert(struct mmu_interval_notifier *sub,
			 struct mm_struct *mm, unsigned long start,
			 unsigned long length,
			 const struct mmu_interval_notifier_ops *ops)
{
	int ret = mmu_interval_notifier_insert(sub, mm, start, length, ops);

	return ret == -EINTR ? -ERESTARTSYS : ret;
}

/* The mirror of the calling process in this file, made on first use. */
static struct cxla_mirror *cxla_mirror_get(struct cxla_file *cf)
{
	struct mm_struct *mm = current->mm;
	struct cxla_mirror *m, *t;
	struct cxla_svm_file *sf;
	int ret;

	if (!mm)
		return ERR_PTR(-EINVAL);
	sf = cxla_svm_file_get(cf);
	if (!sf)
		return ERR_PTR(-ENOMEM);
	mutex_lock(&sf->lock);
	list_for_each_entry_safe(m, t, &sf->mirrors, node) {
		if (m->notifier.mm == mm)
			goto out;
		/* forget processes that exited (a forked child's mirror) */
		if (!atomic_read(&m->notifier.mm->mm_users)) {
			list_del(&m->node);
			sf->nmirrors--;
			cxla_mirror_put(m);
		}
	}
	if (sf->nmirrors >= CXLA_SVM_MAX_MIRRORS) {
		m = ERR_PTR(-EMFILE);
		goto out;
	}
	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m) {
		m = ERR_PTR(-ENOMEM);
		goto out;
	}
	kref_init(&m->ref);
	m->cd = cf->dev;
	mutex_init(&m->lock);
	xa_init(&m->pt);
	spin_lock_init(&m->wlock);
	INIT_LIST_HEAD(&m->windows);
	init_waitqueue_head(&m->wq);
	ret = cxla_notifier_insert(&m->notifier, mm, 0, ULONG_MAX & PAGE_MASK,
				   &cxla_mirror_ops);
	if (ret) {
		kfree(m);
		m = ERR_PTR(ret);
		goto out;
	}
	get_device(&cf->dev->dev);
	atomic64_inc(&cf->dev->mig->stat[CXLA_MS_SVM_MIRRORS]);
	list_add_tail(&m->node, &sf->mirrors);
	sf->nmirrors++;
out:
	mutex_unlock(&sf->lock);
	return m;
}

/* File closed: no ioctl runs any more. */
void cxla_svm_release(struct cxla_file *cf)
{
	struct cxla_svm_file *sf = cf->svm;
	struct cxla_mirror *m, *t;

	if (!sf)
		return;
	/* accesses still in flight keep their mirror until the device is done */
	list_for_each_entry_safe(m, t, &sf->mirrors, node) {
		list_del(&m->node);
		cxla_mirror_put(m);
	}
	mutex_destroy(&sf->lock);
	kfree(sf);
	cf->svm = NULL;
}

/* Mirror lock held: does the mirror cover the window (for writing)? */
static bool cxla_mirror_lookup(struct cxla_mirror *m, unsigned long start,
			       unsigned int npages, bool write,
			       unsigned long *pfns)
{
	unsigned long base = start >> PAGE_SHIFT, v;
	unsigned int i;
	void *e;

	for (i = 0; i < npages; i++) {
		e = xa_load(&m->pt, base + i);
		if (!e)
			return false;
		v = xa_to_value(e);
		if (write && !(v & 1))
			return false;
		pfns[i] = (v >> 1) | HMM_PFN_VALID | ((v & 1) ? HMM_PFN_WRITE : 0);
	}
	return true;
}

/* Mirror lock held, sequence checked: remember the pfns (best effort). */
static void cxla_mirror_store(struct cxla_mirror *m, unsigned long start,
			      unsigned int npages, const unsigned long *pfns)
{
	unsigned long base = start >> PAGE_SHIFT, pfn;
	unsigned int i;
	void *old;

	for (i = 0; i < npages; i++) {
		if (!(pfns[i] & HMM_PFN_VALID))
			continue;
		pfn = pfns[i] & ~HMM_PFN_FLAGS;
		old = xa_store(&m->pt, base + i,
			       xa_mk_value(pfn << 1 | !!(pfns[i] & HMM_PFN_WRITE)),
			       GFP_NOWAIT | __GFP_NOWARN);
		if (xa_is_err(old))
			break;
	}
}

/*
 * A device write may not land in a private page of ours that the CPU maps
 * read-only (shared after fork, or mprotect): hmm_range_fault() does not
 * fault this device's own private pages, whatever the access. Such pages
 * go back to RAM first; the next look faults them writable (copy on
 * write) or refuses the write (-EPERM). Returns whether there were any.
 */
static bool cxla_svm_readonly_private(struct cxla_mirror *m,
				      unsigned long start, unsigned int npages,
				      const unsigned long *pfns)
{
	struct cxla_dev *cd = m->cd;
	struct cxl_accel_migrate res = { };
	struct cxla_mig_ctx x = {
		.mig = cd->mig,
		.mode = CXLA_MIG_TO_RAM,
		.priv = true,
		.intr = true,
		.dma = true,
		.cpu_fallback = true,
		.res = &res,
		.timeout_ms = min_t(u32, READ_ONCE(cxla_cmd_timeout_ms),
				    CXLA_MIG_MAX_TIMEOUT_MS),
	};
	unsigned int i;

	for (i = 0; i < npages; i++)
		if ((pfns[i] & (HMM_PFN_VALID | HMM_PFN_WRITE)) == HMM_PFN_VALID &&
		    cxla_page_is_priv(cd, hmm_pfn_to_page(pfns[i])))
			break;
	if (i == npages)
		return false;
	if (!cxla_mig_ctx_alloc(&x, npages)) {
		cxla_migrate_range(&x, m->notifier.mm, start,
				   start + ((unsigned long)npages << PAGE_SHIFT));
		cxla_mig_ctx_free(&x);
	}
	return true;
}

/*
 * Resolve [start, start + npages) for the device: from the mirror, else
 * with hmm_range_fault(). Returns with the mirror lock held and the pfns
 * valid until it is dropped.
 */
static int cxla_mirror_resolve(struct cxla_mirror *m, unsigned long start,
			       unsigned int npages, bool write,
			       unsigned long *pfns, struct cxl_accel_svm *s)
{
	struct cxla_mig *mig = m->cd->mig;
	struct mm_struct *mm = m->notifier.mm;
	struct hmm_range range = {
		.notifier = &m->notifier,
		.start = start,
		.end = start + ((unsigned long)npages << PAGE_SHIFT),
		.hmm_pfns = pfns,
		.default_flags = HMM_PFN_REQ_FAULT |
				 (write ? HMM_PFN_REQ_WRITE : 0),
		/* this device's private pages are its own: no fault */
		.dev_private_owner = cxla_priv_owner(m->cd),
	};
	unsigned long timeout = jiffies + msecs_to_jiffies(CXLA_SVM_FAULT_MS);
	int ret;

	mutex_lock(&m->lock);
	if (cxla_mirror_lookup(m, start, npages, write, pfns)) {
		s->mirror_hits++;
		atomic64_inc(&mig->stat[CXLA_MS_SVM_HITS]);
		return 0;
	}
	mutex_unlock(&m->lock);

	for (;;) {
		if (time_after(jiffies, timeout))
			return -EBUSY;
		if (fatal_signal_pending(current))
			return -EINTR;
		range.notifier_seq = mmu_interval_read_begin(&m->notifier);
		mmap_read_lock(mm);
		ret = cxla_hmm_range_fault(&range);
		mmap_read_unlock(mm);
		s->faults++;
		atomic64_inc(&mig->stat[CXLA_MS_SVM_FAULTS]);
		if (ret == -EBUSY) {
			s->retries++;
			atomic64_inc(&mig->stat[CXLA_MS_SVM_RETRIES]);
			continue;
		}
		if (ret)
			return ret;
		if (write && cxla_svm_readonly_private(m, start, npages, pfns)) {
			s->retries++;
			continue;
		}
		mutex_lock(&m->lock);
		if (!mmu_interval_read_retry(&m->notifier, range.notifier_seq))
			break;
		mutex_unlock(&m->lock);
		s->retries++;
		atomic64_inc(&mig->stat[CXLA_MS_SVM_RETRIES]);
	}
	cxla_mirror_store(m, start, npages, pfns);
	return 0;
}

static void cxla_sge_add(struct cxla_sge *sge, unsigned int *n, u64 addr,
			 u32 len, u16 space)
{
	struct cxla_sge *last = *n ? &sge[*n - 1] : NULL;

	if (last && le16_to_cpu(last->space) == space &&
	    le64_to_cpu(last->addr) + le32_to_cpu(last->len) == addr) {
		le32_add_cpu(&last->len, len);
		return;
	}
	sge[*n].addr = cpu_to_le64(addr);
	sge[*n].len = cpu_to_le32(len);
	sge[*n].space = cpu_to_le16(space);
	sge[*n].reserved = 0;
	(*n)++;
}

/* Describe a page piece for the device: local memory by offset, else GPA. */
static int cxla_page_sge(struct cxla_dev *cd, struct page *page, u32 off,
			 u32 len, struct cxla_sge *sge, unsigned int *n)
{
	u64 addr;
	u16 space;
	int ret;

	ret = cxla_page_dev_addr(cd, page, &addr, &space);
	if (!ret)
		cxla_sge_add(sge, n, addr + off, len, space);
	return ret;
}

struct cxla_svm_ctx {
	struct cxla_dev *cd;
	struct cxla_mirror *m;
	struct cxl_accel_svm *s;
	struct cxla_buf *buf;
	unsigned long *pfns;
	u64 crc;
};

static u64 cxla_ror_pattern(u64 pattern, u64 pos)
{
	unsigned int sh = (pos % 8) * 8;

	return sh ? (pattern >> sh) | (pattern << (64 - sh)) : pattern;
}

/* One device command on [uaddr, uaddr + len), within one window. */
static int cxla_svm_window(struct cxla_svm_ctx *x, u64 uaddr, u32 len, u64 pos)
{
	struct cxla_dev *cd = x->cd;
	struct cxla_mirror *m = x->m;
	struct cxl_accel_svm *s = x->s;
	unsigned long start = uaddr & PAGE_MASK;
	unsigned int npages = (PAGE_ALIGN(uaddr + len) - start) >> PAGE_SHIFT;
	bool write = s->op == CXL_ACCEL_SVM_WRITE || s->op == CXL_ACCEL_SVM_FILL;
	struct cxla_svm_access *a;
	struct cxla_page_hold *hold;
	struct cxla_sge *sge, *user;
	unsigned int nuser = 0, i;
	struct cxla_req *req;
	size_t head;
	u16 opcode;
	u32 off;
	void *p;
	int ret;

	switch (s->op) {
	case CXL_ACCEL_SVM_READ:
	case CXL_ACCEL_SVM_WRITE:
		opcode = CXLA_OP_COPY;
		head = sizeof(struct cxla_copy);
		break;
	case CXL_ACCEL_SVM_CHECKSUM:
		opcode = CXLA_OP_CHECKSUM;
		head = sizeof(struct cxla_checksum);
		break;
	default:
		opcode = CXLA_OP_FILL;
		head = sizeof(struct cxla_fill);
		break;
	}
	/* everything that allocates happens before the mirror lock */
	req = cxla_req_alloc(cd, opcode, 0, head + (npages + 1) * sizeof(*sge), 0);
	if (IS_ERR(req))
		return PTR_ERR(req);
	a = kzalloc(sizeof(*a), GFP_KERNEL);
	hold = cxla_page_hold_alloc(npages);
	if (!a || !hold) {
		kfree(a);
		cxla_page_hold_free(hold);
		cxla_req_free(cd, req);
		return -ENOMEM;
	}
	p = cxla_req_payload(req);
	sge = p + head;
	/* the buffer operand goes first for WRITE (source), last for READ */
	user = s->op == CXL_ACCEL_SVM_WRITE ? sge + 1 : sge;

	ret = cxla_mirror_resolve(m, start, npages, write, x->pfns, s);
	if (ret) {
		kfree(a);
		cxla_page_hold_free(hold);
		cxla_req_free(cd, req);
		return ret;
	}
	/* mirror lock held: the pages are mapped and cannot go away */
	off = offset_in_page(uaddr);
	for (i = 0; i < npages && !ret; i++) {
		struct page *page = hmm_pfn_to_page(x->pfns[i]);
		u32 piece = min_t(u32, PAGE_SIZE - off, len);

		ret = cxla_page_sge(cd, page, off, piece, user, &nuser);
		get_page(page);
		hold->pages[hold->n++] = page;
		len -= piece;
		off = 0;
	}
	if (ret) {
		mutex_unlock(&m->lock);
		kfree(a);
		cxla_page_hold_free(hold);
		cxla_req_free(cd, req);
		return ret;
	}
	/* in flight until the request is freed: after the device is done */
	a->w.start = start;
	a->w.end = start + ((unsigned long)npages << PAGE_SHIFT);
	a->hold = hold;
	a->m = m;
	kref_get(&m->ref);
	spin_lock(&m->wlock);
	list_add_tail(&a->w.node, &m->windows);
	spin_unlock(&m->wlock);
	mutex_unlock(&m->lock);
	req->release_data = a;
	req->release = cxla_svm_access_release;

	switch (s->op) {
	case CXL_ACCEL_SVM_READ:
	case CXL_ACCEL_SVM_WRITE: {
		struct cxla_copy *c = p;
		struct cxla_sge *b = s->op == CXL_ACCEL_SVM_WRITE ? sge : sge + nuser;
		u64 bytes = 0;

		for (i = 0; i < nuser; i++)
			bytes += le32_to_cpu(user[i].len);
		b->addr = cpu_to_le64(x->buf->offset + s->offset + pos);
		b->len = cpu_to_le32(bytes);
		b->space = cpu_to_le16(CXLA_SPACE_DEVMEM);
		b->reserved = 0;
		c->nr_src = cpu_to_le32(s->op == CXL_ACCEL_SVM_WRITE ? 1 : nuser);
		c->nr_dst = cpu_to_le32(s->op == CXL_ACCEL_SVM_WRITE ? nuser : 1);
		cxla_buf_get(x->buf);
		req->bufs[0] = x->buf;
		break;
	}
	case CXL_ACCEL_SVM_CHECKSUM: {
		struct cxla_checksum *c = p;

		c->nr_src = cpu_to_le32(nuser);
		c->seed = cpu_to_le32((u32)x->crc);
		break;
	}
	default: {
		struct cxla_fill *f = p;

		f->pattern = cpu_to_le64(cxla_ror_pattern(s->value, pos));
		f->nr_dst = cpu_to_le32(nuser);
		f->reserved = 0;
		break;
	}
	}
	req->out_len = sizeof(struct cxla_cmd_hdr) + head +
		       (nuser + (opcode == CXLA_OP_COPY)) * sizeof(*sge);

	ret = cxla_exec(cd, &req, min_t(u32, s->timeout_ms ?: cxla_cmd_timeout_ms,
					CXLA_SVM_MAX_TIMEOUT_MS), true);
	/* abandoned (NULL): the access ends when the device returns it */
	if (req) {
		if (!ret && opcode == CXLA_OP_CHECKSUM)
			x->crc = (u32)le64_to_cpu(cxla_req_resp(req)->result0);
		cxla_req_free(cd, req);
	}
	return ret;
}

long cxla_ioc_svm(struct cxla_file *cf, void __user *arg)
{
	struct cxla_svm_ctx x = { .cd = cf->dev };
	struct cxl_accel_svm s;
	u64 addr, end, wend;
	int ret = 0, i;

	if (copy_from_user(&s, arg, sizeof(s)))
		return -EFAULT;
	for (i = 0; i < ARRAY_SIZE(s.reserved); i++)
		if (s.reserved[i])
			return -EINVAL;
	if (s.flags || s.op > CXL_ACCEL_SVM_FILL || !s.len ||
	    s.len > CXLA_SVM_MAX_LEN || s.addr + s.len < s.addr ||
	    s.addr + s.len > TASK_SIZE)
		return -EINVAL;
	if (s.op == CXL_ACCEL_SVM_READ || s.op == CXL_ACCEL_SVM_WRITE) {
		x.buf = cxla_file_buf_get(cf, s.handle);
		if (!x.buf)
			return -ENOENT;
		if (s.offset > x.buf->size || s.len > x.buf->size - s.offset) {
			ret = -EINVAL;
			goto out;
		}
	} else if (s.handle || s.offset) {
		return -EINVAL;
	}
	x.m = cxla_mirror_get(cf);
	if (IS_ERR(x.m)) {
		ret = PTR_ERR(x.m);
		goto out;
	}
	x.pfns = kmalloc_array(CXLA_SVM_WINDOW, sizeof(*x.pfns), GFP_KERNEL);
	if (!x.pfns) {
		ret = -ENOMEM;
		goto out;
	}
	x.s = &s;
	x.crc = (u32)s.value;
	s.faults = 0;
	s.mirror_hits = 0;
	s.retries = 0;
	end = s.addr + s.len;
	for (addr = s.addr; addr < end && !ret; addr = wend) {
		wend = min_t(u64, end, ALIGN_DOWN(addr, CXLA_SVM_WINDOW * PAGE_SIZE) +
			     CXLA_SVM_WINDOW * PAGE_SIZE);
		ret = cxla_svm_window(&x, addr, wend - addr, addr - s.addr);
		if (!ret && fatal_signal_pending(current))
			ret = -EINTR;
		cond_resched();
	}
	if (!ret && s.op == CXL_ACCEL_SVM_CHECKSUM)
		s.value = (u32)x.crc;
out:
	kfree(x.pfns);
	if (x.buf)
		cxla_buf_put(x.buf);
	if (ret)
		return ret;
	return copy_to_user(arg, &s, sizeof(s)) ? -EFAULT : 0;
}

/*
 * hmm_range_fault() until the range is stable: -EBUSY tries again, and the
 * notifier's sequence is checked under lock, which stays held on success
 * (the pfns are good until it is dropped). -EBUSY after timeout_ms,
 * -EINTR on a fatal signal.
 */
int cxla_hmm_fault_locked(struct hmm_range *range, struct mm_struct *mm,
			  struct mutex *lock, unsigned int timeout_ms)
{
	unsigned long timeout = jiffies + msecs_to_jiffies(timeout_ms);
	int ret;

	for (;;) {
		if (time_after(jiffies, timeout))
			return -EBUSY;
		if (fatal_signal_pending(current))
			return -EINTR;
		range->notifier_seq = mmu_interval_read_begin(range->notifier);
		mmap_read_lock(mm);
		ret = cxla_hmm_range_fault(range);
		mmap_read_unlock(mm);
		if (ret == -EBUSY)
			continue;
		if (ret)
			return ret;
		mutex_lock(lock);
		if (!mmu_interval_read_retry(range->notifier, range->notifier_seq))
			return 0;
		mutex_unlock(lock);
	}
}

/* ------------------------------------------------------------ snapshot */

static u8 cxla_snap_flags(struct cxla_dev *cd, struct cxla_mirror *m,
			  unsigned long addr, unsigned long hpfn)
{
	unsigned long pfn = hpfn & ~HMM_PFN_FLAGS;
	struct folio *folio;
	struct page *page;
	u8 f;

	if (!(hpfn & HMM_PFN_VALID))
		return (hpfn & HMM_PFN_ERROR) ? CXL_ACCEL_SNAP_ERROR : 0;
	f = CXL_ACCEL_SNAP_PRESENT;
	if (hpfn & HMM_PFN_WRITE)
		f |= CXL_ACCEL_SNAP_WRITE;
	if (hmm_pfn_to_map_order(hpfn) >= PMD_SHIFT - PAGE_SHIFT)
		f |= CXL_ACCEL_SNAP_HUGE;
	if (xa_load(&m->pt, addr >> PAGE_SHIFT))
		f |= CXL_ACCEL_SNAP_MIRRORED;
	if (is_zero_pfn(pfn))
		return f | CXL_ACCEL_SNAP_ZERO;
	page = pfn_to_page(pfn);
	/* our private page: on the device, not in the CPU page table */
	if (cxla_page_is_priv(cd, page))
		return (f & ~CXL_ACCEL_SNAP_PRESENT) | CXL_ACCEL_SNAP_LOCAL;
	folio = page_folio(page);
	/* a PMD-mapped folio that is neither anonymous nor page cache */
	if ((f & CXL_ACCEL_SNAP_HUGE) && !folio_test_anon(folio) &&
	    !folio->mapping && !is_zone_device_page(page))
		return f | CXL_ACCEL_SNAP_ZERO;
	switch (cxla_page_owner_dev(cd, page)) {
	case CXLA_ON_LOCAL:
		f |= CXL_ACCEL_SNAP_LOCAL;
		break;
	case CXLA_ON_PEER:
		f |= CXL_ACCEL_SNAP_REMOTE;
		break;
	}
	return f;
}

long cxla_ioc_snapshot(struct cxla_file *cf, void __user *arg)
{
	struct cxla_dev *cd = cf->dev;
	struct cxl_accel_snapshot sn;
	struct cxla_mirror *m;
	struct mm_struct *mm;
	unsigned long *pfns = NULL, addr, end, i;
	u8 __user *out;
	u8 *flags = NULL;
	int ret = 0;

	if (copy_from_user(&sn, arg, sizeof(sn)))
		return -EFAULT;
	if (sn.flags || sn.reserved || !sn.len || !PAGE_ALIGNED(sn.addr) ||
	    !PAGE_ALIGNED(sn.len) || sn.len > CXLA_SVM_MAX_LEN ||
	    sn.addr + sn.len < sn.addr || sn.addr + sn.len > TASK_SIZE)
		return -EINVAL;
	out = u64_to_user_ptr(sn.flags_ptr);
	if (!access_ok(out, sn.len >> PAGE_SHIFT))
		return -EFAULT;
	m = cxla_mirror_get(cf);
	if (IS_ERR(m))
		return PTR_ERR(m);
	mm = m->notifier.mm;
	pfns = kmalloc_array(CXLA_SVM_SNAP_WINDOW, sizeof(*pfns), GFP_KERNEL);
	flags = kmalloc(CXLA_SVM_SNAP_WINDOW, GFP_KERNEL);
	if (!pfns || !flags) {
		ret = -ENOMEM;
		goto out;
	}
	end = sn.addr + sn.len;
	for (addr = sn.addr; addr < end; addr += i << PAGE_SHIFT) {
		unsigned long n = min_t(unsigned long, CXLA_SVM_SNAP_WINDOW,
					(end - addr) >> PAGE_SHIFT);
		struct hmm_range range = {
			.notifier = &m->notifier,
			.start = addr,
			.end = addr + (n << PAGE_SHIFT),
			.hmm_pfns = pfns,
			.default_flags = 0,	/* look, do not fault */
			.pfn_flags_mask = 0,
			.dev_private_owner = cxla_priv_owner(cd),
		};

		ret = cxla_hmm_fault_locked(&range, mm, &m->lock,
					    CXLA_SVM_FAULT_MS);
		if (ret)
			goto out;
		for (i = 0; i < n; i++)
			flags[i] = cxla_snap_flags(cd, m, addr + (i << PAGE_SHIFT),
						   pfns[i]);
		mutex_unlock(&m->lock);
		if (copy_to_user(out + ((addr - sn.addr) >> PAGE_SHIFT), flags, n)) {
			ret = -EFAULT;
			goto out;
		}
		cond_resched();
	}
out:
	kfree(flags);
	kfree(pfns);
	return ret;
}

/* ---------------------------------------------------- long-term pins */

long cxla_ioc_pin_checksum(struct cxla_file *cf, void __user *arg)
{
	struct cxla_dev *cd = cf->dev;
	struct cxl_accel_pin_checksum pc;
	u64 addr, end, crc;
	int ret = 0, i;

	if (copy_from_user(&pc, arg, sizeof(pc)))
		return -EFAULT;
	for (i = 0; i < ARRAY_SIZE(pc.reserved); i++)
		if (pc.reserved[i])
			return -EINVAL;
	if (pc.flags || !pc.len || pc.len > CXLA_PIN_MAX_LEN ||
	    pc.addr + pc.len < pc.addr || pc.addr + pc.len > TASK_SIZE)
		return -EINVAL;
	pc.pages = 0;
	pc.on_device = 0;
	crc = pc.seed;
	end = pc.addr + pc.len;
	for (addr = pc.addr; addr < end && !ret; ) {
		u64 wend = min_t(u64, end, ALIGN_DOWN(addr, CXLA_SVM_WINDOW * PAGE_SIZE) +
				 CXLA_SVM_WINDOW * PAGE_SIZE);
		unsigned long first = addr & PAGE_MASK;
		unsigned int npages = (PAGE_ALIGN(wend) - first) >> PAGE_SHIFT;
		unsigned int nsge = 0, k;
		struct cxla_checksum *c;
		struct cxla_sge *sge;
		struct cxla_req *req;
		u32 off = offset_in_page(addr), left = wend - addr;
		int got;

		req = cxla_req_alloc(cd, CXLA_OP_CHECKSUM, 0,
				     sizeof(*c) + npages * sizeof(*sge), 0);
		if (IS_ERR(req))
			return PTR_ERR(req);
		req->release = cxla_req_release_operands;
		req->pins[0].pages = kvmalloc_array(npages, sizeof(struct page *),
						    GFP_KERNEL);
		if (!req->pins[0].pages) {
			cxla_req_free(cd, req);
			return -ENOMEM;
		}
		/* FOLL_LONGTERM: device-coherent pages move to RAM first */
		got = cxla_pin_user(first, npages, FOLL_LONGTERM,
				    req->pins[0].pages);
		if (got < 0) {
			kvfree(req->pins[0].pages);
			req->pins[0].pages = NULL;
			cxla_req_free(cd, req);
			return got;
		}
		req->pins[0].npages = got;
		c = cxla_req_payload(req);
		sge = (struct cxla_sge *)(c + 1);
		for (k = 0; k < npages && !ret; k++) {
			struct page *page = req->pins[0].pages[k];
			u32 piece = min_t(u32, PAGE_SIZE - off, left);

			if (is_zone_device_page(page) ||
			    cxla_page_owner_dev(cd, page) != CXLA_ON_RAM)
				pc.on_device++;
			ret = cxla_page_sge(cd, page, off, piece, sge, &nsge);
			left -= piece;
			off = 0;
		}
		pc.pages += npages;
		c->nr_src = cpu_to_le32(nsge);
		c->seed = cpu_to_le32((u32)crc);
		req->out_len = sizeof(struct cxla_cmd_hdr) + sizeof(*c) +
			       nsge * sizeof(*sge);
		if (!ret)
			ret = cxla_exec(cd, &req, pc.timeout_ms, true);
		if (req) {
			if (!ret)
				crc = (u32)le64_to_cpu(cxla_req_resp(req)->result0);
			cxla_req_free(cd, req);	/* unpins */
		}
		addr = wend;
	}
	if (ret)
		return ret;
	pc.crc = (u32)crc;
	return copy_to_user(arg, &pc, sizeof(pc)) ? -EFAULT : 0;
}
