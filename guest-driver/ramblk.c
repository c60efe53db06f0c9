// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: system RAM destination pages of migrations back to RAM.
 *
 * Destinations come from 2 MiB blocks split into single pages (1 MiB ones
 * for a single 2 MiB): a few allocations instead of one per page, and
 * physically contiguous destinations the device copies in large pieces.
 * The kernel zeroes every new page (init_on_alloc, on by default in
 * distributions), which costs as much as the rest of a move back to RAM,
 * so the allocation is taken off the migrating task where it can be:
 *  - a reserve of 2 MiB blocks per NUMA node (ram_reserve_mb), filled by a
 *    work item once migrations pause, hands out ready pages: whole blocks
 *    for each 2 MiB of a window, the rest (and small windows) from one
 *    block they share; a shrinker gives it all back under memory pressure;
 *  - the blocks the reserve lacks, this CPU and a helper on another
 *    allocate at once; single pages it lacks come from alloc_page_vma().
 * A vma or task with a memory policy, which the blocks would not follow,
 * gets its pages one by one from alloc_page_vma().
 */
#include <linux/cpuset.h>
#include <linux/gfp.h>
#include <linux/mempolicy.h>
#include <linux/mm.h>
#include <linux/moduleparam.h>
#include <linux/nodemask.h>
#include <linux/shrinker.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/topology.h>

#include "core.h"
#include "devmem.h"
#include "ramblk.h"

/* no direct reclaim for a window's blocks: it can take single pages */
#define CXLA_BLOCK_GFP	((GFP_HIGHUSER_MOVABLE & ~__GFP_DIRECT_RECLAIM) | \
			 __GFP_NORETRY | __GFP_NOWARN)
/*
 * The reserve's blocks: no reclaim at all (under memory pressure it stays
 * short rather than push out other memory or wake kswapd, whose shrinking
 * would empty it again), and not movable: held for long, they would stand
 * in the way of whoever must empty ZONE_MOVABLE or a CMA area.
 */
#define CXLA_RESERVE_GFP	((GFP_HIGHUSER & ~__GFP_RECLAIM) | __GFP_NORETRY | \
				 __GFP_NOWARN | __GFP_THISNODE)
#define CXLA_RESERVE_ORDER	(21 - PAGE_SHIFT)	/* 2 MiB blocks */
#define CXLA_BLOCK_PAGES	(1U << CXLA_RESERVE_ORDER)
#define CXLA_RESERVE_MAX	32			/* per node: 64 MiB */

struct cxla_ram_node {
	spinlock_t lock;
	unsigned int n;
	bool used;		/* a migration took pages here: keep it filled */
	struct cxla_ram_run part;	/* the rest of the block being shared */
	struct page *blk[CXLA_RESERVE_MAX];
};

static struct cxla_ram_node *cxla_ram_nodes;	/* nr_node_ids of them */
static atomic_long_t cxla_ram_taken;		/* pages migrations took */
static atomic_long_t cxla_ram_missed;		/* pages the reserve lacked */
static struct shrinker *cxla_ram_shrinker;

static void cxla_ram_refill(struct work_struct *work);
static DECLARE_DELAYED_WORK(cxla_ram_refill_work, cxla_ram_refill);
static DEFINE_SPINLOCK(cxla_ram_live_lock);
static bool cxla_ram_live;	/* between init and exit: the refill may run */

/*
 * The refill waits until migrations pause this long: its zeroing would
 * compete with them for CPUs (measured: a refill started at once made a
 * 2 MiB move back slower than no reserve at all).
 */
#define CXLA_REFILL_QUIET_MS	20

static void cxla_ram_refill_after(unsigned long delay)
{
	spin_lock(&cxla_ram_live_lock);
	if (cxla_ram_live)
		mod_delayed_work(cxla_wq, &cxla_ram_refill_work, delay);
	spin_unlock(&cxla_ram_live_lock);
}

static unsigned int cxla_ram_reserve_mb = 16;

