// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: device memory as MEMORY_DEVICE_PRIVATE pages, on kernels with
 * CONFIG_DEVICE_PRIVATE, next to the coherent pages of devmem.c.
 *
 * A private page is device memory the CPU cannot address: the page table
 * entry of a process that has one is a device-private swap entry, and a
 * CPU access faults into migrate_to_ram(), which brings the page back to
 * system RAM through the device's DMA engine. Coherence is emulated by
 * moving pages back and forth, where coherent pages are simply shared.
 *
 * The kernel gives private pages struct pages in a free physical range
 * (request_free_mem_region()); their data lives in device memory: each
 * private page in use owns one page of the migration pool (pool.c) as its
 * backing store (zone_device_data), at whose device offset the engine
 * copies. The pagemap's owner is this device's own (unlike the coherent
 * pages, which all devices share): hmm_range_fault() and migration select
 * only this device's private pages, another device's are faulted back to
 * RAM first, as a real device's would be.
 */
#include <linux/highmem.h>
#include <linux/ioport.h>
#include <linux/memremap.h>
#include <linux/migrate.h>
#include <linux/mm.h>
#include <linux/slab.h>

#include "cxl_accel.h"
#include "compat.h"
#include "core.h"
#include "pool.h"
#include "private.h"

static bool cxla_private_memory = true;
module_param_named(private_memory, cxla_private_memory, bool, 0444);
MODULE_PARM_DESC(private_memory,
		 "Offer device memory as MEMORY_DEVICE_PRIVATE pages too, where the kernel has them (default on)");

/*
 * Where the device finds a page: this device's memory by offset (a private
 * page of it: its backing), anything else by guest-physical address
 * (another device's memory only with P2P; a NUMA-mode node is plain RAM).
 */
int cxla_page_dev_addr(struct cxla_dev *cd, struct page *page, u64 *addr,
		       u16 *space)
{
	if (cxla_page_is_priv(cd, page))
		page = cxla_priv_backing(page);
	*addr = page_to_phys(page);
	*space = CXLA_SPACE_GPA;
	switch (cxla_page_owner_dev(cd, page)) {
	case CXLA_ON_LOCAL:
		if (cd->mig->coherent) {
			*addr -= cd->devmem_gpa;
			*space = CXLA_SPACE_DEVMEM;
		}
		break;
	case CXLA_ON_PEER:
		if (!(cd->features & CXLA_F_P2P))
			return -EOPNOTSUPP;
		break;
	}
	return 0;
}

#ifdef CONFIG_DEVICE_PRIVATE

struct cxla_priv {
	struct cxla_dev *cd;
	cxla_priv_fault_t fault;	/* a CPU access (migrate.c) */
	struct dev_pagemap pgmap;	/* its owner: this structure */
	struct resource *res;
	unsigned long first_pfn;
	unsigned long npages;
	spinlock_t lock;		/* free, used, cursor */
	unsigned long *free;		/* bitmap: 1 = free */
	unsigned long used;
	unsigned long cursor;
};

static struct cxla_priv *cxla_page_priv(struct page *page)
{
	return container_of(cxla_page_pgmap(page), struct cxla_priv, pgmap);
}

bool cxla_page_is_priv(struct cxla_dev *cd, struct page *page)
{
	return cd->priv && is_device_private_page(page) &&
	       cxla_page_pgmap(page) == &cd->priv->pgmap;
}

void *cxla_priv_owner(struct cxla_dev *cd)
{
	return cd->priv;
}

/*
 * The pool page holding a private page's data. A 2 MiB private folio has a
 * whole pool chunk (512 contiguous pages) as its backing, named by the
 * head: a tail's own zone_device_data overlays folio fields.
 */
struct page *cxla_priv_backing(struct page *page)
{
	struct folio *folio = page_folio(page);
	struct page *first = folio->page.zone_device_data;

	if (!folio_test_large(folio) || !first)
		return page->zone_device_data;
	return pfn_to_page(page_to_pfn(first) + folio_page_idx(folio, page));
}

unsigned long cxla_priv_used(struct cxla_dev *cd)
{
	return cd->priv ? READ_ONCE(cd->priv->used) : 0;
}

/*
 * Whether the device memory holding a private page's data is poisoned (the
 * page is referenced, so its backing stays).
 */
bool cxla_priv_backing_poisoned(struct page *page)
{
	struct page *backing = cxla_priv_backing(page);

	return backing && cxla_mem_poisoned(page_to_phys(backing));
}

/*
 * Private pages of this device that a page table maps; with skip_poisoned,
 * not those whose backing is poisoned.
 */
