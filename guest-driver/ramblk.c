// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: system RAM destination pages of migrations back to RAM.
 *
 * A window with at least 2 MiB to move takes its destinations from 2 MiB
 * blocks (1 MiB ones for a single 2 MiB) split into single pages: a few
 * allocations instead of one per page, and physically contiguous
 * destinations the device copies in large pieces. The kernel zeroes every
 * new page (init_on_alloc, on by default in distributions), which costs as
 * much as the rest of a move back to RAM, so the allocation is taken off
 * the migrating task where it can be:
 *  - a reserve of 2 MiB blocks per NUMA node (ram_reserve_mb), filled by a
 *    work item once migrations pause, hands out ready blocks; a shrinker
 *    gives them back to the kernel under memory pressure;
 *  - what the reserve lacks, this CPU and a helper on another allocate at
 *    once.
 * A vma or task with a memory policy, which the blocks would not follow,
 * gets its pages one by one from alloc_page_vma().
 */
#include <linux/gfp.h>
#include <linux/mempolicy.h>
#include <linux/mm.h>
#include <linux/moduleparam.h>
#include <linux/nodemask.h>
#include <linux/shrinker.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/topology.h>

#include "devmem.h"
#include "ramblk.h"

/* no reclaim for blocks: a window can take single pages instead */
#define CXLA_BLOCK_GFP(gfp)	(((gfp) & ~__GFP_DIRECT_RECLAIM) | \
				 __GFP_NORETRY | __GFP_NOWARN)
/*
 * The reserve's blocks are not movable: held for long, they would stand in
 * the way of whoever must empty ZONE_MOVABLE or a CMA area.
 */
#define CXLA_RESERVE_GFP	(CXLA_BLOCK_GFP(GFP_HIGHUSER) | __GFP_THISNODE)
#define CXLA_RESERVE_ORDER	(21 - PAGE_SHIFT)	/* 2 MiB blocks */
#define CXLA_RESERVE_MAX	32			/* per node: 64 MiB */

static unsigned int cxla_ram_reserve_mb = 16;
module_param_named(ram_reserve_mb, cxla_ram_reserve_mb, uint, 0644);
MODULE_PARM_DESC(ram_reserve_mb,
		 "System RAM per NUMA node kept allocated for migrations back to RAM, in 2 MiB blocks (0 = none, at most 64; a change applies from the next such migration)");

struct cxla_ram_node {
	spinlock_t lock;
	unsigned int n;
	bool used;		/* a migration took blocks here: keep it filled */
	struct page *blk[CXLA_RESERVE_MAX];
};

static struct cxla_ram_node *cxla_ram_nodes;	/* nr_node_ids of them */
static atomic_long_t cxla_ram_held;		/* pages in the reserve */
static atomic_long_t cxla_ram_taken;		/* blocks migrations took */
static atomic_long_t cxla_ram_missed;		/* blocks the reserve lacked */
static struct shrinker *cxla_ram_shrinker;

static void cxla_ram_refill(struct work_struct *work);
static DECLARE_DELAYED_WORK(cxla_ram_refill_work, cxla_ram_refill);

/*
 * The refill waits until migrations pause this long: its zeroing would
 * compete with them for CPUs (measured: a refill started at once made a
 * 2 MiB move back slower than no reserve at all).
 */
#define CXLA_REFILL_QUIET_MS	20

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

static void cxla_block_free(struct page *p, unsigned int order)
{
	unsigned int i;

	for (i = 0; i < 1U << order; i++)
		__free_page(p + i);
}

/* One block out of node nid's reserve, or NULL */
static struct page *cxla_ram_reserve_pop(struct cxla_ram_node *rn)
{
	struct page *p = NULL;

	spin_lock(&rn->lock);
	if (rn->n)
		p = rn->blk[--rn->n];
	spin_unlock(&rn->lock);
	if (p)
		atomic_long_sub(1L << CXLA_RESERVE_ORDER, &cxla_ram_held);
	return p;
}

/* Up to want blocks of node nid's reserve into blk; how many it had */
static unsigned int cxla_ram_reserve_take(int nid, struct page **blk,
					  unsigned int want)
{
	struct cxla_ram_node *rn;
	unsigned int got = 0;

	if (!cxla_ram_nodes)
		return 0;
	rn = &cxla_ram_nodes[nid];
	spin_lock(&rn->lock);
	while (got < want && rn->n)
		blk[got++] = rn->blk[--rn->n];
	rn->used = true;
	spin_unlock(&rn->lock);
	atomic_long_sub((long)got << CXLA_RESERVE_ORDER, &cxla_ram_held);
	atomic_long_add(got, &cxla_ram_taken);
	atomic_long_add(want - got, &cxla_ram_missed);
	if (cxla_ram_target())
		mod_delayed_work(system_unbound_wq, &cxla_ram_refill_work,
				 msecs_to_jiffies(CXLA_REFILL_QUIET_MS));
	return got;
}

/*
 * Fills every used node's reserve up to ram_reserve_mb and trims the ones
 * above it. Allocations do not reclaim: under memory pressure the reserve
 * stays short rather than pushing out other memory.
 */