/* A new size applies at once: the refill trims or fills to it */
static int cxla_ram_reserve_mb_set(const char *val,
				   const struct kernel_param *kp)
{
	int ret = param_set_uint(val, kp);

	if (!ret)
		cxla_ram_refill_after(0);
	return ret;
}

static const struct kernel_param_ops cxla_ram_reserve_mb_ops = {
	.set = cxla_ram_reserve_mb_set,
	.get = param_get_uint,
};
module_param_cb(ram_reserve_mb, &cxla_ram_reserve_mb_ops, &cxla_ram_reserve_mb,
		0644);
MODULE_PARM_DESC(ram_reserve_mb,
		 "System RAM per NUMA node kept allocated for migrations back to RAM, in 2 MiB blocks (0 = none, at most 64)");

/* Blocks per node the reserve holds */
static unsigned int cxla_ram_target(void)
{
	unsigned int mb = READ_ONCE(cxla_ram_reserve_mb);

	return min_t(unsigned int, mb >> (CXLA_RESERVE_ORDER + PAGE_SHIFT - 20),
		     CXLA_RESERVE_MAX);
}

/* A block of 2^order single pages (each refcount 1), or NULL */
static struct page *cxla_block_alloc(int nid, unsigned int order, gfp_t gfp)
{
	struct page *p = alloc_pages_node(nid, gfp, order);

	if (p)
		split_page(p, order);
	return p;
}

static void cxla_pages_free(struct page *p, unsigned int n)
{
	while (n--)
		__free_page(p++);
}

/* The shared block's rest, else a whole block, out of rn; n 0: none */
static struct cxla_ram_run cxla_ram_reserve_pop(struct cxla_ram_node *rn)
{
	struct cxla_ram_run r = {};

	spin_lock(&rn->lock);
	if (rn->part.n) {
		r = rn->part;
		rn->part.n = 0;
	} else if (rn->n) {
		r.p = rn->blk[--rn->n];
		r.n = CXLA_BLOCK_PAGES;
	}
	spin_unlock(&rn->lock);
	return r;
}

/* Frees rn's pages, the shared block's rest first, until at least max */
static unsigned long cxla_ram_node_free(struct cxla_ram_node *rn,
					unsigned long max)
{
	unsigned long freed = 0;
	struct cxla_ram_run r;

	while (freed < max && (r = cxla_ram_reserve_pop(rn)).n) {
		cxla_pages_free(r.p, r.n);
		freed += r.n;
	}
	return freed;
}

/* Pages in rn: its whole blocks and the shared block's rest */
static unsigned long cxla_ram_node_pages(const struct cxla_ram_node *rn)
{
	return (unsigned long)READ_ONCE(rn->n) * CXLA_BLOCK_PAGES +
	       READ_ONCE(rn->part.n);
}

/*
 * Up to npages pages of node nid's reserve as runs of consecutive pages:
 * a whole block for each 2 MiB, the rest from the shared block (a new one
 * when it runs out). Returns the runs; *blocks: whole blocks among them,
 * which come first.
 */
static unsigned int cxla_ram_reserve_take(int nid, struct cxla_ram_run *run,
					  unsigned long npages,
					  unsigned int *blocks)
{
	unsigned long got, rest = npages % CXLA_BLOCK_PAGES;
	unsigned long n2m = npages / CXLA_BLOCK_PAGES;
	struct cxla_ram_node *rn;
	unsigned int nr = 0, k;

	rn = &cxla_ram_nodes[nid];
	spin_lock(&rn->lock);
	while (nr < n2m && rn->n)
		run[nr++] = (struct cxla_ram_run){ rn->blk[--rn->n],
						   CXLA_BLOCK_PAGES };
	*blocks = nr;
	got = (unsigned long)nr * CXLA_BLOCK_PAGES;
	if (rest && rn->part.n) {
		k = min_t(unsigned long, rest, rn->part.n);
		run[nr++] = (struct cxla_ram_run){ rn->part.p, k };
		rn->part.p += k;
		rn->part.n -= k;
		rest -= k;
		got += k;
	}
	if (rest && rn->n) {
		struct page *b = rn->blk[--rn->n];

		run[nr++] = (struct cxla_ram_run){ b, rest };
		rn->part = (struct cxla_ram_run){ b + rest,
						  CXLA_BLOCK_PAGES - rest };
		got += rest;
	}
	rn->used = true;
	spin_unlock(&rn->lock);
	atomic_long_add(got, &cxla_ram_taken);
	atomic_long_add(npages - got, &cxla_ram_missed);
	if (cxla_ram_target())
		cxla_ram_refill_after(msecs_to_jiffies(CXLA_REFILL_QUIET_MS));
	return nr;
}