unsigned long cxla_priv_mapped(struct cxla_dev *cd, bool skip_poisoned)
{
	struct cxla_priv *pv = cd->priv;
	unsigned long i, n = 0;

	if (!pv || !READ_ONCE(pv->used))
		return 0;
	for (i = 0; i < pv->npages; i++) {
		struct page *page = pfn_to_page(pv->first_pfn + i);

		if (page_ref_count(page) && folio_mapped(page_folio(page)) &&
		    !(skip_poisoned && cxla_priv_backing_poisoned(page)))
			n++;
		if (!(i % 4096))
			cond_resched();
	}
	return n;
}

/* The pfn range of this device's private pages: [*first, *last) */
void cxla_priv_pfns(struct cxla_dev *cd, unsigned long *first,
		    unsigned long *last)
{
	*first = cd->priv ? cd->priv->first_pfn : 0;
	*last = cd->priv ? cd->priv->first_pfn + cd->priv->npages : 0;
}

/*
 * Up to n private pages, each with a pool page as its backing store
 * (backing[i]); they come locked with refcount 1. Returns how many.
 */
unsigned long cxla_priv_get(struct cxla_dev *cd, unsigned long n,
			    struct page **pages, struct page **backing,
			    int *err)
{
	struct cxla_priv *pv = cd->priv;
	unsigned long got, i, bit;

	*err = 0;
	if (!pv) {
		*err = -EOPNOTSUPP;
		return 0;
	}
	got = cxla_pool_get(cd->mig, n, backing, err);
	for (i = 0; i < got; i++) {
		unlock_page(backing[i]);	/* storage, not a migration page */
		spin_lock(&pv->lock);
		bit = find_next_bit(pv->free, pv->npages, pv->cursor);
		if (bit >= pv->npages)
			bit = find_first_bit(pv->free, pv->npages);
		if (WARN_ON_ONCE(bit >= pv->npages)) {
			spin_unlock(&pv->lock);
			break;
		}
		__clear_bit(bit, pv->free);
		pv->cursor = bit + 1;
		pv->used++;
		spin_unlock(&pv->lock);
		pages[i] = pfn_to_page(pv->first_pfn + bit);
		cxla_zone_device_page_init(pages[i], &pv->pgmap);
		pages[i]->zone_device_data = backing[i];
	}
	while (got > i)		/* no private page for them (cannot happen) */
		put_page(backing[--got]);
	return got;
}

#ifdef CXLA_PRIVATE_THP
static bool cxla_private_thp = true;
module_param_named(private_thp, cxla_private_thp, bool, 0644);
MODULE_PARM_DESC(private_thp,
		 "Move 2 MiB transparent huge pages to private device memory whole (off: the kernel splits them)");

/*
 * A 2 MiB private folio, locked with refcount 1, backed by a whole pool
 * chunk (*first: 512 contiguous pool pages, each holding a reference for
 * the folio). NULL when there is none to be had: the caller splits.
 */
struct page *cxla_priv_get_huge(struct cxla_dev *cd, struct page **first)
{
	struct cxla_priv *pv = cd->priv;
	unsigned long bit, i;
	struct page *head;

	if (!pv || !READ_ONCE(cxla_private_thp))
		return NULL;
	*first = cxla_pool_get_chunk(cd->mig);
	if (!*first)
		return NULL;
	spin_lock(&pv->lock);
	/* naturally aligned, as a PMD mapping needs */
	for (bit = 0; bit + CXLA_THP_NR <= pv->npages; bit += CXLA_THP_NR)
		if (find_next_zero_bit(pv->free, bit + CXLA_THP_NR, bit) >=
		    bit + CXLA_THP_NR)
			break;
	if (bit + CXLA_THP_NR > pv->npages) {
		spin_unlock(&pv->lock);
		for (i = 0; i < CXLA_THP_NR; i++)
			put_page(pfn_to_page(page_to_pfn(*first) + i));
		return NULL;
	}
	bitmap_clear(pv->free, bit, CXLA_THP_NR);
	pv->used += CXLA_THP_NR;
	spin_unlock(&pv->lock);
	for (i = 0; i < CXLA_THP_NR; i++)	/* storage, not migration pages */
		unlock_page(pfn_to_page(page_to_pfn(*first) + i));
	/* aligned: never the tail of an earlier folio */
	head = pfn_to_page(pv->first_pfn + bit);
	zone_device_folio_init(page_folio(head), &pv->pgmap, HPAGE_PMD_ORDER);
	head->zone_device_data = *first;
	return head;
}

/*
 * The kernel splits a 2 MiB private folio (a partial unmap, mprotect or a
 * migration that could not keep it whole): each new folio gets its share
 * of the backing chunk, and what the kernel leaves to us.
 */
