// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: migration of process memory between system RAM and device
 * memory.
 *
 * Device memory is MEMORY_DEVICE_COHERENT (devmem.c): a page of it can be
 * mapped into a process like any anonymous page, and the CPU reads and
 * writes it in place. migrate_vma_setup/pages/finalize move the private
 * anonymous pages of a virtual range there (MIGRATE_VMA_SELECT_SYSTEM) and
 * back (MIGRATE_VMA_SELECT_DEVICE_COHERENT with our pgmap owner, which all
 * cxl-accel devices share, so that a page on device A can be moved to
 * device B directly). The data is copied by the device's DMA engine:
 * COPY_PAGES commands with page lists (naturally aligned runs of up to
 * 2 MiB are sent as one large page), FILL for the zero pages of holes,
 * several commands in flight on the device's engines.
 *
 * Page pool. Destination pages come from pool chunks: 2 MiB device buffers
 * (cxla_buf_alloc, ALLOC) whose pages the pool takes over. A free pool
 * page has refcount 0; zone_device_page_init() hands it out locked with
 * refcount 1; the mm then holds it through its mappings, and when the last
 * reference goes, page_free() (devmem.c) returns it to its chunk here. A
 * chunk whose pages are all back is given back to the device (FREE), from
 * a work item, so that device memory is not kept by the pool.
 *
 * Device commands that time out or are interrupted stay quarantined (vq.c)
 * together with a reference on every destination page they write
 * (cxla_page_hold), so the device can never write into a page that went
 * back to the page allocator or the pool; the migration of those pages is
 * abandoned and the CPU page tables point at the original pages again.
 *
 * Eviction (EVICT, unbind, module unload) works on address spaces, never
 * on pages alone: migrate_device_range() on a pool page that no process
 * maps any more but that something still references (a pipe after
 * vmsplice(), a pin) walks the page's anon_vma, which is freed with the
 * last mapping; the kernel takes no reference on it there (a guest program
 * crashed the kernel that way). So the device remembers every address
 * space that migrated pages to it; eviction looks through each (holding a
 * reference and its mmap_lock, so vmas and anon_vmas stay), finds where
 * this device's pages are mapped and migrates those windows back with
 * migrate_vma_*(), like MIGRATE_TO_RAM. Pages that stay mapped after that
 * are mapped only by processes that did not migrate them (a forked child
 * whose parent unmapped them or exited): then every process is looked at.
 * Pages that no process maps cannot be moved and need not be: they come
 * back to the pool when their last reference goes. At removal the device
 * copies first; what failed, and what is found after the device was reset,
 * is copied by the CPU (the memory is still mapped), so no process data
 * stays on a device that goes away; pages still referenced then keep the
 * device memory mapped past the removal (devmem.c).
 */
#include <linux/delay.h>
#include <linux/highmem.h>
#include <linux/hmm.h>
#include <linux/mempolicy.h>
#include <linux/memremap.h>
#include <linux/migrate.h>
#include <linux/mm.h>
#include <linux/mmap_lock.h>
#include <linux/mmu_notifier.h>
#include <linux/pagemap.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/sort.h>
#include <linux/uaccess.h>

#include "cxl_accel.h"

#define CXLA_MIG_WINDOW		4096UL	/* pages per migrate_vma_setup() */
#define CXLA_EVICT_SCAN		512UL	/* pages per look at page tables */
#define CXLA_EVICT_RETRY_MS	3000	/* EVICT: retry busy pages this long */
#define CXLA_EVICT_ALL_MS	500	/* retries: every process at most this often */
#define CXLA_REMOVE_RETRY_MS	10000	/* removal: likewise, per phase */
#define CXLA_REMOVE_CMD_MS	2000	/* removal: per command */
#define CXLA_COPY_MAX_ORDER	(21 - PAGE_SHIFT)	/* 2 MiB pages at most */
#define CXLA_MAX_NOINTR		(30 * HZ)
#define CXLA_MIG_MAX_TIMEOUT_MS	30000	/* per command of a migration ioctl */

u8 cxla_pgmap_owner;

/* All devices with their memory ranges, to tell local, peer and RAM pages */
static DEFINE_SPINLOCK(cxla_reg_lock);
static LIST_HEAD(cxla_reg);

void cxla_mig_register(struct cxla_dev *cd, phys_addr_t start, u64 size,
		       bool coherent, int node)
{
	struct cxla_mig *mig = cd->mig;

	spin_lock(&cxla_reg_lock);
	mig->mem_start = start;
	mig->mem_end = start + size;
	mig->coherent = coherent;
	mig->node = node;
	list_add_tail(&mig->reg, &cxla_reg);
	spin_unlock(&cxla_reg_lock);
}

static void cxla_mig_unregister(struct cxla_mig *mig)
{
	spin_lock(&cxla_reg_lock);
	if (mig->mem_end) {
		list_del(&mig->reg);
		mig->mem_end = 0;
	}
	spin_unlock(&cxla_reg_lock);
}

/* CXLA_ON_RAM, CXLA_ON_LOCAL (this device's memory) or CXLA_ON_PEER */
int cxla_page_owner_dev(struct cxla_dev *cd, struct page *page)
{
	phys_addr_t pa = page_to_phys(page);
	struct cxla_mig *m;
	int where = CXLA_ON_RAM;

	spin_lock(&cxla_reg_lock);
	list_for_each_entry(m, &cxla_reg, reg) {
		if (pa >= m->mem_start && pa < m->mem_end) {
			where = m == cd->mig ? CXLA_ON_LOCAL : CXLA_ON_PEER;
			break;
		}
	}
	spin_unlock(&cxla_reg_lock);
	return where;
}

/* ------------------------------------------------------- page holds */

struct cxla_page_hold *cxla_page_hold_alloc(unsigned int max)
{
	struct cxla_page_hold *h;

	h = kvmalloc(struct_size(h, pages, max), GFP_KERNEL);
	if (h) {
		h->n = 0;
		h->max = max;
	}
	return h;
}

void cxla_page_hold_free(struct cxla_page_hold *h)
{
	unsigned int i;

	if (!h)
		return;
	for (i = 0; i < h->n; i++)
		put_page(h->pages[i]);
	kvfree(h);
}

static void cxla_page_hold_release(struct cxla_req *req)
{
	cxla_page_hold_free(req->release_data);
	req->release_data = NULL;
	req->release = NULL;
}

/* The request keeps the pages referenced until it is freed (or reaped). */
void cxla_req_set_hold(struct cxla_req *req, struct cxla_page_hold *h)
{
	req->release_data = h;
	req->release = cxla_page_hold_release;
}

/* ------------------------------------------------------------- pool */

/* devmem.c's page_free() for pool pages: the page is free again. */
void cxla_pool_page_free(struct cxla_buf *buf, struct page *page)
{
	struct cxla_chunk *c = buf->chunk;
	struct cxla_mig *mig = c->mig;
	unsigned long idx = page_to_pfn(page) - c->first_pfn;
	unsigned long flags;
	bool empty;

	spin_lock_irqsave(&mig->lock, flags);
	if (WARN_ON_ONCE(idx >= CXLA_CHUNK_PAGES || test_bit(idx, c->free))) {
		spin_unlock_irqrestore(&mig->lock, flags);
		return;
	}
	__set_bit(idx, c->free);
	c->nfree++;
	mig->pages_used--;
	mig->pages_free++;
	empty = c->live && c->nfree == CXLA_CHUNK_PAGES && !mig->closed;
	spin_unlock_irqrestore(&mig->lock, flags);
	if (empty)
		queue_work(cxla_wq, &mig->shrink_work);
}

/* Take up to n free pages; they come back locked with refcount 1. */
static unsigned long cxla_pool_take(struct cxla_mig *mig, unsigned long n,
				    struct page **pages)
{
	unsigned long got = 0, flags, i;
	struct cxla_chunk *c;

