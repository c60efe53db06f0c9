/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: one spelling for the kernel interfaces that changed between
 * the kernels the driver supports (Debian's 6.12 and 7.x). Kbuild finds
 * the CXLA_HAVE_* ones in the headers it builds against.
 */
#ifndef CXLA_COMPAT_H
#define CXLA_COMPAT_H

#include <linux/dma-buf.h>
#include <linux/fs.h>
#include <linux/hmm.h>
#include <linux/memremap.h>
#include <linux/migrate.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/rmap.h>
#include <linux/version.h>

/*
 * The kernel's PCI P2PDMA provider for a BAR and its DMA-BUF helper (7.x with
 * CONFIG_PCI_P2PDMA): importers get bus addresses the standard way, with
 * pci_p2pdma_distance() deciding who may.
 */
#if defined(CXLA_HAVE_P2P_PROVIDER) && IS_ENABLED(CONFIG_PCI_P2PDMA)
#define CXLA_P2P_PROVIDER
#endif

/*
 * Device-private transparent huge pages (7.x): migrate_vma moves a 2 MiB
 * folio whole, and the pagemap is told when the kernel splits one.
 */
#if defined(CXLA_HAVE_MIGRATE_COMPOUND) && defined(CONFIG_DEVICE_PRIVATE) && \
	defined(CONFIG_TRANSPARENT_HUGEPAGE)
#define CXLA_PRIVATE_THP
#define CXLA_THP_NR	HPAGE_PMD_NR
#endif

/*
 * hmm_range_fault(), corrected: it fills the entries of a device-private
 * PMD with the folio's pfns counted from where the range starts, not from
 * the PMD (7.3), so a range that begins inside the 2 MiB gets the wrong
 * pages. The folio is 2 MiB aligned: each entry's page follows from its
 * address.
 */
static inline void cxla_hmm_fix_private_pmd(struct hmm_range *range)
{
#ifdef CXLA_PRIVATE_THP
	unsigned long i, h, pfn, n = (range->end - range->start) >> PAGE_SHIFT;

	for (i = 0; i < n; i++) {
		h = range->hmm_pfns[i];
		if (!(h & HMM_PFN_VALID) ||
		    hmm_pfn_to_map_order(h) < HPAGE_PMD_ORDER)
			continue;
		pfn = h & ~HMM_PFN_FLAGS;
		if (!is_device_private_page(pfn_to_page(pfn)))
			continue;
		pfn = ALIGN_DOWN(pfn, HPAGE_PMD_NR) +
		      (((range->start >> PAGE_SHIFT) + i) & (HPAGE_PMD_NR - 1));
		range->hmm_pfns[i] = (h & HMM_PFN_FLAGS) | pfn;
	}
#endif
}

static inline int cxla_hmm_range_fault(struct hmm_range *range)
{
	int ret = hmm_range_fault(range);

	if (!ret)
		cxla_hmm_fix_private_pmd(range);
	return ret;
}

/*
 * hmm_range_fault_unlocked_timeout() (7.3): takes the mmap_lock itself and
 * lets a fault handler drop it (userfaultfd), refreshing the notifier
 * sequence when it does; corrected as above.
 */
#ifdef CXLA_HAVE_HMM_FAULT_UNLOCKED
#define CXLA_HMM_FAULT_UNLOCKED
static inline int cxla_hmm_range_fault_unlocked(struct hmm_range *range,
						unsigned long timeout)
{
	int ret = hmm_range_fault_unlocked_timeout(range, timeout);

	if (!ret)
		cxla_hmm_fix_private_pmd(range);
	return ret;
}
#endif

/* symbol namespaces are string literals from 6.13 */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
#define CXLA_IMPORT_NS(ns)	MODULE_IMPORT_NS(#ns)
#else
#define CXLA_IMPORT_NS(ns)	MODULE_IMPORT_NS(ns)
#endif

/* the pagemap of a ZONE_DEVICE page: a folio field after 6.14 */
static inline struct dev_pagemap *cxla_page_pgmap(struct page *page)
{
#ifdef CXLA_HAVE_PAGE_PGMAP
	return page_pgmap(page);
#else
	return page->pgmap;
#endif
}

/* hand out a free device page: refcount 1, locked */
static inline void cxla_zone_device_page_init(struct page *page,
					      struct dev_pagemap *pgmap)
{
#ifdef CXLA_HAVE_ZDPI_PGMAP
	zone_device_page_init(page, pgmap, 0);
#else
	zone_device_page_init(page);
#endif
}

/*
 * dev_pagemap_ops: page_free(page), later folio_free(folio). Our pages are
 * order 0: CXLA_PAGEMAP_FREE(fn) sets up a void fn(struct page *) for both,
 * after CXLA_DECLARE_PAGEMAP_FREE(fn).
 */
#ifdef CXLA_HAVE_FOLIO_FREE
#define CXLA_DECLARE_PAGEMAP_FREE(fn)					\
static void fn##_folio(struct folio *folio)				\
{									\
	fn(&folio->page);						\
}
#define CXLA_PAGEMAP_FREE(fn)	.folio_free = fn##_folio
#else
#define CXLA_DECLARE_PAGEMAP_FREE(fn)
#define CXLA_PAGEMAP_FREE(fn)	.page_free = fn
#endif

/* a dynamic importer's "the exporter moved or revoked the buffer" */
#ifdef CXLA_HAVE_INVALIDATE_MAPPINGS
#define cxla_dma_buf_invalidate(dmabuf)	dma_buf_invalidate_mappings(dmabuf)
#define CXLA_ATTACH_INVALIDATE(fn)	.invalidate_mappings = fn
#else
#define cxla_dma_buf_invalidate(dmabuf)	dma_buf_move_notify(dmabuf)
#define CXLA_ATTACH_INVALIDATE(fn)	.move_notify = fn
#endif

/*
 * Make the page at addr device-exclusive (for device atomics): returns it
 * locked and referenced, or an error pointer (-EOPNOTSUPP without
 * CONFIG_DEVICE_PRIVATE, which the kernel needs for it).
 */
static inline struct page *cxla_make_exclusive(struct mm_struct *mm,
					       unsigned long addr, void *owner)
{
#if defined(CXLA_HAVE_MAKE_DEVICE_EXCLUSIVE)
	struct folio *folio;

	return make_device_exclusive(mm, addr, owner, &folio);
#elif defined(CONFIG_DEVICE_PRIVATE)
	struct vm_area_struct *vma = vma_lookup(mm, addr);
	unsigned long huge = ALIGN_DOWN(addr, PMD_SIZE);
	struct page *page;
	int tries, n;

	/*
	 * The range call gives no page for a part of a large folio, and its
	 * FOLL_SPLIT_PMD leaves the folio whole: split a THP that may be
	 * there first. A migration's look at the page splits it (nothing
	 * moves: no destination is given). Not where KSM merges: a KSM page
	 * must never reach migrate_vma_setup() (migrate.c), and KSM splits
	 * the THPs it merges anyway.
	 */
	if (vma && vma_is_anonymous(vma) && !(vma->vm_flags & VM_MERGEABLE) &&
	    huge >= vma->vm_start &&
	    huge + PMD_SIZE <= vma->vm_end) {
		unsigned long src = 0, dst = 0;
		struct migrate_vma args = {
			.vma = vma,
			.start = addr,
			.end = addr + PAGE_SIZE,
			.src = &src,
			.dst = &dst,
			.flags = MIGRATE_VMA_SELECT_SYSTEM,
		};

		if (!migrate_vma_setup(&args)) {
			migrate_vma_pages(&args);
			migrate_vma_finalize(&args);
		}
	}

	/*
	 * Before make_device_exclusive() (6.15) the range call only trylocks
	 * the folio and gives no page when that fails, e.g. while a CPU thread
	 * faults the page back from an earlier exclusive entry: try again a
	 * while.
	 */
	for (tries = 0; tries < 1000; tries++) {
		page = NULL;
		n = make_device_exclusive_range(mm, addr, addr + PAGE_SIZE,
						&page, owner);
		if (n < 0)
			return ERR_PTR(n);
		if (n == 1 && page)
			return page;
		cond_resched();
	}
	return ERR_PTR(-EBUSY);
#else
	return ERR_PTR(-EOPNOTSUPP);
#endif
}

/* a reference on a file that may be in its last fput: false then */
static inline bool cxla_file_tryget(struct file *file)
{
#ifdef CXLA_HAVE_FILE_REF
	return file_ref_get(&file->f_ref);
#else
	return atomic_long_inc_not_zero(&file->f_count);
#endif
}

#endif /* CXLA_COMPAT_H */
