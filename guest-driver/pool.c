// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: the page pool that migration takes device pages from, the
 * list of devices (to tell RAM, local and peer pages apart) and page holds.
 *
 * Destination pages come from pool chunks: 2 MiB device buffers
 * (cxla_buf_alloc, ALLOC) whose pages the pool takes over. A free pool
 * page has refcount 0; zone_device_page_init() hands it out locked with
 * refcount 1; the mm then holds it through its mappings, and when the last
 * reference goes, page_free() (devmem.c) returns it to its chunk here. A
 * chunk whose pages are all back is given back to the device (FREE), from
 * a work item, so that device memory is not kept by the pool; after
 * CXLA_POOL_LINGER, so that moving a few pages there and back again does not
 * cost an ALLOC and a FREE each time. Asking for counts (IDENTIFY, HMM_INFO)
 * and an ALLOC that finds device memory full end the wait at once.
 *
 * Poisoned device memory (poison.c): free pool pages in a poisoned range
 * are quarantined (c->quar) instead of being handed out, and so are pages
 * that come back there later; they count as free when the pool decides
 * whether a chunk is empty (a chunk goes back to the device all the same:
 * the device never allocates poisoned memory again), and go back to the
 * free pages when the range is cleared.
 *
 * Device commands that time out or are interrupted stay quarantined (vq.c)
 * together with a reference on every destination page they write
 * (cxla_page_hold), so the device can never write into a page that went
 * back to the page allocator or the pool.
 */
#include <linux/memremap.h>
#include <linux/mm.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>

#include "cxl_accel.h"
#include "badrange.h"
#include "compat.h"
#include "core.h"
#include "devmem.h"
#include "pool.h"
#include "vq.h"


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

void cxla_mig_unregister(struct cxla_mig *mig)
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

/* Whether every page of the chunk is back (free or quarantined) */
static bool cxla_chunk_empty(const struct cxla_chunk *c)
{
	return c->nfree + c->nquar == CXLA_CHUNK_PAGES;
}

/* Device-memory offset of page bit of a chunk */
static u64 cxla_chunk_off(const struct cxla_chunk *c, unsigned int bit)
{
	return PFN_PHYS(c->first_pfn + bit) - c->mig->cd->devmem_gpa;
}

/* devmem.c's page_free() for pool pages: the page is free again. */
static void cxla_pool_page_free(struct cxla_buf *buf, struct page *page)
{
	struct cxla_chunk *c = buf->chunk;
	struct cxla_mig *mig = c->mig;
	unsigned long idx = page_to_pfn(page) - c->first_pfn;
	unsigned long flags;
	bool empty;

	spin_lock_irqsave(&mig->lock, flags);
	if (WARN_ON_ONCE(idx >= CXLA_CHUNK_PAGES || test_bit(idx, c->free) ||
			 test_bit(idx, c->quar))) {
		spin_unlock_irqrestore(&mig->lock, flags);
		return;
	}
	if (cxla_badrange_hit(mig->cd, cxla_chunk_off(c, idx), PAGE_SIZE)) {
		/* back inside a poisoned range: never handed out again */
		__set_bit(idx, c->quar);
		c->nquar++;
		mig->pages_quar++;
	} else {
		__set_bit(idx, c->free);
		c->nfree++;
		mig->pages_free++;
	}
	mig->pages_used--;
	empty = c->live && cxla_chunk_empty(c) && !mig->closed;
	/* queued under the lock: the teardown's cancel (after closed) sees it */
	if (empty)
		cxla_defer_delayed(mig->cd, &mig->shrink_work, CXLA_POOL_LINGER);
	spin_unlock_irqrestore(&mig->lock, flags);
}

/*
 * Give lingering empty chunks back now (counts are asked for, or device
 * memory is full). Returns whether any work was pending. Not with mig->sem
 * held: the shrink takes it.
 */