	spin_lock_irqsave(&mig->lock, flags);
	list_for_each_entry(c, &mig->chunks, node) {
		while (got < n && c->nfree) {
			unsigned int bit;

			bit = find_next_bit(c->free, CXLA_CHUNK_PAGES, c->cursor);
			if (bit >= CXLA_CHUNK_PAGES)
				bit = find_first_bit(c->free, CXLA_CHUNK_PAGES);
			__clear_bit(bit, c->free);
			c->nfree--;
			c->cursor = bit + 1;
			pages[got] = pfn_to_page(c->first_pfn + bit);
			/* the page is free: nobody else looks at it */
			pages[got]->zone_device_data = c->buf;
			got++;
		}
		if (got == n)
			break;
	}
	mig->pages_free -= got;
	mig->pages_used += got;
	spin_unlock_irqrestore(&mig->lock, flags);

	atomic_long_add(got, &mig->cd->pages_live);
	for (i = 0; i < got; i++)
		cxla_zone_device_page_init(pages[i], &mig->cd->pgmap);
	return got;
}

/* Add a chunk: ALLOC a device buffer and take its pages over. */
static int cxla_pool_grow(struct cxla_mig *mig)
{
	struct cxla_dev *cd = mig->cd;
	struct cxla_chunk *c;
	struct cxla_buf *buf;
	unsigned long i;
	bool held;
	int ret = 0;

	mutex_lock(&mig->grow_lock);
	if (READ_ONCE(mig->pages_free))
		goto out;		/* someone else grew it */
	if (READ_ONCE(mig->closed) || READ_ONCE(cd->dead)) {
		ret = -ENODEV;
		goto out;
	}
	c = kzalloc(sizeof(*c), GFP_KERNEL);
	if (!c) {
		ret = -ENOMEM;
		goto out;
	}
	/* 2 MiB aligned lets the device copy whole chunks as 2 MiB pages */
	ret = cxla_buf_alloc(cd, CXLA_CHUNK_SIZE, CXLA_CHUNK_SIZE, &buf);
	if (ret == -ENOSPC)	/* fragmented: any 2 MiB will do */
		ret = cxla_buf_alloc(cd, CXLA_CHUNK_SIZE, PAGE_SIZE, &buf);
	if (ret) {
		kfree(c);
		goto out;
	}
	c->mig = mig;
	c->buf = buf;
	c->first_pfn = PHYS_PFN(cd->devmem_gpa + buf->offset);
	INIT_LIST_HEAD(&c->node);

	spin_lock_irq(&mig->lock);
	mig->pages_used += CXLA_CHUNK_PAGES;	/* until page_free() below */
	spin_unlock_irq(&mig->lock);
	WRITE_ONCE(buf->chunk, c);
	mutex_lock(&cd->buf_lock);
	held = buf->pages_held;
	buf->pages_held = false;
	mutex_unlock(&cd->buf_lock);
	/* removal waits for us (mig->sem), so the buffer's references are ours */
	WARN_ON_ONCE(!held);
	for (i = 0; i < CXLA_CHUNK_PAGES; i++)
		put_page(pfn_to_page(c->first_pfn + i));	/* -> pool */

	spin_lock_irq(&mig->lock);
	c->live = true;
	list_add_tail(&c->node, &mig->chunks);
	mig->nchunks++;
	spin_unlock_irq(&mig->lock);
out:
	mutex_unlock(&mig->grow_lock);
	return ret;
}

/*
 * Hand out up to n pool pages, growing the pool as needed. Returns how many
 * (fewer when device memory is full: *err = -ENOSPC, or on another error).
 */
static unsigned long cxla_pool_get(struct cxla_mig *mig, unsigned long n,
				   struct page **pages, int *err)
{
	unsigned long got = 0;
	int ret;

	*err = 0;
	while (got < n) {
		if (READ_ONCE(mig->closed)) {
			*err = -ENODEV;
			break;
		}
		got += cxla_pool_take(mig, n - got, pages + got);
		if (got == n)
			break;
		ret = cxla_pool_grow(mig);
		if (ret) {
			*err = ret;
			break;
		}
	}
	return got;
}

static void cxla_chunk_destroy(struct cxla_chunk *c)
{
	struct cxla_buf *buf = c->buf;

	/* pool pages never counted down pages_out: drop them all at once */
	atomic_long_sub(CXLA_CHUNK_PAGES, &buf->pages_out);
	cxla_buf_put(buf);	/* the last reference: FREE on the device */
	kfree(c);
}

/* Give chunks whose pages are all free back to the device. */
static unsigned long cxla_pool_shrink(struct cxla_mig *mig)
{
	struct cxla_chunk *c, *t;
	unsigned long n = 0;
	LIST_HEAD(gone);

	spin_lock_irq(&mig->lock);
	list_for_each_entry_safe(c, t, &mig->chunks, node) {
		if (c->nfree != CXLA_CHUNK_PAGES)
			continue;
		c->live = false;
		list_move_tail(&c->node, &gone);
		mig->nchunks--;
		mig->pages_free -= CXLA_CHUNK_PAGES;
		n++;
	}
	spin_unlock_irq(&mig->lock);
	list_for_each_entry_safe(c, t, &gone, node) {
		list_del(&c->node);
		cxla_chunk_destroy(c);
	}
	return n;
}

static void cxla_shrink_work(struct work_struct *work)
{
	struct cxla_mig *mig = container_of(work, struct cxla_mig, shrink_work);

	down_write(&mig->sem);
	if (!READ_ONCE(mig->closed))
		cxla_pool_shrink(mig);
	up_write(&mig->sem);
}

/* ------------------------------------------------- page copy engine */

/* One 4 KiB page to copy, or to zero-fill (no source) */
struct cxla_xpage {
	u64 src;
	u64 dst;
	u16 sspace;
	u16 dspace;
	bool zero;
	bool failed;		/* out: its command failed */
	unsigned long idx;	/* in the migrate arrays */
	struct page *spage;
	struct page *dpage;	/* referenced by the command while it lives */
};

/* A run of xpages sent as one (large) page or one FILL segment */
struct cxla_xblock {
	u32 first;
	u32 count;
	u32 key;		/* one command per key: zero, spaces, order */
};

#define CXLA_XKEY(zero, ss, ds, order) \
	((u32)(zero) << 24 | (u32)(ss) << 16 | (u32)(ds) << 8 | (u32)(order))

struct cxla_xcmd {
	struct cxla_req *req;
	u32 b0;
	u32 nb;
	u64 expect;		/* result0 of a complete command */
	int ret;
};

static bool cxla_xnext(const struct cxla_xpage *a, const struct cxla_xpage *b,
		       unsigned int k)
{
	u64 off = (u64)k << PAGE_SHIFT;

	return b->zero == a->zero && b->sspace == a->sspace &&
	       b->dspace == a->dspace && b->dst == a->dst + off &&
	       (a->zero || b->src == a->src + off);
}

static unsigned int cxla_xblocks(const struct cxla_xpage *xp, unsigned int n,
				 struct cxla_xblock *b)
{
	unsigned int i = 0, nb = 0, run, p, end, order;

	while (i < n) {
		for (run = 1; i + run < n && cxla_xnext(&xp[i], &xp[i + run], run);
		     run++)
			;
		end = i + run;
		if (xp[i].zero) {
			/* FILL takes segments of any length */
			b[nb++] = (struct cxla_xblock){ i, run,
				CXLA_XKEY(1, 0, xp[i].dspace, 0) };
			i = end;
			continue;
		}
		for (p = i; p < end; p += 1U << order) {
			order = min_t(unsigned int, ilog2(end - p),
				      CXLA_COPY_MAX_ORDER);
			while (order &&
			       !IS_ALIGNED(xp[p].src | xp[p].dst, PAGE_SIZE << order))
				order--;
			b[nb++] = (struct cxla_xblock){ p, 1U << order,
				CXLA_XKEY(0, xp[p].sspace, xp[p].dspace, order) };
		}
		i = end;
	}
	return nb;
}

static int cxla_xblock_cmp(const void *a, const void *b)
{
	const struct cxla_xblock *x = a, *y = b;
	u64 kx = (u64)x->key << 32 | x->first, ky = (u64)y->key << 32 | y->first;

	return kx < ky ? -1 : kx > ky;
}