static void cxla_priv_folio_split(struct folio *head, struct folio *tail)
{
	struct page *first = head->page.zone_device_data;

	if (!tail)		/* done: the head keeps the chunk's first page */
		return;
	tail->pgmap = head->pgmap;
	tail->mapping = head->mapping;
	tail->page.zone_device_data = first ?
		pfn_to_page(page_to_pfn(first) + folio_pfn(tail) - folio_pfn(head)) :
		NULL;
}
#endif

/*
 * The last reference to a private folio went: its pfns and its backing go
 * back (all 512 of a 2 MiB folio).
 */
static void cxla_priv_page_free(struct page *page)
{
	struct cxla_priv *pv = cxla_page_priv(page);
	unsigned long n = folio_nr_pages(page_folio(page)), i, flags;
	struct page *backing = page->zone_device_data;

	page->zone_device_data = NULL;
	spin_lock_irqsave(&pv->lock, flags);
	bitmap_set(pv->free, page_to_pfn(page) - pv->first_pfn, n);
	pv->used -= n;
	spin_unlock_irqrestore(&pv->lock, flags);
	if (backing)
		for (i = 0; i < n; i++)
			put_page(pfn_to_page(page_to_pfn(backing) + i));
}

CXLA_DECLARE_PAGEMAP_FREE(cxla_priv_page_free)

/*
 * A CPU access to a private page: the migration layer brings it back to
 * system RAM (the handler cxla_priv_init() was given, migrate.c).
 */
static vm_fault_t cxla_priv_migrate_to_ram(struct vm_fault *vmf)
{
	struct cxla_priv *pv = cxla_page_priv(vmf->page);

	return pv->fault(pv->cd, vmf);
}

static const struct dev_pagemap_ops cxla_priv_ops = {
	CXLA_PAGEMAP_FREE(cxla_priv_page_free),
	.migrate_to_ram = cxla_priv_migrate_to_ram,
#ifdef CXLA_PRIVATE_THP
	.folio_split = cxla_priv_folio_split,
#endif
};

/*
 * Probe, after device memory: a private page for every device page; fault
 * brings one back to RAM when the CPU touches it.
 */
int cxla_priv_init(struct cxla_dev *cd, cxla_priv_fault_t fault)
{
	struct cxla_priv *pv;
	void *addr;
	int ret;

	if (!cxla_private_memory || !cd->mig->coherent)
		return 0;
	pv = kzalloc(sizeof(*pv), GFP_KERNEL);
	if (!pv)
		return -ENOMEM;
	pv->cd = cd;
	pv->fault = fault;
	spin_lock_init(&pv->lock);
	pv->npages = cd->devmem_size >> PAGE_SHIFT;
	pv->free = bitmap_zalloc(pv->npages, GFP_KERNEL);
	if (!pv->free) {
		ret = -ENOMEM;
		goto err_free;
	}
	bitmap_fill(pv->free, pv->npages);
	pv->res = request_free_mem_region(&iomem_resource, cd->devmem_size,
					  "cxl-accel private");
	if (IS_ERR(pv->res)) {
		ret = PTR_ERR(pv->res);
		goto err_free;
	}
	pv->pgmap.type = MEMORY_DEVICE_PRIVATE;
	pv->pgmap.range.start = pv->res->start;
	pv->pgmap.range.end = pv->res->end;
	pv->pgmap.nr_range = 1;
	pv->pgmap.ops = &cxla_priv_ops;
	pv->pgmap.owner = pv;
	addr = memremap_pages(&pv->pgmap, dev_to_node(&cd->dev));
	if (IS_ERR(addr)) {
		ret = PTR_ERR(addr);
		goto err_release;
	}
	pv->first_pfn = PHYS_PFN(pv->res->start);
	cd->priv = pv;
	return 0;

err_release:
	release_mem_region(pv->res->start, resource_size(pv->res));
err_free:
	bitmap_free(pv->free);
	kfree(pv);
	dev_warn(&cd->dev, "no private device memory (%d): coherent only\n",
		 ret);
	return 0;	/* coherent memory works without it */
}

/* Removal, after eviction: no private page is in use any more. */
void cxla_priv_teardown(struct cxla_dev *cd)
{
	struct cxla_priv *pv = cd->priv;

	if (!pv)
		return;
	if (READ_ONCE(pv->used))
		dev_warn(&cd->dev,
			 "%lu private pages still in use: removal waits for them\n",
			 READ_ONCE(pv->used));
	memunmap_pages(&pv->pgmap);
	release_mem_region(pv->res->start, resource_size(pv->res));
	bitmap_free(pv->free);
	/* HMM_INFO of a file still open reads the count under this lock */
	spin_lock_irq(&cd->mig->lock);
	cd->priv = NULL;
	spin_unlock_irq(&cd->mig->lock);
	kfree(pv);
}

#endif /* CONFIG_DEVICE_PRIVATE */