bool cxla_pool_linger_end(struct cxla_mig *mig)
{
	return flush_delayed_work(&mig->shrink_work);
}

/*
 * Before exact counts (IDENTIFY's free memory, HMM_INFO): lingering empty
 * chunks go back and this device's deferred frees run (cxla_deferred_wait).
 */
int cxla_pool_settle(struct cxla_dev *cd, bool intr)
{
	if (cd->mig)
		cxla_pool_linger_end(cd->mig);
	return cxla_deferred_wait(cd, intr);
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

/*
 * Add a chunk: ALLOC a device buffer and take its pages over. Unless
 * whole, only when no page is free (else someone else grew it).
 */
static int cxla_pool_grow(struct cxla_mig *mig, bool whole)
{
	struct cxla_dev *cd = mig->cd;
	struct cxla_chunk *c;
	struct cxla_buf *buf;
	unsigned long i;
	bool held;
	int ret = 0;

	mutex_lock(&mig->grow_lock);
	if (!whole && READ_ONCE(mig->pages_free))
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
unsigned long cxla_pool_get(struct cxla_mig *mig, unsigned long n,
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
		ret = cxla_pool_grow(mig, false);
		if (ret) {
			*err = ret;
			break;
		}
	}
	return got;
}

/*
 * A whole free chunk: 512 contiguous pool pages (locked, refcount 1), the
 * backing of a 2 MiB private folio. Grows the pool for one if need be;
 * NULL when device memory has no 2 MiB left.
 */
struct page *cxla_pool_get_chunk(struct cxla_mig *mig)
{
	struct cxla_chunk *c, *found;
	unsigned long flags, i;
	int tries;

	for (tries = 0; tries < 2; tries++) {
		found = NULL;
		spin_lock_irqsave(&mig->lock, flags);
		list_for_each_entry(c, &mig->chunks, node) {
			if (c->live && c->nfree == CXLA_CHUNK_PAGES) {
				found = c;
				break;
			}
		}
		if (found && !mig->closed) {
			bitmap_zero(found->free, CXLA_CHUNK_PAGES);
			found->nfree = 0;
			mig->pages_free -= CXLA_CHUNK_PAGES;
			mig->pages_used += CXLA_CHUNK_PAGES;
			for (i = 0; i < CXLA_CHUNK_PAGES; i++)
				pfn_to_page(found->first_pfn + i)->zone_device_data =
					found->buf;
		} else {
			found = NULL;
		}
		spin_unlock_irqrestore(&mig->lock, flags);
		if (found) {
			atomic_long_add(CXLA_CHUNK_PAGES, &mig->cd->pages_live);
			for (i = 0; i < CXLA_CHUNK_PAGES; i++)
				cxla_zone_device_page_init(pfn_to_page(found->first_pfn + i),
							   &mig->cd->pgmap);
			return pfn_to_page(found->first_pfn);
		}
		if (READ_ONCE(mig->closed) || cxla_pool_grow(mig, true))
			break;
	}
	return NULL;
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
unsigned long cxla_pool_shrink(struct cxla_mig *mig)
{
	struct cxla_chunk *c, *t;
	unsigned long n = 0;
	LIST_HEAD(gone);

	spin_lock_irq(&mig->lock);
	list_for_each_entry_safe(c, t, &mig->chunks, node) {
		if (!cxla_chunk_empty(c))
			continue;
		c->live = false;
		list_move_tail(&c->node, &gone);
		mig->nchunks--;
		mig->pages_free -= c->nfree;
		mig->pages_quar -= c->nquar;
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
	struct cxla_mig *mig = container_of(to_delayed_work(work), struct cxla_mig,
					    shrink_work);

	down_write(&mig->sem);
	if (!READ_ONCE(mig->closed))
		cxla_pool_shrink(mig);
	up_write(&mig->sem);
	cxla_deferred_done(mig->cd);
}

/* ------------------------------------------ address spaces with our pages */

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
void cxla_pool_track_mm(struct cxla_mig *mig, struct mm_struct *mm)
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

/*
 * The address spaces remembered, each with a user reference (mmget), in a
 * new array (kvfree() it); *n of them. Gone ones are forgotten. NULL: no
 * memory.
 */
struct mm_struct **cxla_pool_mms(struct cxla_mig *mig, unsigned int *n)
{
	struct cxla_mm *e, *t;
	struct mm_struct **mms;

	*n = 0;
	mutex_lock(&mig->mm_lock);
	mms = kvmalloc_array(max(mig->nmms, 1U), sizeof(*mms), GFP_KERNEL);
	if (mms) {
		list_for_each_entry_safe(e, t, &mig->mms, node) {
			if (mmget_not_zero(e->mm))
				mms[(*n)++] = e->mm;
			else
				cxla_mm_forget(mig, e);
		}
	}
	mutex_unlock(&mig->mm_lock);
	return mms;
}

/* The device structure goes: forget every address space. */
static void cxla_pool_forget_mms(struct cxla_mig *mig)
{
	struct cxla_mm *e, *t;

	list_for_each_entry_safe(e, t, &mig->mms, node)
		cxla_mm_forget(mig, e);
}

/*
 * Removal's last step, once every page is back (at once, or when the last
 * pipe or pin let go of an orphaned removal): chunks that emptied after the
 * teardown go too, and with them their buffers' device references.
 */
static void cxla_pool_unmapping(struct cxla_dev *cd)
{
	struct cxla_mig *mig = cd->mig;

	if (!mig)
		return;
	down_write(&mig->sem);
	cxla_pool_shrink(mig);
	up_write(&mig->sem);
}

static const struct cxla_devmem_hooks cxla_pool_devmem_hooks = {
	.page_free = cxla_pool_page_free,
	.unmapping = cxla_pool_unmapping,
};

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
	INIT_DELAYED_WORK(&mig->shrink_work, cxla_shrink_work);
	mig->node = NUMA_NO_NODE;
	for (i = 0; i < CXLA_MS_COUNT; i++)
		atomic64_set(&mig->stat[i], 0);
	cd->mig = mig;
	cd->devmem_hooks = &cxla_pool_devmem_hooks;
	return 0;
}

/* Device structure released: nothing can reach the pool any more. */
void cxla_mig_free(struct cxla_dev *cd)
{
	struct cxla_mig *mig = cd->mig;

	if (!mig)
		return;
	cxla_mig_unregister(mig);
	cxla_pool_forget_mms(mig);
	cd->mig = NULL;
	kfree(mig);
}

/* Pool pages in use (neither free nor quarantined) that test() picks */
static unsigned long cxla_pool_count_used(struct cxla_mig *mig,
					  bool (*test)(struct cxla_mig *mig,
						       struct cxla_chunk *c,
						       unsigned int i))
{
	unsigned long n = 0, flags;
	struct cxla_chunk *c;
	unsigned int i;

	spin_lock_irqsave(&mig->lock, flags);
	list_for_each_entry(c, &mig->chunks, node) {
		if (cxla_chunk_empty(c))
			continue;
		for (i = 0; i < CXLA_CHUNK_PAGES; i++)
			if (!test_bit(i, c->free) && !test_bit(i, c->quar) &&
			    test(mig, c, i))
				n++;
	}
	spin_unlock_irqrestore(&mig->lock, flags);
	return n;
}

static bool cxla_pool_page_poisoned(struct cxla_mig *mig, struct cxla_chunk *c,
				    unsigned int i)
{
	return cxla_badrange_hit(mig->cd, cxla_chunk_off(c, i), PAGE_SIZE);
}

static bool cxla_pool_page_mapped(struct cxla_mig *mig, struct cxla_chunk *c,
				  unsigned int i)
{
	return folio_mapped(page_folio(pfn_to_page(c->first_pfn + i)));
}

static bool cxla_pool_page_mapped_unpoisoned(struct cxla_mig *mig,
					     struct cxla_chunk *c,
					     unsigned int i)
{
	return cxla_pool_page_mapped(mig, c, i) &&
	       !cxla_pool_page_poisoned(mig, c, i);
}

/*
 * Pool pages that a page table still maps; with skip_poisoned, not those
 * on poisoned memory (eviction leaves them where they are).
 */
unsigned long cxla_pool_mapped(struct cxla_mig *mig, bool skip_poisoned)
{
	return cxla_pool_count_used(mig, skip_poisoned ?
				    cxla_pool_page_mapped_unpoisoned :
				    cxla_pool_page_mapped);
}

/* Pool pages in use (process data, private pages' backing) on poisoned memory */
unsigned long cxla_pool_poisoned_used(struct cxla_mig *mig)
{
	return cxla_pool_count_used(mig, cxla_pool_page_poisoned);
}

/* POISON (poison.c): the free pages of [start, end) are held back. */
void cxla_pool_poison(struct cxla_mig *mig, u64 start, u64 end)
{
	struct cxla_chunk *c;
	unsigned int i;

	spin_lock_irq(&mig->lock);
	list_for_each_entry(c, &mig->chunks, node) {
		u64 cs = cxla_chunk_off(c, 0);

		if (cs >= end || cs + CXLA_CHUNK_SIZE <= start)
			continue;
		for (i = 0; i < CXLA_CHUNK_PAGES; i++) {
			u64 off = cs + ((u64)i << PAGE_SHIFT);

			if (off + PAGE_SIZE <= start || off >= end ||
			    !test_bit(i, c->free))
				continue;
			__clear_bit(i, c->free);
			c->nfree--;
			mig->pages_free--;
			__set_bit(i, c->quar);
			c->nquar++;
			mig->pages_quar++;
		}
	}
	spin_unlock_irq(&mig->lock);
}

/*
 * POISON_CLEARED (poison.c): quarantined pages that no poisoned range
 * covers any more are free again.
 */
void cxla_pool_unpoison(struct cxla_mig *mig)
{
	struct cxla_chunk *c;
	unsigned int i;

	spin_lock_irq(&mig->lock);
	list_for_each_entry(c, &mig->chunks, node) {
		if (!c->nquar)
			continue;
		for_each_set_bit(i, c->quar, CXLA_CHUNK_PAGES) {
			if (cxla_badrange_hit(mig->cd, cxla_chunk_off(c, i),
					    PAGE_SIZE))
				continue;
			__clear_bit(i, c->quar);
			c->nquar--;
			mig->pages_quar--;
			__set_bit(i, c->free);
			c->nfree++;
			mig->pages_free++;
		}
	}
	spin_unlock_irq(&mig->lock);
}

void cxla_pool_poison_info(struct cxla_mig *mig, struct cxl_accel_hmm_info *h)
{
	spin_lock_irq(&mig->lock);
	h->pool_pages_poisoned = mig->pages_quar;
	spin_unlock_irq(&mig->lock);
	h->poison_skipped = atomic64_read(&mig->stat[CXLA_MS_POISON_SKIPPED]);
}

/*
 * Whether the memory at guest-physical address pa is a poisoned page of a
 * cxl-accel device (this one or a peer); RAM never is, as far as we know.
 */
bool cxla_mem_poisoned(phys_addr_t pa)
{
	struct cxla_mig *m;
	bool hit = false;

	spin_lock(&cxla_reg_lock);
	list_for_each_entry(m, &cxla_reg, reg) {
		if (pa >= m->mem_start && pa < m->mem_end) {
			hit = cxla_badrange_hit(m->cd, pa - m->mem_start,
					      PAGE_SIZE);
			break;
		}
	}
	spin_unlock(&cxla_reg_lock);
	return hit;
}