/* Blocks one command of this key may carry */
static unsigned int cxla_xcmd_limit(struct cxla_dev *cd, u32 key)
{
	size_t room = cd->max_request - sizeof(struct cxla_cmd_hdr);
	unsigned int order = key & 0xff;

	if (key >> 24)
		return min_t(size_t, cd->max_segments,
			     (room - sizeof(struct cxla_fill)) /
			     sizeof(struct cxla_sge));
	return min3((size_t)CXLA_MAX_PAGES,
		    (room - sizeof(struct cxla_copy_pages)) / (2 * sizeof(__le64)),
		    (size_t)(CXLA_MAX_TRANSFER >> (PAGE_SHIFT + order)));
}

static struct cxla_req *cxla_xcmd_build(struct cxla_dev *cd,
					const struct cxla_xpage *xp,
					const struct cxla_xblock *b, u32 nb,
					u64 *expect)
{
	u32 key = b[0].key, i, k, npages = 0;
	u16 sspace = (key >> 16) & 0xff, dspace = (key >> 8) & 0xff;
	struct cxla_page_hold *hold;
	struct cxla_req *req;

	for (i = 0; i < nb; i++)
		npages += b[i].count;
	hold = cxla_page_hold_alloc(npages);
	if (!hold)
		return ERR_PTR(-ENOMEM);

	if (key >> 24) {
		struct cxla_fill *f;
		struct cxla_sge *sge;

		req = cxla_req_alloc(cd, CXLA_OP_FILL, 0,
				     sizeof(*f) + nb * sizeof(*sge), 0);
		if (IS_ERR(req))
			goto err;
		f = cxla_req_payload(req);
		f->pattern = 0;
		f->nr_dst = cpu_to_le32(nb);
		sge = (struct cxla_sge *)(f + 1);
		for (i = 0; i < nb; i++) {
			sge[i].addr = cpu_to_le64(xp[b[i].first].dst);
			sge[i].len = cpu_to_le32(b[i].count << PAGE_SHIFT);
			sge[i].space = cpu_to_le16(dspace);
			sge[i].reserved = 0;
		}
		*expect = (u64)npages << PAGE_SHIFT;
	} else {
		struct cxla_copy_pages *c;
		__le64 *a;

		req = cxla_req_alloc(cd, CXLA_OP_COPY_PAGES, 0,
				     sizeof(*c) + 2 * nb * sizeof(*a), 0);
		if (IS_ERR(req))
			goto err;
		c = cxla_req_payload(req);
		c->nr_pages = cpu_to_le32(nb);
		c->page_size = cpu_to_le32(PAGE_SIZE << (key & 0xff));
		c->src_space = cpu_to_le16(sspace);
		c->dst_space = cpu_to_le16(dspace);
		c->reserved = 0;
		a = (__le64 *)(c + 1);
		for (i = 0; i < nb; i++) {
			a[i] = cpu_to_le64(xp[b[i].first].src);
			a[nb + i] = cpu_to_le64(xp[b[i].first].dst);
		}
		*expect = nb;
	}
	for (i = 0; i < nb; i++) {
		for (k = 0; k < b[i].count; k++) {
			struct page *p = xp[b[i].first + k].dpage;

			get_page(p);
			hold->pages[hold->n++] = p;
		}
	}
	cxla_req_set_hold(req, hold);
	return req;
err:
	kvfree(hold);
	return req;
}

static void cxla_xcmd_fail(struct cxla_xpage *xp, const struct cxla_xblock *b,
			   const struct cxla_xcmd *c)
{
	u32 i, k;

	for (i = c->b0; i < c->b0 + c->nb; i++)
		for (k = 0; k < b[i].count; k++)
			xp[b[i].first + k].failed = true;
}

/*
 * Copy (or zero) n pages with the device: COPY_PAGES and FILL commands, up
 * to engines + 1 in flight. Pages of failed commands get ->failed set.
 * Returns 0 or the first error.
 */
static int cxla_xcopy(struct cxla_mig *mig, struct cxla_xpage *xp,
		      unsigned int n, unsigned int timeout_ms, bool intr)
{
	struct cxla_dev *cd = mig->cd;
	unsigned int nb, ncmd = 0, next = 0, done = 0, depth, i, g0, g1, per;
	unsigned long timeout = cxla_timeout_jiffies(timeout_ms);
	struct cxla_xblock *b;
	struct cxla_xcmd *cmds;
	int ret = 0, stop = 0;

	if (!n)
		return 0;
	if (!intr)
		timeout = min_t(unsigned long, timeout, CXLA_MAX_NOINTR);
	b = kvmalloc_array(n, sizeof(*b), GFP_KERNEL);
	cmds = kvmalloc_array(n, sizeof(*cmds), GFP_KERNEL);
	if (!b || !cmds) {
		ret = -ENOMEM;
		for (i = 0; i < n; i++)
			xp[i].failed = true;
		goto out;
	}
	nb = cxla_xblocks(xp, n, b);
	sort(b, nb, sizeof(*b), cxla_xblock_cmp, NULL);

	/* one key per command; big groups spread over the engines */
	for (g0 = 0; g0 < nb; g0 = g1) {
		for (g1 = g0 + 1; g1 < nb && b[g1].key == b[g0].key; g1++)
			;
		per = max(16U, DIV_ROUND_UP(g1 - g0, cd->num_dma_engines));
		per = min(per, cxla_xcmd_limit(cd, b[g0].key));
		for (i = g0; i < g1; i += per)
			cmds[ncmd++] = (struct cxla_xcmd){ .b0 = i,
				.nb = min(per, g1 - i) };
	}

	depth = clamp_t(unsigned int, cd->num_dma_engines + 1, 1, 8);
	while (done < ncmd) {
		while (next < ncmd && next - done < depth) {
			struct cxla_xcmd *c = &cmds[next++];
			struct cxla_req *req;
			int r;

			if (stop) {
				c->ret = stop;
				continue;
			}
			req = cxla_xcmd_build(cd, xp, b + c->b0, c->nb, &c->expect);
			if (IS_ERR(req)) {
				c->ret = PTR_ERR(req);
				continue;
			}
			atomic64_inc(&mig->stat[CXLA_MS_COPY_CMDS]);
			r = cxla_req_submit(cd, req, jiffies + timeout, intr);
			if (r) {
				cxla_req_free(cd, req);
				c->ret = r;
				stop = r;
				continue;
			}
			c->req = req;
		}

		{
			struct cxla_xcmd *c = &cmds[done++];

			if (c->req) {
				/* after a timeout, do not wait the full time again */
				int r = cxla_req_wait(cd, &c->req,
						      stop == -ETIMEDOUT ? 1 : timeout,
						      intr);

				if (c->req) {
					struct cxla_resp *resp = cxla_req_resp(c->req);

					if (!r && le64_to_cpu(resp->result0) != c->expect) {
						cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_PROTOCOL);
						dev_err_ratelimited(&cd->dev,
								    "opcode %#x: result %llu, expected %llu\n",
								    c->req->opcode,
								    le64_to_cpu(resp->result0),
								    c->expect);
						r = -EIO;
					}
					cxla_req_free(cd, c->req);
					c->req = NULL;
				}
				c->ret = r;
				if (r == -EINTR || r == -ETIMEDOUT || r == -ENODEV)
					stop = stop ?: r;
			}
			if (c->ret) {
				cxla_xcmd_fail(xp, b, c);
				atomic64_inc(&mig->stat[CXLA_MS_COPY_FAIL]);
				ret = ret ?: c->ret;
			}
		}
	}
out:
	kvfree(cmds);
	kvfree(b);
	return ret;
}

/* ------------------------------------------------ migrate_vma ranges */

/* What a window does with the pages it finds */
enum cxla_mig_mode {
	CXLA_MIG_TO_DEV,	/* RAM and other devices' pages to this device */
	CXLA_MIG_TO_RAM,	/* cxl-accel device pages to RAM */
	CXLA_MIG_EVICT,		/* this device's pages to RAM */
};