static void cxla_ram_refill(struct work_struct *work)
{
	unsigned int target = cxla_ram_target();
	int nid;

	for_each_node_state(nid, N_MEMORY) {
		struct cxla_ram_node *rn = &cxla_ram_nodes[nid];
		struct page *p;
		bool more;

		for (;;) {
			spin_lock(&rn->lock);
			p = rn->n > target ? rn->blk[--rn->n] : NULL;
			more = rn->used && rn->n < target;
			spin_unlock(&rn->lock);
			if (p) {
				atomic_long_sub(1L << CXLA_RESERVE_ORDER,
						&cxla_ram_held);
				cxla_block_free(p, CXLA_RESERVE_ORDER);
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
				cxla_block_free(p, CXLA_RESERVE_ORDER);
				break;
			}
			atomic_long_add(1L << CXLA_RESERVE_ORDER, &cxla_ram_held);
		}
	}
}

unsigned long cxla_ram_reserve_pages(void)
{
	return max_t(long, atomic_long_read(&cxla_ram_held), 0);
}

void cxla_ram_reserve_stats(struct cxla_ram_stats *st)
{
	st->pages = cxla_ram_reserve_pages();
	st->taken = atomic_long_read(&cxla_ram_taken);
	st->missed = atomic_long_read(&cxla_ram_missed);
}

static unsigned long cxla_ram_count(struct shrinker *s,
				    struct shrink_control *sc)
{
	return cxla_ram_reserve_pages() ?: SHRINK_EMPTY;
}

static unsigned long cxla_ram_scan(struct shrinker *s,
				   struct shrink_control *sc)
{
	unsigned long freed = 0;
	int nid;

	for_each_node_state(nid, N_MEMORY) {
		struct page *p;

		while (freed < sc->nr_to_scan &&
		       (p = cxla_ram_reserve_pop(&cxla_ram_nodes[nid]))) {
			cxla_block_free(p, CXLA_RESERVE_ORDER);
			freed += 1UL << CXLA_RESERVE_ORDER;
		}
	}
	return freed ?: SHRINK_STOP;
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
	cxla_ram_shrinker = shrinker_alloc(0, "cxl_accel-ram-reserve");
	if (!cxla_ram_shrinker) {
		kfree(cxla_ram_nodes);
		cxla_ram_nodes = NULL;
		return -ENOMEM;
	}
	cxla_ram_shrinker->count_objects = cxla_ram_count;
	cxla_ram_shrinker->scan_objects = cxla_ram_scan;
	shrinker_register(cxla_ram_shrinker);
	return 0;
}

/* After every device is gone: no migration takes blocks any more */
void cxla_ram_reserve_exit(void)
{
	int nid;

	shrinker_free(cxla_ram_shrinker);
	cancel_delayed_work_sync(&cxla_ram_refill_work);
	for (nid = 0; nid < nr_node_ids; nid++) {
		struct page *p;

		while ((p = cxla_ram_reserve_pop(&cxla_ram_nodes[nid])))
			cxla_block_free(p, CXLA_RESERVE_ORDER);
	}
	kfree(cxla_ram_nodes);
	cxla_ram_nodes = NULL;
}

/* ------------------------------------------------ one window's blocks */

static void cxla_ram_blocks_alloc(struct cxla_ram_blocks *rb)
{
	unsigned int i;

	while ((i = atomic_inc_return(&rb->next) - 1) < rb->n)
		rb->blk[i] = cxla_block_alloc(rb->nid, rb->order,
					      CXLA_BLOCK_GFP(GFP_HIGHUSER_MOVABLE));
}

static void cxla_ram_blocks_help(struct work_struct *work)
{
	struct cxla_ram_blocks *rb = container_of(work, struct cxla_ram_blocks,
						  work);

	cxla_ram_blocks_alloc(rb);
	complete(&rb->helped);
}

/* The blocks for npages destinations in vma (none: page by page) */
void cxla_ram_blocks_get(struct cxla_ram_blocks *rb, unsigned long npages,
			 struct vm_area_struct *vma)
{
	unsigned long n2m = npages >> (21 - PAGE_SHIFT);
	unsigned int taken;

	rb->n = 0;
	rb->cur = 0;
	rb->used = 0;
	if (!n2m || vma_policy(vma) || current->mempolicy)
		return;
	rb->nid = numa_mem_id();	/* where the default policy allocates */
	taken = cxla_ram_reserve_take(rb->nid, rb->blk, n2m);
	if (taken || n2m > 1) {
		rb->order = 21 - PAGE_SHIFT;
		rb->n = n2m;
	} else {	/* a single 2 MiB: a 1 MiB half on each CPU */
		rb->order = 20 - PAGE_SHIFT;
		rb->n = 2;
	}
	atomic_set(&rb->next, taken);
	if (rb->n - taken < 2 || num_online_cpus() < 2) {
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

/* The next page of the blocks not handed out yet, or NULL */
static struct page *cxla_ram_blocks_next(struct cxla_ram_blocks *rb)
{
	for (; rb->cur < rb->n; rb->cur++, rb->used = 0)
		if (rb->blk[rb->cur] && rb->used < (1U << rb->order))
			return rb->blk[rb->cur] + rb->used++;
	return NULL;
}

struct page *cxla_ram_page(struct cxla_ram_blocks *rb,
			   struct vm_area_struct *vma, unsigned long addr)
{
	return cxla_ram_blocks_next(rb) ?:
	       alloc_page_vma(GFP_HIGHUSER_MOVABLE, vma, addr);
}

/* The pages of the blocks that were not handed out */
void cxla_ram_blocks_put(struct cxla_ram_blocks *rb)
{
	struct page *p;

	while ((p = cxla_ram_blocks_next(rb)))
		__free_page(p);
}