/*
 * Fills every used node's reserve up to ram_reserve_mb and trims the ones
 * above it (at 0, the shared block's rest too).
 */
static void cxla_ram_refill(struct work_struct *work)
{
	unsigned int target = cxla_ram_target();
	int nid;

	for_each_node_state(nid, N_MEMORY) {
		struct cxla_ram_node *rn = &cxla_ram_nodes[nid];
		struct page *p;
		bool more;

		if (!target)
			cxla_ram_node_free(rn, ULONG_MAX);
		for (;;) {
			spin_lock(&rn->lock);
			p = rn->n > target ? rn->blk[--rn->n] : NULL;
			more = rn->used && rn->n < target;
			spin_unlock(&rn->lock);
			if (p) {
				cxla_pages_free(p, CXLA_BLOCK_PAGES);
				continue;
			}
			if (!more)
				break;
			p = cxla_block_alloc(nid, CXLA_RESERVE_ORDER,
					     CXLA_RESERVE_GFP);
			if (!p)
				break;
			spin_lock(&rn->lock);
			if (rn->n < target) {
				rn->blk[rn->n++] = p;
				p = NULL;
			}
			spin_unlock(&rn->lock);
			if (p) {
				cxla_pages_free(p, CXLA_BLOCK_PAGES);
				break;
			}
		}
	}
}

static unsigned long cxla_ram_reserve_pages(void)
{
	unsigned long pages = 0;
	int nid;

	for (nid = 0; nid < nr_node_ids; nid++)
		pages += cxla_ram_node_pages(&cxla_ram_nodes[nid]);
	return pages;
}

void cxla_ram_reserve_stats(struct cxla_ram_stats *st)
{
	st->pages = cxla_ram_reserve_pages();
	st->taken = atomic_long_read(&cxla_ram_taken);
	st->missed = atomic_long_read(&cxla_ram_missed);
}

/* The shrinker is NUMA aware: reclaim on one node empties that node's */
static unsigned long cxla_ram_count(struct shrinker *s,
				    struct shrink_control *sc)
{
	return cxla_ram_node_pages(&cxla_ram_nodes[sc->nid]) ?: SHRINK_EMPTY;
}

static unsigned long cxla_ram_scan(struct shrinker *s,
				   struct shrink_control *sc)
{
	return cxla_ram_node_free(&cxla_ram_nodes[sc->nid], sc->nr_to_scan) ?:
	       SHRINK_STOP;
}

int cxla_ram_reserve_init(void)
{
	int nid;

	cxla_ram_nodes = kcalloc(nr_node_ids, sizeof(*cxla_ram_nodes),
				 GFP_KERNEL);
	if (!cxla_ram_nodes)
		return -ENOMEM;
	for (nid = 0; nid < nr_node_ids; nid++)
		spin_lock_init(&cxla_ram_nodes[nid].lock);
	cxla_ram_shrinker = shrinker_alloc(SHRINKER_NUMA_AWARE,
					   "cxl_accel-ram-reserve");
	if (!cxla_ram_shrinker) {
		kfree(cxla_ram_nodes);
		cxla_ram_nodes = NULL;
		return -ENOMEM;
	}
	cxla_ram_shrinker->count_objects = cxla_ram_count;
	cxla_ram_shrinker->scan_objects = cxla_ram_scan;
	shrinker_register(cxla_ram_shrinker);
	spin_lock(&cxla_ram_live_lock);
	cxla_ram_live = true;
	spin_unlock(&cxla_ram_live_lock);
	return 0;
}