struct cxla_mig_ctx {
	struct cxla_mig *mig;
	enum cxla_mig_mode mode;
	unsigned long *src;
	unsigned long *dst;
	struct cxla_xpage *xp;
	struct page **pages;
	unsigned int timeout_ms;
	bool intr;		/* device waits end on signals (ioctls) */
	bool dma;		/* EVICT: the device copies, else the CPU */
	bool cpu_fallback;	/* EVICT: the CPU copies what the device failed */
	struct cxl_accel_migrate *res;	/* counters */
	u64 cpu_copied;		/* EVICT: pages the CPU copied */
};

static void cxla_mig_ctx_free(struct cxla_mig_ctx *x)
{
	kvfree(x->src);
	kvfree(x->dst);
	kvfree(x->xp);
	kvfree(x->pages);
	x->src = NULL;
	x->dst = NULL;
	x->xp = NULL;
	x->pages = NULL;
}

static int cxla_mig_ctx_alloc(struct cxla_mig_ctx *x, unsigned long npages)
{
	x->src = kvmalloc_array(npages, sizeof(*x->src), GFP_KERNEL);
	x->dst = kvmalloc_array(npages, sizeof(*x->dst), GFP_KERNEL);
	x->xp = kvmalloc_array(npages, sizeof(*x->xp), GFP_KERNEL);
	x->pages = kvmalloc_array(npages, sizeof(*x->pages), GFP_KERNEL);
	if (!x->src || !x->dst || !x->xp || !x->pages) {
		cxla_mig_ctx_free(x);
		return -ENOMEM;
	}
	return 0;
}

/*
 * System RAM destination pages. A window with at least 2 MiB to move takes
 * them from order-9 blocks split into single pages when the allocator has
 * such blocks at hand (no reclaim for them): one allocation instead of 512,
 * and physically contiguous destinations the device copies as 2 MiB pages.
 * Otherwise (or when the vma has a memory policy of its own) page by page
 * with alloc_page_vma().
 */
#define CXLA_RAM_BLOCK_ORDER	(21 - PAGE_SHIFT)

struct cxla_ram_block {
	struct page *base;
	unsigned int next;
};

static struct page *cxla_ram_page(struct cxla_ram_block *b, unsigned long left,
				  struct vm_area_struct *vma, unsigned long addr)
{
	const unsigned int n = 1U << CXLA_RAM_BLOCK_ORDER;

	/* alloc_pages() follows the task's policy, not the vma's */
	if (!b->base && left >= n && !vma_policy(vma)) {
		b->base = alloc_pages((GFP_HIGHUSER_MOVABLE & ~__GFP_DIRECT_RECLAIM) |
				      __GFP_NORETRY | __GFP_NOWARN,
				      CXLA_RAM_BLOCK_ORDER);
		if (b->base) {
			split_page(b->base, CXLA_RAM_BLOCK_ORDER);
			b->next = 0;
		}
	}
	if (b->base) {
		struct page *p = b->base + b->next++;

		if (b->next == n)
			b->base = NULL;
		return p;
	}
	return alloc_page_vma(GFP_HIGHUSER_MOVABLE, vma, addr);
}

static void cxla_ram_block_put(struct cxla_ram_block *b)
{
	const unsigned int n = 1U << CXLA_RAM_BLOCK_ORDER;

	while (b->base && b->next < n)
		__free_page(b->base + b->next++);
	b->base = NULL;
}

/*
 * Where the pages found in a window go. Fills x->xp[] (source, space) and
 * returns how many move; counts the others in x->res.
 */
static unsigned long cxla_mig_select(struct cxla_mig_ctx *x,
				     struct vm_area_struct *vma,
				     const struct migrate_vma *args)
{
	struct cxla_dev *cd = x->mig->cd;
	struct cxl_accel_migrate *res = x->res;
	bool to_dev = x->mode == CXLA_MIG_TO_DEV;
	unsigned long i, nx = 0;

	for (i = 0; i < args->npages; i++) {
		unsigned long s = args->src[i];
		struct page *sp = migrate_pfn_to_page(s);
		struct cxla_xpage *e = &x->xp[nx];
		int where;

		args->dst[i] = 0;
		if (x->mode == CXLA_MIG_EVICT) {
			/* only this device's pages; the rest stays as it is */
			if (!sp || !cxla_page_is_ours(cd, sp))
				continue;
			if (!(s & MIGRATE_PFN_MIGRATE)) {
				res->busy++;
				continue;
			}
		} else if (!(s & MIGRATE_PFN_MIGRATE)) {
			if (!to_dev)
				res->already++;
			else if (vma_is_anonymous(vma))
				res->busy++;	/* pinned, locked, swapped */
			else
				res->refused++;	/* hole of a file mapping */
			continue;
		}
		memset(e, 0, sizeof(*e));
		e->idx = i;
		e->spage = sp;
		if (!sp) {
			if (!to_dev) {
				res->already++;	/* a hole stays a hole */
				continue;
			}
			e->zero = true;
			e->dspace = CXLA_SPACE_DEVMEM;
			nx++;
			continue;
		}
		/* evicting: ours, also once removal took it off the list */
		where = x->mode == CXLA_MIG_EVICT ? CXLA_ON_LOCAL :
			cxla_page_owner_dev(cd, sp);
		if (to_dev) {
			if (where == CXLA_ON_LOCAL) {
				res->already++;
				continue;
			}
			if (!PageAnon(sp) || folio_test_ksm(page_folio(sp))) {
				res->refused++;	/* page cache, shmem, KSM */
				continue;
			}
			if (where == CXLA_ON_PEER && !(cd->features & CXLA_F_P2P)) {
				res->busy++;
				continue;
			}
			e->src = page_to_phys(sp);
			e->sspace = CXLA_SPACE_GPA;	/* RAM or a peer's BAR */
			e->dspace = CXLA_SPACE_DEVMEM;
		} else {
			if (where == CXLA_ON_RAM) {	/* another kind of device page */
				res->busy++;
				continue;
			}
			if (where == CXLA_ON_PEER && !(cd->features & CXLA_F_P2P)) {
				res->busy++;
				continue;
			}
			e->src = page_to_phys(sp);
			e->sspace = CXLA_SPACE_GPA;
			if (where == CXLA_ON_LOCAL || x->mode == CXLA_MIG_EVICT) {
				e->src -= cd->devmem_gpa;
				e->sspace = CXLA_SPACE_DEVMEM;
			}
			e->dspace = CXLA_SPACE_GPA;
		}
		nx++;
	}
	return nx;
}

/* Destination pages for the nx pages selected, locked, refcount 1. */
static unsigned long cxla_mig_dst(struct cxla_mig_ctx *x,
				  struct vm_area_struct *vma,
				  unsigned long start, unsigned long nx, int *err)
{
	struct cxla_mig *mig = x->mig;
	struct cxl_accel_migrate *res = x->res;
	struct cxla_ram_block blk = { };
	unsigned long i, got;

	if (x->mode == CXLA_MIG_TO_DEV) {
		got = cxla_pool_get(mig, nx, x->pages, err);
		if (got < nx) {
			if (*err == -ENOSPC)
				res->no_space += nx - got;
			else
				res->busy += nx - got;
		}
		for (i = 0; i < got; i++) {
			struct cxla_xpage *e = &x->xp[i];

			e->dpage = x->pages[i];
			e->dst = page_to_phys(e->dpage) - mig->cd->devmem_gpa;
		}
		return got;
	}
	for (i = 0, got = 0; i < nx; i++) {
		struct cxla_xpage *e = &x->xp[i];
		struct page *dp;

		dp = cxla_ram_page(&blk, nx - i, vma,
				   start + (e->idx << PAGE_SHIFT));
		if (!dp) {
			res->busy++;
			*err = -ENOMEM;
			continue;
		}
		lock_page(dp);
		e->dpage = dp;
		e->dst = page_to_phys(dp);
		x->xp[got++] = *e;
	}
	cxla_ram_block_put(&blk);
	return got;
}

/*
 * Copy the pages: by the device (failed ones get ->failed and lose their
 * destination, which a quarantined command may still write); evicting,
 * also by the CPU (into new pages), since the memory is still mapped.
 */
static int cxla_mig_copy(struct cxla_mig_ctx *x, const struct migrate_vma *args,
			 unsigned long nx)
{
	struct cxla_mig *mig = x->mig;
	bool evict = x->mode == CXLA_MIG_EVICT;
	unsigned long i;
	int ret = 0;

	if (!evict || x->dma)
		ret = cxla_xcopy(mig, x->xp, nx, x->timeout_ms, x->intr);
	else
		for (i = 0; i < nx; i++)
			x->xp[i].failed = true;
	for (i = 0; i < nx; i++) {
		struct cxla_xpage *e = &x->xp[i];
		struct page *dp;

		if (!e->failed)
			continue;
		if (!evict || x->dma) {
			/* the failed command keeps its own reference */
			args->dst[e->idx] = 0;
			unlock_page(e->dpage);
			put_page(e->dpage);
			e->dpage = NULL;
			if (!evict || !x->cpu_fallback) {
				x->res->busy++;
				continue;
			}
			dp = alloc_page(GFP_HIGHUSER_MOVABLE | __GFP_NOWARN);
			if (!dp) {
				x->res->busy++;
				continue;
			}
			lock_page(dp);
			e->dpage = dp;
			args->dst[e->idx] = migrate_pfn(page_to_pfn(dp));
		}
		copy_highpage(e->dpage, e->spage);
		e->failed = false;
		x->cpu_copied++;
	}
	return ret;
}

/*
 * Migrate one window [start, end) of one vma; mmap_lock is held for
 * reading. Updates the counters of x->res.
 */
static int cxla_mig_window(struct cxla_mig_ctx *x, struct vm_area_struct *vma,
			   unsigned long start, unsigned long end)
{
	struct cxla_mig *mig = x->mig;
	struct cxl_accel_migrate *res = x->res;
	struct migrate_vma args = {
		.vma = vma,
		.start = start,
		.end = end,
		.src = x->src,
		.dst = x->dst,
		.pgmap_owner = &cxla_pgmap_owner,
		.flags = x->mode == CXLA_MIG_TO_DEV ?
			 MIGRATE_VMA_SELECT_SYSTEM |
			 MIGRATE_VMA_SELECT_DEVICE_COHERENT :
			 MIGRATE_VMA_SELECT_DEVICE_COHERENT,
	};
	unsigned long i, nx, moved = 0, before = x->cpu_copied;
	int ret, err = 0;

	ret = migrate_vma_setup(&args);
	if (ret)
		return ret;

	nx = cxla_mig_select(x, vma, &args);
	nx = cxla_mig_dst(x, vma, start, nx, &err);
	for (i = 0; i < nx; i++)
		args.dst[x->xp[i].idx] = migrate_pfn(page_to_pfn(x->xp[i].dpage));
	ret = cxla_mig_copy(x, &args, nx);

	migrate_vma_pages(&args);
	for (i = 0; i < nx; i++) {
		struct cxla_xpage *e = &x->xp[i];

		if (!args.dst[e->idx])
			continue;	/* counted as busy */
		if (args.src[e->idx] & MIGRATE_PFN_MIGRATE)
			moved++;
		else
			res->busy++;	/* the kernel kept the old page */
	}
	migrate_vma_finalize(&args);

	res->migrated += moved;
	switch (x->mode) {
	case CXLA_MIG_TO_DEV:
		atomic64_add(moved, &mig->stat[CXLA_MS_TO_DEV]);
		break;
	case CXLA_MIG_TO_RAM:
		atomic64_add(moved, &mig->stat[CXLA_MS_TO_RAM]);
		break;
	case CXLA_MIG_EVICT:
		atomic64_add(moved, &mig->stat[CXLA_MS_EVICTED]);
		atomic64_add(x->cpu_copied - before,
			     &mig->stat[CXLA_MS_CPU_EVICTED]);
		break;
	}
	if (ret)
		return ret;
	return err == -ENOSPC || err == -ENOMEM ? 0 : err;
}

static bool cxla_vma_migratable(struct vm_area_struct *vma, bool to_dev)
{
	if (vma->vm_flags & (VM_SHARED | VM_MAYSHARE | VM_SPECIAL))
		return false;
	if (is_vm_hugetlb_page(vma) || vma_is_dax(vma))
		return false;
	/* no access: the owner cannot use device memory there anyway */
	if (to_dev && !(vma->vm_flags & (VM_READ | VM_WRITE)))
		return false;
	return true;
}

static void cxla_mig_track_mm(struct cxla_mig *mig, struct mm_struct *mm);

static long cxla_ioc_migrate(struct cxla_file *cf, void __user *arg,
			     bool to_dev)
{
	struct cxla_dev *cd = cf->dev;
	struct cxla_mig *mig = cd->mig;
	struct mm_struct *mm = current->mm;
	struct cxla_mig_ctx x = {
		.mig = mig,
		.mode = to_dev ? CXLA_MIG_TO_DEV : CXLA_MIG_TO_RAM,
		.intr = true,
	};
	struct cxl_accel_migrate m;
	struct vm_area_struct *vma;
	unsigned long start, end, addr, next, win;
	int ret = 0, i;

	if (copy_from_user(&m, arg, sizeof(m)))
		return -EFAULT;
	for (i = 0; i < ARRAY_SIZE(m.reserved); i++)
		if (m.reserved[i])
			return -EINVAL;
	if (m.flags || !m.len || !PAGE_ALIGNED(m.addr) || !PAGE_ALIGNED(m.len) ||
	    m.addr + m.len < m.addr || m.addr + m.len > TASK_SIZE)
		return -EINVAL;
	if (!mig->coherent)
		return -EOPNOTSUPP;	/* NUMA mode: move_pages()/mbind() */
	if (!mm)
		return -EINVAL;
	start = m.addr;
	end = m.addr + m.len;
	m.migrated = 0;
	m.already = 0;
	m.refused = 0;
	m.busy = 0;
	m.no_space = 0;
	x.res = &m;
	/* mmap_lock is held while the device copies: bounded well below hung-task */
	x.timeout_ms = min_t(u32, m.timeout_ms ?: READ_ONCE(cxla_cmd_timeout_ms),
			     CXLA_MIG_MAX_TIMEOUT_MS);
	win = CXLA_MIG_WINDOW << PAGE_SHIFT;
	ret = cxla_mig_ctx_alloc(&x, min(m.len >> PAGE_SHIFT, CXLA_MIG_WINDOW));
	if (ret)
		return ret;

	down_read(&mig->sem);
	if (READ_ONCE(cd->dead) || READ_ONCE(mig->closed)) {
		ret = -ENODEV;
		goto out;
	}
	/* eviction must find this address space again */
	if (to_dev)
		cxla_mig_track_mm(mig, mm);
	/* the whole range must be mapped */
	mmap_read_lock(mm);
	for (addr = start; addr < end; addr = vma->vm_end) {
		vma = find_vma(mm, addr);
		if (!vma || vma->vm_start > addr) {
			ret = -EFAULT;
			break;
		}
	}
	mmap_read_unlock(mm);
	if (ret)
		goto out;

	for (addr = start; addr < end; addr = next) {
		if (fatal_signal_pending(current)) {
			ret = -EINTR;
			break;
		}
		mmap_read_lock(mm);
		vma = find_vma(mm, addr);
		if (!vma || vma->vm_start >= end) {
			/* unmapped meanwhile */
			mmap_read_unlock(mm);
			m.refused += (end - addr) >> PAGE_SHIFT;
			break;
		}
		if (vma->vm_start > addr) {
			m.refused += (vma->vm_start - addr) >> PAGE_SHIFT;
			addr = vma->vm_start;
		}
		next = min3(end, vma->vm_end, ALIGN_DOWN(addr, win) + win);
		if (!cxla_vma_migratable(vma, to_dev))
			m.refused += (next - addr) >> PAGE_SHIFT;
		else
			ret = cxla_mig_window(&x, vma, addr, next);
		mmap_read_unlock(mm);
		if (ret)
			break;
		cond_resched();
	}
out:
	up_read(&mig->sem);
	cxla_mig_ctx_free(&x);
	if (ret)
		return ret;
	return copy_to_user(arg, &m, sizeof(m)) ? -EFAULT : 0;
}