/* After every device is gone: no migration takes pages any more */
void cxla_ram_reserve_exit(void)
{
	int nid;

	/* a parameter write until the module's files go cannot queue it again */
	spin_lock(&cxla_ram_live_lock);
	cxla_ram_live = false;
	spin_unlock(&cxla_ram_live_lock);
	shrinker_free(cxla_ram_shrinker);
	cancel_delayed_work_sync(&cxla_ram_refill_work);
	for (nid = 0; nid < nr_node_ids; nid++)
		cxla_ram_node_free(&cxla_ram_nodes[nid], ULONG_MAX);
	kfree(cxla_ram_nodes);
	cxla_ram_nodes = NULL;
}

/* ------------------------------------------------ one window's pages */

static void cxla_ram_blocks_alloc(struct cxla_ram_blocks *rb)
{
	unsigned int i;

	while ((i = atomic_inc_return(&rb->next) - 1) < rb->n) {
		rb->run[i].p = cxla_block_alloc(rb->nid, rb->order,
						CXLA_BLOCK_GFP);
		rb->run[i].n = rb->run[i].p ? 1U << rb->order : 0;
	}
}

static void cxla_ram_blocks_help(struct work_struct *work)
{
	struct cxla_ram_blocks *rb = container_of(work, struct cxla_ram_blocks,
						  work);

	cxla_ram_blocks_alloc(rb);
	complete(&rb->helped);
}

/* The pages for npages destinations in vma (none: page by page) */
void cxla_ram_blocks_get(struct cxla_ram_blocks *rb, unsigned long npages,
			 struct vm_area_struct *vma)
{
	unsigned long n2m = npages / CXLA_BLOCK_PAGES;
	unsigned int nr, blocks, missing;

	rb->n = 0;
	rb->cur = 0;
	rb->used = 0;
	if (!npages || vma_policy(vma) || current->mempolicy)
		return;
	rb->nid = numa_mem_id();	/* where the default policy allocates */
	nr = 0;
	blocks = 0;
	/* what the task's cpuset allows (the allocations below keep to it) */
	if (node_isset(rb->nid, cpuset_current_mems_allowed))
		nr = cxla_ram_reserve_take(rb->nid, rb->run, npages, &blocks);
	rb->n = nr;
	missing = n2m - blocks;
	if (!missing)
		return;
	if (blocks || missing > 1) {
		rb->order = CXLA_RESERVE_ORDER;
	} else {	/* a single 2 MiB: a 1 MiB half on each CPU */
		rb->order = CXLA_RESERVE_ORDER - 1;
		missing = 2;
	}
	atomic_set(&rb->next, nr);
	rb->n = nr + missing;
	if (missing < 2 || num_online_cpus() < 2) {
		cxla_ram_blocks_alloc(rb);
		return;
	}
	INIT_WORK_ONSTACK(&rb->work, cxla_ram_blocks_help);
	init_completion(&rb->helped);
	queue_work(cxla_wq, &rb->work);
	cxla_ram_blocks_alloc(rb);
	wait_for_completion(&rb->helped);
	destroy_work_on_stack(&rb->work);
}

/* The next page of the runs not handed out yet, or NULL */
static struct page *cxla_ram_blocks_next(struct cxla_ram_blocks *rb)
{
	for (; rb->cur < rb->n; rb->cur++, rb->used = 0)
		if (rb->used < rb->run[rb->cur].n)
			return rb->run[rb->cur].p + rb->used++;
	return NULL;
}

struct page *cxla_ram_page(struct cxla_ram_blocks *rb,
			   struct vm_area_struct *vma, unsigned long addr)
{
	return cxla_ram_blocks_next(rb) ?:
	       alloc_page_vma(GFP_HIGHUSER_MOVABLE, vma, addr);
}

/* The pages of the runs that were not handed out */
void cxla_ram_blocks_put(struct cxla_ram_blocks *rb)
{
	struct page *p;

	while ((p = cxla_ram_blocks_next(rb)))
		__free_page(p);
}