/* -------------------------------------------------------- eviction */

/* An address space that migrated pages to this device */
struct cxla_mm {
	struct list_head node;	/* mig->mms */
	struct mm_struct *mm;	/* mmgrab()ed */
};

static void cxla_mm_forget(struct cxla_mig *mig, struct cxla_mm *e)
{
	list_del(&e->node);
	mig->nmms--;
	mmdrop(e->mm);
	kfree(e);
}

/* Remember mm (once); forget address spaces that are gone. */
static void cxla_mig_track_mm(struct cxla_mig *mig, struct mm_struct *mm)
{
	struct cxla_mm *e, *t;

	mutex_lock(&mig->mm_lock);
	list_for_each_entry_safe(e, t, &mig->mms, node) {
		if (e->mm == mm)
			goto out;
		if (!atomic_read(&e->mm->mm_users))
			cxla_mm_forget(mig, e);
	}
	e = kmalloc(sizeof(*e), GFP_KERNEL);
	if (!e)
		goto out;	/* eviction looks at every process then */
	mmgrab(mm);
	e->mm = mm;
	list_add_tail(&e->node, &mig->mms);
	mig->nmms++;
out:
	mutex_unlock(&mig->mm_lock);
}

/* Address spaces to look through, each with a user reference. */
struct cxla_mm_set {
	struct mm_struct **mm;
	unsigned int n;
	unsigned int max;
};

static void cxla_mm_set_put(struct cxla_mm_set *set)
{
	unsigned int i;

	for (i = 0; i < set->n; i++)
		mmput_async(set->mm[i]);
	kvfree(set->mm);
	set->mm = NULL;
	set->n = 0;
}

static void cxla_mm_set_add(struct cxla_mm_set *set, struct mm_struct *mm)
{
	unsigned int i;

	for (i = 0; i < set->n; i++) {
		if (set->mm[i] == mm) {
			mmput_async(mm);
			return;
		}
	}
	if (set->n < set->max)
		set->mm[set->n++] = mm;
	else
		mmput_async(mm);
}

static int cxla_tracked_mms(struct cxla_mig *mig, struct cxla_mm_set *set)
{
	struct cxla_mm *e, *t;

	mutex_lock(&mig->mm_lock);
	set->max = max(mig->nmms, 1U);
	set->mm = kvmalloc_array(set->max, sizeof(*set->mm), GFP_KERNEL);
	if (!set->mm) {
		mutex_unlock(&mig->mm_lock);
		return -ENOMEM;
	}
	list_for_each_entry_safe(e, t, &mig->mms, node) {
		if (mmget_not_zero(e->mm))
			cxla_mm_set_add(set, e->mm);
		else
			cxla_mm_forget(mig, e);
	}
	mutex_unlock(&mig->mm_lock);
	return 0;
}

/* Every process's address space (processes made meanwhile are left out). */
static int cxla_all_mms(struct cxla_mm_set *set)
{
	struct task_struct *p;
	unsigned int n = 0;

	rcu_read_lock();
	for_each_process(p)
		n++;
	rcu_read_unlock();
	set->max = n + 16;
	set->mm = kvmalloc_array(set->max, sizeof(*set->mm), GFP_KERNEL);
	if (!set->mm)
		return -ENOMEM;
	rcu_read_lock();
	for_each_process(p) {
		struct mm_struct *mm;

		if (p->flags & PF_KTHREAD)
			continue;
		mm = get_task_mm(p);	/* task_lock: a spinlock */
		if (mm)
			cxla_mm_set_add(set, mm);
	}
	rcu_read_unlock();
	return 0;
}

/* Pool pages that a page table still maps */
static unsigned long cxla_pool_mapped(struct cxla_mig *mig)
{
	unsigned long n = 0, flags;
	struct cxla_chunk *c;
	unsigned int i;

	spin_lock_irqsave(&mig->lock, flags);
	list_for_each_entry(c, &mig->chunks, node) {
		if (c->nfree == CXLA_CHUNK_PAGES)
			continue;
		for (i = 0; i < CXLA_CHUNK_PAGES; i++)
			if (!test_bit(i, c->free) &&
			    folio_mapped(page_folio(pfn_to_page(c->first_pfn + i))))
				n++;
	}
	spin_unlock_irqrestore(&mig->lock, flags);
	return n;
}

/* The scan needs a notifier for hmm_range_fault(); its results are hints. */
static bool cxla_scan_invalidate(struct mmu_interval_notifier *mni,
				 const struct mmu_notifier_range *range,
				 unsigned long cur_seq)
{
	mmu_interval_set_seq(mni, cur_seq);
	return true;
}

static const struct mmu_interval_notifier_ops cxla_scan_ops = {
	.invalidate = cxla_scan_invalidate,
};

/*
 * Narrow [*lo, *hi) to the pages of this device mapped there, without
 * faulting anything in (mmap_lock held). A window that cannot be looked at
 * stays whole.
 */
static void cxla_evict_scan(struct cxla_mig *mig,
			    struct mmu_interval_notifier *mni,
			    unsigned long *pfns, unsigned long *lo,
			    unsigned long *hi)
{
	struct hmm_range range = {
		.notifier = mni,
		.start = *lo,
		.end = *hi,
		.hmm_pfns = pfns,
		.default_flags = 0,	/* look, do not fault */
		.pfn_flags_mask = 0,
	};
	unsigned long i, n = (*hi - *lo) >> PAGE_SHIFT, first = n, last = 0;
	unsigned long pstart = PHYS_PFN(mig->cd->devmem_gpa);
	unsigned long pend = pstart + PHYS_PFN(mig->cd->devmem_size);
	int ret, tries;

	for (tries = 0; tries < 8; tries++) {
		range.notifier_seq = mmu_interval_read_begin(mni);
		ret = hmm_range_fault(&range);
		if (ret != -EBUSY)
			break;
	}
	if (ret)
		return;
	for (i = 0; i < n; i++) {
		unsigned long pfn = pfns[i] & ~HMM_PFN_FLAGS;

		if (!(pfns[i] & HMM_PFN_VALID) || pfn < pstart || pfn >= pend)
			continue;
		first = min(first, i);
		last = i + 1;
	}
	if (first == n) {
		*hi = *lo;
		return;
	}
	*hi = *lo + (last << PAGE_SHIFT);
	*lo += first << PAGE_SHIFT;
}

/*
 * Move this device's pages mapped in mm back to system RAM. The mm's
 * mmap_lock (and our reference) keep its vmas and their anon_vmas alive
 * while migrate_vma_*() walks them.
 */
static int cxla_evict_mm(struct cxla_mig_ctx *x, struct mm_struct *mm,
			 unsigned long *pfns)
{
	const unsigned long scan = CXLA_EVICT_SCAN << PAGE_SHIFT;
	struct mmu_interval_notifier mni;
	struct vm_area_struct *vma;
	unsigned long addr, a, next, lo, hi;
	int ret;

	ret = mmu_interval_notifier_insert(&mni, mm, 0, ULONG_MAX & PAGE_MASK,
					   &cxla_scan_ops);
	if (ret)
		return ret;
	if (x->intr) {
		ret = mmap_read_lock_killable(mm);
		if (ret)
			goto out;
	} else {
		mmap_read_lock(mm);
	}
	for (addr = 0; !ret && (vma = find_vma(mm, addr)); addr = vma->vm_end) {
		/* no anon_vma: no anonymous page was ever there */
		if (!vma->anon_vma || !cxla_vma_migratable(vma, false))
			continue;
		for (a = vma->vm_start; a < vma->vm_end; a = next) {
			next = min(vma->vm_end, ALIGN_DOWN(a, scan) + scan);
			lo = a;
			hi = next;
			/* hmm_range_fault() does not show what PROT_NONE hides */
			if (vma->vm_flags & VM_READ)
				cxla_evict_scan(x->mig, &mni, pfns, &lo, &hi);
			if (lo < hi)
				ret = cxla_mig_window(x, vma, lo, hi);
			if (ret)
				break;
			if (x->intr && fatal_signal_pending(current)) {
				ret = -EINTR;
				break;
			}
			cond_resched();
		}
	}
	mmap_read_unlock(mm);
out:
	mmu_interval_notifier_remove(&mni);
	return ret;
}

/* Evict from every address space of the set; the first device error. */
static int cxla_evict_set(struct cxla_mig_ctx *x, struct cxla_mm_set *set,
			  unsigned long *pfns)
{
	unsigned int i;
	int ret, err = 0;

	for (i = 0; i < set->n; i++) {
		ret = cxla_evict_mm(x, set->mm[i], pfns);
		if (ret == -EINTR)
			return ret;
		err = err ?: ret;
	}
	return err;
}

/*
 * Evict until no page of the pool is mapped any more, retrying busy pages
 * (locked, being migrated elsewhere) until retry_ms have passed. mig->sem
 * is held for writing. Pages that no page table maps stay: nothing can
 * move them, and they come back to the pool when their last user lets go.
 */
static int cxla_evict_loop(struct cxla_mig_ctx *x, unsigned int retry_ms)
{
	struct cxla_mig *mig = x->mig;
	unsigned long deadline = jiffies + msecs_to_jiffies(retry_ms);
	unsigned long all_next = jiffies, *pfns;
	struct cxla_mm_set set = { };
	int ret = 0;

	pfns = kvmalloc_array(CXLA_EVICT_SCAN, sizeof(*pfns), GFP_KERNEL);
	if (!pfns)
		return -ENOMEM;
	while (READ_ONCE(mig->pages_used)) {
		ret = cxla_tracked_mms(mig, &set);
		if (!ret)
			ret = cxla_evict_set(x, &set, pfns);
		cxla_mm_set_put(&set);
		if (ret == -EINTR || (ret && !x->cpu_fallback))
			break;
		if (!cxla_pool_mapped(mig))
			break;
		/* mapped by processes that did not migrate them: look at all */
		if (time_after_eq(jiffies, all_next)) {
			all_next = jiffies + msecs_to_jiffies(CXLA_EVICT_ALL_MS);
			ret = cxla_all_mms(&set);
			if (!ret)
				ret = cxla_evict_set(x, &set, pfns);
			cxla_mm_set_put(&set);
			if (ret == -EINTR || (ret && !x->cpu_fallback))
				break;
			if (!cxla_pool_mapped(mig))
				break;
		}
		if (time_after(jiffies, deadline) ||
		    (x->intr && fatal_signal_pending(current)))
			break;
		msleep(20);
	}
	kvfree(pfns);
	return ret;
}

static long cxla_ioc_evict(struct cxla_file *cf, void __user *arg)
{
	struct cxla_mig *mig = cf->dev->mig;
	struct cxl_accel_migrate res = { };
	struct cxla_mig_ctx x = {
		.mig = mig,
		.mode = CXLA_MIG_EVICT,
		.intr = true,
		.dma = true,
		.res = &res,
	};
	struct cxl_accel_evict e;
	int ret, i;

	if (copy_from_user(&e, arg, sizeof(e)))
		return -EFAULT;
	for (i = 0; i < ARRAY_SIZE(e.reserved); i++)
		if (e.reserved[i])
			return -EINVAL;
	if (e.flags)
		return -EINVAL;
	if (!mig->coherent)
		return -EOPNOTSUPP;
	x.timeout_ms = min_t(u32, e.timeout_ms ?: READ_ONCE(cxla_cmd_timeout_ms),
			     CXLA_MIG_MAX_TIMEOUT_MS);
	ret = cxla_mig_ctx_alloc(&x, CXLA_EVICT_SCAN);
	if (ret)
		return ret;
	down_write(&mig->sem);
	if (READ_ONCE(mig->closed)) {
		up_write(&mig->sem);
		cxla_mig_ctx_free(&x);
		return -ENODEV;
	}
	ret = cxla_evict_loop(&x, CXLA_EVICT_RETRY_MS);
	e.evicted = res.migrated;
	e.chunks_freed = cxla_pool_shrink(mig);
	e.remaining = READ_ONCE(mig->pages_used);
	up_write(&mig->sem);
	cxla_mig_ctx_free(&x);
	if (ret)
		return ret;
	return copy_to_user(arg, &e, sizeof(e)) ? -EFAULT : 0;
}

/* ------------------------------------------------------ info, ioctls */

static void cxla_hmm_info(struct cxla_dev *cd, struct cxl_accel_hmm_info *h)
{
	struct cxla_mig *mig = cd->mig;

	memset(h, 0, sizeof(*h));
	h->flags = mig->coherent ? CXL_ACCEL_HMM_COHERENT : 0;
	if (cd->features & CXL_ACCEL_F_NUMA)
		h->flags |= CXL_ACCEL_HMM_NUMA;
	h->numa_node = mig->node;
	h->mem_start = mig->mem_start;
	h->mem_size = mig->mem_end ? mig->mem_end - mig->mem_start : 0;
	h->chunk_size = CXLA_CHUNK_SIZE;
	spin_lock_irq(&mig->lock);
	h->pool_chunks = mig->nchunks;
	h->pool_pages_used = mig->pages_used;
	h->pool_pages_free = mig->pages_free;
	spin_unlock_irq(&mig->lock);
	h->migrated_to_dev = atomic64_read(&mig->stat[CXLA_MS_TO_DEV]);
	h->migrated_to_ram = atomic64_read(&mig->stat[CXLA_MS_TO_RAM]);
	h->evicted = atomic64_read(&mig->stat[CXLA_MS_EVICTED]);
	h->cpu_evicted = atomic64_read(&mig->stat[CXLA_MS_CPU_EVICTED]);
	h->copy_commands = atomic64_read(&mig->stat[CXLA_MS_COPY_CMDS]);
	h->copy_failures = atomic64_read(&mig->stat[CXLA_MS_COPY_FAIL]);
	h->svm_faults = atomic64_read(&mig->stat[CXLA_MS_SVM_FAULTS]);
	h->svm_retries = atomic64_read(&mig->stat[CXLA_MS_SVM_RETRIES]);
	h->svm_mirror_hits = atomic64_read(&mig->stat[CXLA_MS_SVM_HITS]);
	h->svm_invalidations = atomic64_read(&mig->stat[CXLA_MS_SVM_INVAL]);
	h->svm_invalidate_waits = atomic64_read(&mig->stat[CXLA_MS_SVM_INVAL_WAITS]);
	h->svm_mirrors = atomic64_read(&mig->stat[CXLA_MS_SVM_MIRRORS]);
}

static long cxla_ioc_hmm_info(struct cxla_file *cf, void __user *arg)
{
	struct cxl_accel_hmm_info h;

	/* chunks emptied by munmap or exit go back first: exact counts */
	flush_workqueue(cxla_wq);
	cxla_hmm_info(cf->dev, &h);
	return copy_to_user(arg, &h, sizeof(h)) ? -EFAULT : 0;
}

static ssize_t migration_show(struct device *dev, struct device_attribute *attr,
			      char *buf)
{
	struct cxl_accel_hmm_info h;

	cxla_hmm_info(to_cxla_dev(dev), &h);
	return sysfs_emit(buf,
			  "mode %s\nnuma_node %d\npool_chunks %llu\npool_pages_used %llu\npool_pages_free %llu\nmigrated_to_dev %llu\nmigrated_to_ram %llu\nevicted %llu\ncpu_evicted %llu\ncopy_commands %llu\ncopy_failures %llu\nsvm_faults %llu\nsvm_retries %llu\nsvm_mirror_hits %llu\nsvm_invalidations %llu\nsvm_invalidate_waits %llu\nsvm_mirrors %llu\n",
			  h.flags & CXL_ACCEL_HMM_NUMA ? "numa" :
			  h.flags & CXL_ACCEL_HMM_COHERENT ? "coherent" : "none",
			  h.numa_node, h.pool_chunks, h.pool_pages_used,
			  h.pool_pages_free, h.migrated_to_dev, h.migrated_to_ram,
			  h.evicted, h.cpu_evicted, h.copy_commands,
			  h.copy_failures, h.svm_faults, h.svm_retries,
			  h.svm_mirror_hits, h.svm_invalidations,
			  h.svm_invalidate_waits, h.svm_mirrors);
}
static DEVICE_ATTR_RO(migration);

/* The NUMA node of device memory: the node itself in NUMA mode */
static ssize_t numa_node_show(struct device *dev, struct device_attribute *attr,
			      char *buf)
{
	return sysfs_emit(buf, "%d\n", to_cxla_dev(dev)->mig->node);
}
static DEVICE_ATTR_RO(numa_node);

static struct attribute *cxla_mig_attrs[] = {
	&dev_attr_numa_node.attr,
	&dev_attr_migration.attr,
	NULL,
};

const struct attribute_group cxla_mig_group = {
	.attrs = cxla_mig_attrs,
};

long cxla_hmm_ioctl(struct cxla_file *cf, unsigned int cmd, void __user *arg)
{
	switch (cmd) {
	case CXL_ACCEL_IOC_MIGRATE_TO_DEV:
		return cxla_ioc_migrate(cf, arg, true);
	case CXL_ACCEL_IOC_MIGRATE_TO_RAM:
		return cxla_ioc_migrate(cf, arg, false);
	case CXL_ACCEL_IOC_EVICT:
		return cxla_ioc_evict(cf, arg);
	case CXL_ACCEL_IOC_HMM_INFO:
		return cxla_ioc_hmm_info(cf, arg);
	case CXL_ACCEL_IOC_SVM:
		return cxla_ioc_svm(cf, arg);
	case CXL_ACCEL_IOC_SNAPSHOT:
		return cxla_ioc_snapshot(cf, arg);
	case CXL_ACCEL_IOC_PIN_CHECKSUM:
		return cxla_ioc_pin_checksum(cf, arg);
	default:
		return -ENOTTY;
	}
}

/* ------------------------------------------------ probe and removal */

#define CXLA_NUMA_TRIES		100	/* x 20 ms until the device knows its memory */

/*
 * NUMA attach mode: device memory is a CPU-less NUMA node of guest RAM,
 * there is no ivshmem function and no ZONE_DEVICE memory. The kernel owns
 * the pages (move_pages(), mbind()); the device is told about them as plain
 * guest-physical addresses. IDENTIFY says where the node's memory is.
 */
int cxla_numa_init(struct cxla_dev *cd)
{
	struct device *vdev = &cd->vdev->dev;
	struct cxla_identify id;
	unsigned long first, last;
	int tries, ret, nid;
	u64 gpa = 0;

	for (tries = 0; tries < CXLA_NUMA_TRIES; tries++) {
		ret = cxla_simple_cmd(cd, CXLA_OP_IDENTIFY, NULL, 0, &id,
				      sizeof(id), NULL, 0, false);
		if (ret)
			return ret;
		gpa = le64_to_cpu(id.devmem_gpa);
		if (gpa)
			break;
		msleep(20);
	}
	if (!gpa) {
		dev_err(vdev, "NUMA mode: the device does not know where its memory is\n");
		return -ENODEV;
	}
	first = PHYS_PFN(gpa);
	last = PHYS_PFN(gpa + cd->devmem_size - 1);
	if (!IS_ALIGNED(gpa, CXLA_DEVMEM_ALIGN) || !pfn_valid(first) ||
	    !pfn_valid(last)) {
		dev_err(vdev,
			"NUMA mode: device memory %#llx + %#llx is not guest RAM with struct pages (not onlined?)\n",
			gpa, cd->devmem_size);
		return -ENODEV;
	}
	nid = page_to_nid(pfn_to_page(first));
	if (page_to_nid(pfn_to_page(last)) != nid) {
		dev_err(vdev, "NUMA mode: device memory spans nodes %d and %d\n",
			nid, page_to_nid(pfn_to_page(last)));
		return -ENODEV;
	}
	if (node_state(nid, N_CPU))
		dev_warn(vdev, "NUMA mode: node %d of device memory has CPUs\n",
			 nid);
	cd->devmem_gpa = gpa;
	cxla_mig_register(cd, gpa, cd->devmem_size, false, nid);
	return 0;
}

int cxla_mig_init(struct cxla_dev *cd)
{
	struct cxla_mig *mig;
	int i;

	mig = kzalloc(sizeof(*mig), GFP_KERNEL);
	if (!mig)
		return -ENOMEM;
	mig->cd = cd;
	init_rwsem(&mig->sem);
	mutex_init(&mig->grow_lock);
	spin_lock_init(&mig->lock);
	INIT_LIST_HEAD(&mig->chunks);
	INIT_LIST_HEAD(&mig->reg);
	mutex_init(&mig->mm_lock);
	INIT_LIST_HEAD(&mig->mms);
	INIT_WORK(&mig->shrink_work, cxla_shrink_work);
	mig->node = NUMA_NO_NODE;
	for (i = 0; i < CXLA_MS_COUNT; i++)
		atomic64_set(&mig->stat[i], 0);
	cd->mig = mig;
	return 0;
}

/* Removal: eviction with the device (dma) or by the CPU, until retry_ms. */
static void cxla_mig_evict_removal(struct cxla_dev *cd, bool dma,
				   const char *when)
{
	struct cxla_mig *mig = cd->mig;
	struct cxl_accel_migrate res = { };
	struct cxla_mig_ctx x = {
		.mig = mig,
		.mode = CXLA_MIG_EVICT,
		.dma = dma,
		.cpu_fallback = true,
		.timeout_ms = CXLA_REMOVE_CMD_MS,
		.res = &res,
	};
	int ret;

	if (!READ_ONCE(mig->pages_used))
		return;
	ret = cxla_mig_ctx_alloc(&x, CXLA_EVICT_SCAN);
	if (!ret)
		ret = cxla_evict_loop(&x, CXLA_REMOVE_RETRY_MS);
	cxla_mig_ctx_free(&x);
	if (res.migrated || ret)
		dev_info(&cd->dev,
			 "%llu migrated pages moved back to system RAM %s, %llu of them by CPU copy (error %d)\n",
			 res.migrated, when, x.cpu_copied, ret);
}

/*
 * Removal, after user mappings of buffers were zapped, while the command
 * queue still runs: no new migrations, every migrated page back to system
 * RAM (by DMA; by CPU if the device does not answer), empty chunks back to
 * the device.
 */
void cxla_mig_evict_all(struct cxla_dev *cd)
{
	struct cxla_mig *mig = cd->mig;

	if (!mig)
		return;
	down_write(&mig->sem);
	spin_lock_irq(&mig->lock);
	mig->closed = true;
	spin_unlock_irq(&mig->lock);
	cxla_mig_unregister(mig);
	cxla_mig_evict_removal(cd, !READ_ONCE(cd->wedged), "at removal");
	cxla_pool_shrink(mig);
	up_write(&mig->sem);
	cancel_work_sync(&mig->shrink_work);
}

/*
 * Removal, after the device was reset and abandoned commands were reaped:
 * what is still mapped (pages that were busy) is copied by the CPU, then
 * the pool gives up its empty chunks. Pages that no process maps but that
 * are still referenced (a pipe, a pin) stay: devmem.c keeps the memory
 * mapped until they are given back.
 */
void cxla_mig_teardown(struct cxla_dev *cd)
{
	struct cxla_mig *mig = cd->mig;

	if (!mig)
		return;
	down_write(&mig->sem);
	cxla_mig_evict_removal(cd, false, "after the reset");
	if (READ_ONCE(mig->pages_used))
		dev_info(&cd->dev,
			 "%lu migrated pages are still referenced (pipes, pins) but mapped by no process: their device memory stays until they are released\n",
			 READ_ONCE(mig->pages_used));
	cxla_pool_shrink(mig);
	up_write(&mig->sem);
}

/* Device structure released: nothing can reach the pool any more. */
void cxla_mig_free(struct cxla_dev *cd)
{
	struct cxla_mig *mig = cd->mig;
	struct cxla_mm *e, *t;

	if (!mig)
		return;
	cxla_mig_unregister(mig);
	list_for_each_entry_safe(e, t, &mig->mms, node)
		cxla_mm_forget(mig, e);
	cd->mig = NULL;
	kfree(mig);
}
