// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: migration of process memory between system RAM and device
 * memory (MIGRATE_TO_DEV, MIGRATE_TO_RAM), and the migration counters.
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
 * The page copy engine is in xcopy.c, the page pool in pool.c, eviction in
 * evict.c, the RAM destinations of moves back in ramblk.c.
 */
#include <linux/delay.h>
#include <linux/highmem.h>
#include <linux/hmm.h>
#include <linux/mmu_notifier.h>
#include <linux/memremap.h>
#include <linux/migrate.h>
#include <linux/mm.h>
#include <linux/mmap_lock.h>
#include <linux/pagemap.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "cxl_accel.h"
#include "compat.h"
#include "core.h"
#include "devmem.h"
#include "migrate.h"
#include "pool.h"
#include "private.h"
#include "ramblk.h"

/* ------------------------------------------------ migrate_vma ranges */

/*
 * A window of at most this many pages is copied by the CPU: the device's
 * round trip (a command, an interrupt, a wake-up) costs more than the copy
 * there. Device memory is mapped in the kernel (coherent pages, and the
 * backing of private ones), so the CPU reads and writes it in place. The
 * default stays below the break-even measured with hmm-bench --sweep (docs/
 * device-and-driver.md): a CPU copy takes guest CPU time the engine would
 * spare. 0: the device copies everything.
 */
static unsigned int cxla_cpu_copy_pages = 64;
module_param_named(cpu_copy_pages, cxla_cpu_copy_pages, uint, 0644);
MODULE_PARM_DESC(cpu_copy_pages,
		 "Migrations of at most this many pages per window are copied by the CPU instead of the DMA engine (0 = never)");

/*
 * A check of the device's copies, for debugging a device model or the
 * driver: after each window's copy, before the kernel maps the new pages,
 * the CPU compares every destination with its source (both are mapped in
 * the kernel, and the source is unmapped from processes then, so it cannot
 * change). A difference is counted (copy_mismatches in sysfs) and logged.
 */
static bool cxla_verify_copies;
module_param_named(verify_copies, cxla_verify_copies, bool, 0644);
MODULE_PARM_DESC(verify_copies,
		 "Compare every migrated page with its source before it is mapped (debugging; costs a CPU read of both)");

void cxla_mig_ctx_free(struct cxla_mig_ctx *x)
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

int cxla_mig_ctx_alloc(struct cxla_mig_ctx *x, unsigned long npages)
{
	x->src = kvmalloc_array(npages, sizeof(*x->src), GFP_KERNEL);
	x->dst = kvmalloc_array(npages, sizeof(*x->dst), GFP_KERNEL);
	x->xp = kvmalloc_array(npages, sizeof(*x->xp), GFP_KERNEL);
	x->pages = kvmalloc_array(2 * npages, sizeof(*x->pages), GFP_KERNEL);
	x->cap = npages;
	if (!x->src || !x->dst || !x->xp || !x->pages) {
		cxla_mig_ctx_free(x);
		return -ENOMEM;
	}
	return 0;
}

/* A page of this device to bring back: coherent, or private (x->priv) */
static bool cxla_mig_ours(struct cxla_mig_ctx *x, struct page *page)
{
	struct cxla_dev *cd = x->mig->cd;

	return x->priv ? cxla_page_is_priv(cd, page) : cxla_page_is_ours(cd, page);
}

/*
 * A source page on poisoned device memory: its data cannot be read, so the
 * page stays where it is (counted as busy and as poisoned). With
 * cpu_fallback (removal, a CPU fault) the caller handles it: removal must
 * move every page (the device copy fails, the CPU copies), a fault on a
 * private page checked its backing first.
 */
static bool cxla_mig_poisoned(struct cxla_mig_ctx *x, struct page *src)
{
	if (x->cpu_fallback || !cxla_mem_poisoned(page_to_phys(src)))
		return false;
	x->res->busy++;
	x->res->poisoned++;
	atomic64_inc(&x->mig->stat[CXLA_MS_POISON_SKIPPED]);
	return true;
}

/*
 * Where the pages found in a window go. Fills x->xp[] (source, space) and
 * returns how many move; counts the others in x->res.
 */
#ifdef CXLA_PRIVATE_THP
/*
 * A 2 MiB folio (or hole) offered whole (MIGRATE_PFN_COMPOUND): compound
 * windows are one aligned 2 MiB, so it is the window's only entry, and its
 * 512 pages are copied as one group. To the device: a system THP or a
 * hole; to RAM: one of our private folios.
 */
static unsigned long cxla_mig_select_huge(struct cxla_mig_ctx *x,
					  const struct migrate_vma *args)
{
	struct cxla_dev *cd = x->mig->cd;
	struct cxl_accel_migrate *res = x->res;
	unsigned long s = args->src[0], pfn, j;
	struct page *sp = migrate_pfn_to_page(s);
	bool to_dev = x->mode == CXLA_MIG_TO_DEV;

	memset(args->dst, 0, args->npages * sizeof(*args->dst));
	if (!(s & MIGRATE_PFN_MIGRATE)) {
		res->busy += CXLA_THP_NR;
		return 0;
	}
	if (to_dev && sp && !PageAnon(sp)) {
		res->refused += CXLA_THP_NR;
		return 0;
	}
	if (!to_dev && (!sp || !cxla_page_is_priv(cd, sp))) {
		res->busy += CXLA_THP_NR;
		return 0;
	}
	pfn = sp ? page_to_pfn(sp) : 0;
	for (j = 0; j < CXLA_THP_NR; j++) {
		struct cxla_xpage *e = &x->xp[j];

		memset(e, 0, sizeof(*e));
		e->idx = j;
		if (to_dev) {
			e->spage = sp ? pfn_to_page(pfn + j) : NULL;
			e->zero = !sp;
			e->src = sp ? page_to_phys(e->spage) : 0;
			e->sspace = CXLA_SPACE_GPA;
			e->dspace = CXLA_SPACE_DEVMEM;
		} else {
			e->spage = cxla_priv_backing(pfn_to_page(pfn + j));
			e->src = page_to_phys(e->spage) - cd->devmem_gpa;
			e->sspace = CXLA_SPACE_DEVMEM;
			e->dspace = CXLA_SPACE_GPA;
		}
	}
	x->huge = true;
	return CXLA_THP_NR;
}
#endif

static unsigned long cxla_mig_select(struct cxla_mig_ctx *x,
				     struct vm_area_struct *vma,
				     const struct migrate_vma *args)
{
	struct cxla_dev *cd = x->mig->cd;
	struct cxl_accel_migrate *res = x->res;
	bool to_dev = x->mode == CXLA_MIG_TO_DEV;
	unsigned long i, nx = 0;

	x->huge = false;
	x->huge_dst = NULL;
#ifdef CXLA_PRIVATE_THP
	if (x->compound && args->npages == CXLA_THP_NR &&
	    (args->src[0] & MIGRATE_PFN_COMPOUND))
		return cxla_mig_select_huge(x, args);
#endif

	for (i = 0; i < args->npages; i++) {
		unsigned long s = args->src[i];
		struct page *sp = migrate_pfn_to_page(s);
		struct cxla_xpage *e = &x->xp[nx];
		int where;

		args->dst[i] = 0;
		if (x->mode == CXLA_MIG_EVICT) {
			/* only this device's pages; the rest stays as it is */
			if (!sp || !cxla_mig_ours(x, sp))
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
		if (!to_dev && x->priv) {
			/* this device's private page: its data is in the backing */
			if (cxla_mig_poisoned(x, cxla_priv_backing(sp)))
				continue;
			e->spage = cxla_priv_backing(sp);
			e->src = page_to_phys(e->spage) - cd->devmem_gpa;
			e->sspace = CXLA_SPACE_DEVMEM;
			e->dspace = CXLA_SPACE_GPA;
			nx++;
			continue;
		}
		/* evicting: ours, also once removal took it off the list */
		where = x->mode == CXLA_MIG_EVICT ? CXLA_ON_LOCAL :
			cxla_page_owner_dev(cd, sp);
		if (where != CXLA_ON_RAM && !(to_dev && where == CXLA_ON_LOCAL &&
					      !x->priv) &&
		    cxla_mig_poisoned(x, sp))
			continue;
		if (to_dev) {
			if (where == CXLA_ON_LOCAL && !x->priv) {
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
			if (where == CXLA_ON_LOCAL) {	/* coherent to private */
				e->src -= cd->devmem_gpa;
				e->sspace = CXLA_SPACE_DEVMEM;
			}
			e->dspace = CXLA_SPACE_DEVMEM;
		} else {
			if (where == CXLA_ON_RAM) {	/* another kind of device page */
				res->busy++;
				continue;
			}
			if (where == CXLA_ON_PEER && x->local_only) {
				res->already++;	/* stays on the other device */
				continue;
			}
			if (where == CXLA_ON_PEER && !(cd->features & CXLA_F_P2P)) {
				res->busy++;
				continue;
			}
			e->src = page_to_phys(sp);
			e->sspace = CXLA_SPACE_GPA;
			if (where == CXLA_ON_LOCAL) {
				e->src -= cd->devmem_gpa;
				e->sspace = CXLA_SPACE_DEVMEM;
			}
			e->dspace = CXLA_SPACE_GPA;
		}
		nx++;
	}
	return nx;
}

static unsigned long cxla_mig_dst_pages(struct cxla_mig_ctx *x,
					struct vm_area_struct *vma,
					unsigned long start, unsigned long nx,
					int *err);

/*
 * Whether this destination allocation fails on purpose: the next one after
 * test_hmm's FAIL_ALLOC, once. It fails as a real one would, so the caller
 * takes its usual way out (a 2 MiB group falls back to single pages).
 */
static bool cxla_mig_alloc_fails(struct cxla_mig_ctx *x)
{
	bool fail = x->fail_alloc;

	x->fail_alloc = false;
	return fail;
}

#ifdef CXLA_PRIVATE_THP
/*
 * Destination of a 2 MiB group: one folio (a private 2 MiB folio backed by
 * a whole pool chunk, or a RAM THP), else 512 single pages and the kernel
 * splits the source; all 512 or none (the kernel takes no part of a group).
 */
static unsigned long cxla_mig_dst_huge(struct cxla_mig_ctx *x,
				       struct vm_area_struct *vma,
				       unsigned long start, unsigned long nx,
				       int *err)
{
	struct cxla_dev *cd = x->mig->cd;
	struct folio *folio = NULL;
	struct page *head, *first;
	unsigned long j, got;

	x->huge_dst = NULL;
	if (x->mode == CXLA_MIG_TO_DEV) {
		head = cxla_mig_alloc_fails(x) ? NULL :
		       cxla_priv_get_huge(cd, &first);
		if (head) {
			folio = page_folio(head);
			for (j = 0; j < nx; j++) {
				struct cxla_xpage *e = &x->xp[j];

				e->dpage = pfn_to_page(page_to_pfn(head) + j);
				e->dstore = pfn_to_page(page_to_pfn(first) + j);
				e->dst = page_to_phys(e->dstore) - cd->devmem_gpa;
			}
		}
	} else if (!cxla_mig_alloc_fails(x)) {
		folio = vma_alloc_folio(GFP_TRANSHUGE_LIGHT | __GFP_NOWARN,
					HPAGE_PMD_ORDER, vma, start);
		if (folio) {
			folio_lock(folio);
			for (j = 0; j < nx; j++) {
				x->xp[j].dpage = folio_page(folio, j);
				x->xp[j].dst = page_to_phys(x->xp[j].dpage);
			}
		}
	}
	if (folio) {
		x->huge_dst = folio;
		return nx;
	}
	got = cxla_mig_dst_pages(x, vma, start, nx, err);
	if (got == nx)
		return nx;
	for (j = 0; j < got; j++) {
		unlock_page(x->xp[j].dpage);
		put_page(x->xp[j].dpage);
	}
	x->res->busy += got;
	return 0;
}
#endif

/* Destination pages for the nx pages selected, locked, refcount 1. */
static unsigned long cxla_mig_dst(struct cxla_mig_ctx *x,
				  struct vm_area_struct *vma,
				  unsigned long start, unsigned long nx, int *err)
{
#ifdef CXLA_PRIVATE_THP
	if (x->huge)
		return cxla_mig_dst_huge(x, vma, start, nx, err);
#endif
	return cxla_mig_dst_pages(x, vma, start, nx, err);
}

static unsigned long cxla_mig_dst_pages(struct cxla_mig_ctx *x,
					struct vm_area_struct *vma,
					unsigned long start, unsigned long nx,
					int *err)
{
	struct cxla_mig *mig = x->mig;
	struct cxl_accel_migrate *res = x->res;
	struct cxla_ram_blocks rb;
	unsigned long i, got;

	/*
	 * The first page's destination fails (FAIL_ALLOC): it stays for now,
	 * busy as after any failed allocation, and a later pass moves it.
	 */
	if (nx && cxla_mig_alloc_fails(x)) {
		res->busy++;
		*err = -ENOMEM;
		nx--;
		memmove(x->xp, x->xp + 1, nx * sizeof(*x->xp));
	}
	if (x->mode == CXLA_MIG_TO_DEV) {
		/* private: x->pages get the backing pages, which the device writes */
		struct page **privp = x->pages + x->cap;

		if (x->priv)
			got = cxla_priv_get(mig->cd, nx, privp, x->pages, err);
		else
			got = cxla_pool_get(mig, nx, x->pages, err);
		if (got < nx) {
			if (*err == -ENOSPC)
				res->no_space += nx - got;
			else
				res->busy += nx - got;
		}
		for (i = 0; i < got; i++) {
			struct cxla_xpage *e = &x->xp[i];

			e->dpage = x->priv ? privp[i] : x->pages[i];
			e->dstore = x->priv ? x->pages[i] : NULL;
			e->dst = page_to_phys(x->pages[i]) - mig->cd->devmem_gpa;
		}
		return got;
	}
	cxla_ram_blocks_get(&rb, nx, vma);
	for (i = 0, got = 0; i < nx; i++) {
		struct cxla_xpage *e = &x->xp[i];
		struct page *dp;

		dp = cxla_ram_page(&rb, vma, start + (e->idx << PAGE_SHIFT));
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
	cxla_ram_blocks_put(&rb);
	return got;
}

/*
 * A 2 MiB group that does not move: its destinations (one huge folio or
 * 512 pages) are released and nothing of the group is migrated.
 */
static void cxla_mig_drop_group(struct cxla_mig_ctx *x,
				const struct migrate_vma *args, unsigned long nx)
{
	unsigned long i;

	if (x->huge_dst) {
		folio_unlock(x->huge_dst);
		folio_put(x->huge_dst);
		x->huge_dst = NULL;
	} else {
		for (i = 0; i < nx; i++) {
			unlock_page(x->xp[i].dpage);
			put_page(x->xp[i].dpage);
			x->xp[i].dpage = NULL;
		}
	}
	memset(args->dst, 0, args->npages * sizeof(*args->dst));
}

/*
 * Copy the pages: by the device (failed ones get ->failed and lose their
 * destination, which a quarantined command may still write); towards RAM
 * with cpu_fallback (eviction, CPU faults), also by the CPU (into new
 * pages), since device memory is still mapped in the kernel.
 */
#ifdef CXLA_PRIVATE_THP
/*
 * A 2 MiB group's copy: one failed piece fails the group, whose destination
 * a quarantined command may still write. To RAM with cpu_fallback, the CPU
 * copies all of it into a new 2 MiB folio, else into 512 new pages (the
 * kernel then splits the source, which it cannot do while a CPU fault holds
 * it: that access gets SIGBUS).
 */
static int cxla_mig_copy_huge(struct cxla_mig_ctx *x,
			      const struct migrate_vma *args, unsigned long nx)
{
	unsigned long i, failed = 0;
	struct folio *folio;
	struct page *dp;
	int ret = 0;

	if (x->dma)
		ret = cxla_xcopy(x->mig, x->xp, nx, x->timeout_ms, x->intr);
	for (i = 0; i < nx; i++)
		failed += !x->dma || x->xp[i].failed;
	if (!failed)
		return ret;
	cxla_mig_drop_group(x, args, nx);
	if (!x->cpu_fallback || x->mode == CXLA_MIG_TO_DEV)
		goto busy;
	folio = vma_alloc_folio(GFP_TRANSHUGE_LIGHT | __GFP_NOWARN,
				HPAGE_PMD_ORDER, args->vma, args->start);
	if (folio) {
		folio_lock(folio);
		for (i = 0; i < nx; i++) {
			x->xp[i].dpage = folio_page(folio, i);
			x->xp[i].failed = false;
			copy_highpage(x->xp[i].dpage, x->xp[i].spage);
		}
		x->huge_dst = folio;	/* the window maps it whole */
		args->dst[0] = migrate_pfn(folio_pfn(folio)) |
			       MIGRATE_PFN_COMPOUND;
		x->cpu_copied += nx;
		return ret;
	}
	for (i = 0; i < nx; i++) {
		dp = alloc_page(GFP_HIGHUSER_MOVABLE | __GFP_NOWARN);
		if (!dp)
			break;
		lock_page(dp);
		x->xp[i].dpage = dp;
	}
	if (i < nx) {
		while (i--) {
			unlock_page(x->xp[i].dpage);
			put_page(x->xp[i].dpage);
		}
		goto busy;
	}
	for (i = 0; i < nx; i++) {
		struct cxla_xpage *e = &x->xp[i];

		copy_highpage(e->dpage, e->spage);
		e->failed = false;
		args->dst[e->idx] = migrate_pfn(page_to_pfn(e->dpage));
	}
	x->cpu_copied += nx;
	return ret;
busy:
	x->res->busy += nx;
	return ret;
}
#endif

/* The CPU copies a small window (cxla_cpu_copy_pages); nothing can fail. */
static void cxla_mig_cpu_copy(struct cxla_mig_ctx *x, unsigned long nx)
{
	unsigned long i;

	for (i = 0; i < nx; i++) {
		struct cxla_xpage *e = &x->xp[i];
		struct page *d = e->dstore ?: e->dpage;

		if (e->zero)
			clear_highpage(d);
		else
			copy_highpage(d, e->spage);
	}
	atomic64_add(nx, &x->mig->stat[CXLA_MS_CPU_COPIED]);
}

static int cxla_mig_copy(struct cxla_mig_ctx *x, const struct migrate_vma *args,
			 unsigned long nx)
{
	struct cxla_mig *mig = x->mig;
	unsigned long i;
	int ret = 0;

#ifdef CXLA_PRIVATE_THP
	if (x->huge)
		return cxla_mig_copy_huge(x, args, nx);
#endif
	/* eviction moves whole address spaces: the device's work */
	if (x->dma && x->mode != CXLA_MIG_EVICT && nx &&
	    nx <= READ_ONCE(cxla_cpu_copy_pages)) {
		cxla_mig_cpu_copy(x, nx);
		return 0;
	}

	if (x->dma)
		ret = cxla_xcopy(mig, x->xp, nx, x->timeout_ms, x->intr);
	else
		for (i = 0; i < nx; i++)
			x->xp[i].failed = true;
	for (i = 0; i < nx; i++) {
		struct cxla_xpage *e = &x->xp[i];
		struct page *dp;

		if (!e->failed)
			continue;
		if (x->dma) {
			/* the failed command keeps its own reference */
			args->dst[e->idx] = 0;
			unlock_page(e->dpage);
			put_page(e->dpage);
			e->dpage = NULL;
			if (!x->cpu_fallback || x->mode == CXLA_MIG_TO_DEV) {
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

/* Does the destination of e hold what its source does? */
static bool cxla_mig_copied(const struct cxla_xpage *e)
{
	void *dv = kmap_local_page(e->dstore ?: e->dpage), *sv;
	bool same;

	if (e->zero) {
		same = !memchr_inv(dv, 0, PAGE_SIZE);
	} else {
		sv = kmap_local_page(e->spage);
		same = !memcmp(sv, dv, PAGE_SIZE);
		kunmap_local(sv);
	}
	kunmap_local(dv);
	return same;
}

/*
 * verify_copies: a destination unlike its source is not mapped (the page
 * stays where it was, counted as busy), so a wrong copy loses no data.
 */
static void cxla_mig_verify(struct cxla_mig_ctx *x,
			    const struct migrate_vma *args, unsigned long nx)
{
	struct cxla_mig *mig = x->mig;
	unsigned long i, bad = 0;

	for (i = 0; i < nx; i++) {
		struct cxla_xpage *e = &x->xp[i];

		if (!e->dpage || e->failed ||
		    (!x->huge_dst && !args->dst[e->idx]) || cxla_mig_copied(e))
			continue;
		bad++;
		dev_err_ratelimited(&mig->cd->dev,
				    "copy mismatch: mode %d page %lu of the window, pfn %#lx -> %#lx%s; the page stays\n",
				    x->mode, e->idx,
				    e->spage ? page_to_pfn(e->spage) : 0,
				    page_to_pfn(e->dstore ?: e->dpage),
				    e->zero ? " (zero fill)" : "");
		if (x->huge)
			continue;	/* the whole group, below */
		args->dst[e->idx] = 0;
		unlock_page(e->dpage);
		put_page(e->dpage);
		e->dpage = NULL;
		x->res->busy++;
	}
	if (!bad)
		return;
	atomic64_add(bad, &mig->stat[CXLA_MS_COPY_MISMATCH]);
	if (!x->huge)
		return;
	/* a 2 MiB group moves whole or not at all */
	cxla_mig_drop_group(x, args, nx);
	x->res->busy += nx;
}

/* Account a window's stages; t[] holds each stage's start time. */
static void cxla_mig_stages(struct cxla_mig_ctx *x, const u64 *t,
			    unsigned long moved)
{
	atomic64_t *row = x->mig->stage[x->mode + (x->priv ? 3 : 0)];
	u64 end = ktime_get_ns();
	int i;

	atomic64_inc(&row[CXLA_STAGE_WINDOWS]);
	atomic64_add(moved, &row[CXLA_STAGE_PAGES]);
	for (i = CXLA_STAGE_SETUP; i < CXLA_STAGE_COUNT; i++)
		atomic64_add((i + 1 < CXLA_STAGE_COUNT ? t[i + 1] : end) - t[i],
			     &row[i]);
}

#ifdef CONFIG_DEVICE_PRIVATE
/*
 * How many pages of [start, end) are this device's private pages already.
 * A migration to private memory selects system and coherent pages only
 * (one pagemap owner per migrate_vma), so ours come back as not selected,
 * like busy ones: a second look, selecting ours and moving nothing, tells
 * them apart.
 */
static unsigned long cxla_mig_own_private(struct cxla_mig_ctx *x,
					  struct vm_area_struct *vma,
					  unsigned long start, unsigned long end)
{
	struct cxla_dev *cd = x->mig->cd;
	struct migrate_vma args = {
		.vma = vma,
		.start = start,
		.end = end,
		.src = x->src,
		.dst = x->dst,
		.pgmap_owner = cxla_priv_owner(cd),
		.flags = MIGRATE_VMA_SELECT_DEVICE_PRIVATE,
	};
	unsigned long i, n = 0;
	struct page *p;

#ifdef CXLA_PRIVATE_THP
	if (x->compound)	/* else the look would split our folios */
		args.flags |= MIGRATE_VMA_SELECT_COMPOUND;
#endif
	if (migrate_vma_setup(&args))
		return 0;
	for (i = 0; i < args.npages; i++) {
		args.dst[i] = 0;
		p = migrate_pfn_to_page(args.src[i]);
		if (p && cxla_page_is_priv(cd, p))
			n += folio_nr_pages(page_folio(p));
	}
	migrate_vma_pages(&args);
	migrate_vma_finalize(&args);
	return n;
}
#endif

/*
 * Migrate one window [start, end) of one vma; mmap_lock is held for
 * reading. Updates the counters of x->res.
 */
int cxla_mig_window(struct cxla_mig_ctx *x, struct vm_area_struct *vma,
		    unsigned long start, unsigned long end)
{
	struct cxla_mig *mig = x->mig;
	struct cxl_accel_migrate *res = x->res;
	bool from_priv = x->priv && x->mode != CXLA_MIG_TO_DEV;
	struct migrate_vma args = {
		.vma = vma,
		.start = start,
		.end = end,
		.src = x->src,
		.dst = x->dst,
		/* all devices' coherent pages, or this device's private ones */
		.pgmap_owner = from_priv ? cxla_priv_owner(mig->cd) :
			       &cxla_pgmap_owner,
		.flags = from_priv ? MIGRATE_VMA_SELECT_DEVICE_PRIVATE :
			 x->mode != CXLA_MIG_TO_DEV ?
			 MIGRATE_VMA_SELECT_DEVICE_COHERENT :
			 x->system_only ? MIGRATE_VMA_SELECT_SYSTEM :
			 MIGRATE_VMA_SELECT_SYSTEM |
			 MIGRATE_VMA_SELECT_DEVICE_COHERENT,
		.fault_page = x->fault_page,
	};
#ifdef CXLA_PRIVATE_THP
	if (x->compound)
		args.flags |= MIGRATE_VMA_SELECT_COMPOUND;
#endif
	unsigned long i, nx, moved = 0, before = x->cpu_copied;
	u64 __maybe_unused busy = res->busy;
	int ret, err = 0;

	u64 t[CXLA_STAGE_COUNT];

	t[CXLA_STAGE_SETUP] = ktime_get_ns();
	ret = migrate_vma_setup(&args);
	if (ret)
		return ret;

	t[CXLA_STAGE_DEST] = ktime_get_ns();
	nx = cxla_mig_select(x, vma, &args);
	nx = cxla_mig_dst(x, vma, start, nx, &err);
	for (i = 0; i < nx; i++)
		args.dst[x->xp[i].idx] = migrate_pfn(page_to_pfn(x->xp[i].dpage));
#ifdef CXLA_PRIVATE_THP
	if (x->huge_dst) {	/* one folio: the group's first entry names it */
		memset(args.dst, 0, args.npages * sizeof(*args.dst));
		args.dst[0] = migrate_pfn(folio_pfn(x->huge_dst)) |
			      MIGRATE_PFN_COMPOUND;
	}
#endif
	t[CXLA_STAGE_COPY] = ktime_get_ns();
	ret = cxla_mig_copy(x, &args, nx);
	if (unlikely(READ_ONCE(cxla_verify_copies)))
		cxla_mig_verify(x, &args, nx);

	t[CXLA_STAGE_MIGRATE] = ktime_get_ns();
	migrate_vma_pages(&args);
#ifdef CXLA_PRIVATE_THP
	if (x->huge_dst) {
		if (args.src[0] & MIGRATE_PFN_MIGRATE)
			moved = nx;
		else
			res->busy += nx;	/* the kernel kept the old folio */
		nx = 0;
	}
#endif
	for (i = 0; i < nx; i++) {
		struct cxla_xpage *e = &x->xp[i];

		if (!args.dst[e->idx])
			continue;	/* counted as busy */
		if (!(args.src[e->idx] & MIGRATE_PFN_MIGRATE)) {
			res->busy++;	/* the kernel kept the old page */
			continue;
		}
		moved++;
	}
	t[CXLA_STAGE_FINALIZE] = ktime_get_ns();
	migrate_vma_finalize(&args);
	cxla_mig_stages(x, t, moved);
#ifdef CONFIG_DEVICE_PRIVATE
	if (x->priv && x->mode == CXLA_MIG_TO_DEV && res->busy > busy) {
		/* the pages this window just moved are ours now: not counted */
		unsigned long ours = cxla_mig_own_private(x, vma, start, end);
		u64 own = min_t(u64, res->busy - busy,
				ours > moved ? ours - moved : 0);

		res->busy -= own;
		res->already += own;
	}
#endif

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

bool cxla_vma_migratable(struct vm_area_struct *vma, bool to_dev)
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

#define CXLA_MIG_BUSY_PASSES	3	/* busy pages are looked at again */

/*
 * KSM pages never reach migrate_vma_setup() (issue 41). It unmaps what it
 * collects through the page table, but puts a page it did not move back
 * through the rmap, and a KSM page's rmap (its stable node's rmap_items)
 * need not list every address that maps it: ksmd drops an item when a scan
 * finds the address without a present page (an earlier migration's entry)
 * and adds it again a scan later, a fork's child is found through its
 * parent's item, a fresh merge maps the page before it appends the item.
 * A KSM page collected at such an address keeps a migration entry for a
 * page that is unlocked again: 6.12 BUGs at the next access
 * (migration_entry_wait_on_locked), 7.3 corrupts page state and rss
 * counters. Checking folio_test_ksm() after setup is too late.
 *
 * Only VM_MERGEABLE vmas hold KSM pages (unmerging clears the flag after
 * breaking every KSM page in the range). There, a window to the device is
 * migrated with the mmap_lock held for writing, which keeps ksmd from
 * merging in this mm (it merges under the read lock), in runs that leave
 * out the KSM pages a look at the page table (hmm_range_fault(), faulting
 * nothing) found. Moves back select device pages only: no KSM page there.
 */
struct cxla_ksm_guard {
	struct mmu_interval_notifier mni;	/* hmm_range_fault() needs one */
	unsigned long *ksm;	/* bitmap of a window: KSM page, or unknown */
	int state;		/* 0 not set up, 1 ready, <0 cannot look */
};

static bool cxla_ksm_invalidate(struct mmu_interval_notifier *mni,
				const struct mmu_notifier_range *range,
				unsigned long cur_seq)
{
	mmu_interval_set_seq(mni, cur_seq);
	return true;
}

static const struct mmu_interval_notifier_ops cxla_ksm_ops = {
	.invalidate = cxla_ksm_invalidate,
};

/* Before the first VM_MERGEABLE window of a pass (mmap_lock not held) */
static void cxla_ksm_guard_start(struct cxla_ksm_guard *g, struct mm_struct *mm,
				 unsigned long start, unsigned long end)
{
	if (g->state)
		return;
	g->ksm = bitmap_zalloc(CXLA_MIG_WINDOW, GFP_KERNEL);
	if (!g->ksm) {
		g->state = -ENOMEM;
		return;
	}
	g->state = mmu_interval_notifier_insert(&g->mni, mm, start, end - start,
						&cxla_ksm_ops) ?: 1;
}

static void cxla_ksm_guard_end(struct cxla_ksm_guard *g)
{
	if (g->state == 1)
		mmu_interval_notifier_remove(&g->mni);
	bitmap_free(g->ksm);
}

/*
 * Marks the KSM pages of [start, end) in g->ksm (the mmap_lock held for
 * writing: nothing becomes one meanwhile). Pages hmm_range_fault() does not
 * show present are not collected by migrate_vma_setup() either (holes are,
 * without a page to lock). An error: nothing could be looked at.
 */
static int cxla_ksm_scan(struct cxla_ksm_guard *g, unsigned long *pfns,
			 unsigned long start, unsigned long end)
{
	struct hmm_range range = {
		.notifier = &g->mni,
		.start = start,
		.end = end,
		.hmm_pfns = pfns,
		.default_flags = 0,	/* look, do not fault */
		.pfn_flags_mask = 0,
	};
	unsigned long i, n = (end - start) >> PAGE_SHIFT;
	int ret = -EBUSY, tries;

	if (g->state != 1)
		return g->state ?: -EINVAL;
	for (tries = 0; tries < 8 && ret == -EBUSY; tries++) {
		range.notifier_seq = mmu_interval_read_begin(&g->mni);
		ret = hmm_range_fault(&range);
	}
	if (ret)
		return ret;
	bitmap_zero(g->ksm, n);
	for (i = 0; i < n; i++) {
		struct page *page;

		if (!(pfns[i] & HMM_PFN_VALID))
			continue;
		page = hmm_pfn_to_page(pfns[i]);
		if (!is_zone_device_page(page) && folio_test_ksm(page_folio(page)))
			__set_bit(i, g->ksm);
	}
	return 0;
}

/*
 * A window of a VM_MERGEABLE vma to the device (mmap_lock held for
 * writing): its runs without KSM pages; the KSM pages are refused, as
 * they were once setup had collected them.
 */
static int cxla_mig_window_ksm(struct cxla_mig_ctx *x, struct cxla_ksm_guard *g,
			       struct vm_area_struct *vma, unsigned long start,
			       unsigned long end)
{
	unsigned long n = (end - start) >> PAGE_SHIFT, a, b;
	int ret;

	if (cxla_ksm_scan(g, x->src, start, end)) {
		x->res->refused += n;
		return 0;
	}
	for (a = 0; a < n; a = b) {
		if (test_bit(a, g->ksm)) {
			b = find_next_zero_bit(g->ksm, n, a);
			x->res->refused += b - a;
			continue;
		}
		b = find_next_bit(g->ksm, n, a);
		ret = cxla_mig_window(x, vma, start + (a << PAGE_SHIFT),
				      start + (b << PAGE_SHIFT));
		if (ret)
			return ret;
	}
	return 0;
}

static int cxla_mmap_lock(struct mm_struct *mm, bool write, bool intr)
{
	if (!write) {
		mmap_read_lock(mm);
		return 0;
	}
	if (intr)
		return mmap_write_lock_killable(mm);
	mmap_write_lock(mm);
	return 0;
}

static void cxla_mmap_unlock(struct mm_struct *mm, bool write)
{
	if (write)
		mmap_write_unlock(mm);
	else
		mmap_read_unlock(mm);
}

static int cxla_migrate_pass(struct cxla_mig_ctx *x, struct mm_struct *mm,
			     unsigned long start, unsigned long end);

/*
 * Migrate [start, end) of mm as x says (mode, priv, counters in x->res):
 * the core of the migration ioctls and of the test_hmm interface. The
 * whole range must be mapped (-EFAULT). The caller set up x's arrays.
 * Pages that were busy for a moment (locked, still in a CPU's LRU cache,
 * racing with another migration) are tried again: a later pass moves them
 * and counts nothing else again (what moved before is "already" there).
 */
int cxla_migrate_range(struct cxla_mig_ctx *x, struct mm_struct *mm,
		       unsigned long start, unsigned long end)
{
	struct cxl_accel_migrate *res = x->res, again;
	int ret, pass;

	ret = cxla_migrate_pass(x, mm, start, end);
	/* pages on poisoned memory stay busy: no use looking again for them */
	for (pass = 1; !ret && res->busy > res->poisoned &&
	     pass < CXLA_MIG_BUSY_PASSES; pass++) {
		/* in place after the passes so far: found so or moved */
		u64 known = res->migrated + res->already;

		/* whoever held them (an isolation, a CPU's LRU batch) goes on */
		usleep_range(500, 1000);
		memset(&again, 0, sizeof(again));
		x->res = &again;
		ret = cxla_migrate_pass(x, mm, start, end);
		x->res = res;
		res->migrated += again.migrated;
		/* the pass looked at every page not in place: the no-space ones too */
		res->no_space = again.no_space;
		/*
		 * A busy page is not identified (the kernel clears its entry):
		 * one that was in place all along shows up now as "already".
		 */
		if (again.already > known)
			res->already += again.already - known;
		res->busy = again.busy;
		res->poisoned = again.poisoned;
	}
	return ret;
}

static int cxla_migrate_pass(struct cxla_mig_ctx *x, struct mm_struct *mm,
			     unsigned long start, unsigned long end)
{
	struct cxla_mig *mig = x->mig;
	struct cxla_dev *cd = mig->cd;
	struct cxl_accel_migrate *res = x->res;
	bool to_dev = x->mode == CXLA_MIG_TO_DEV;
	/* compound windows are one aligned 2 MiB: a folio offered whole fills it */
	unsigned long addr, next, win = x->compound ? SZ_2M :
					CXLA_MIG_WINDOW << PAGE_SHIFT;
	struct cxla_ksm_guard ksm = { };
	struct vm_area_struct *vma;
	bool wlock = false, merge;
	int ret = 0;

again:
	down_read(&mig->sem);
	if (READ_ONCE(cd->dead) || READ_ONCE(mig->closed)) {
		ret = -ENODEV;
		goto out;
	}
	/* a function reset: device memory is out of reach until it ends */
	if (READ_ONCE(cd->resetting)) {
		up_read(&mig->sem);
		ret = cxla_reset_wait(cd, &cd->resetting);
		if (ret)
			return ret;
		goto again;
	}
	/* eviction must find this address space again */
	if (to_dev)
		cxla_pool_track_mm(mig, mm);
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
		ret = cxla_mmap_lock(mm, wlock, x->intr);
		if (ret)
			break;
		vma = find_vma(mm, addr);
		if (!vma || vma->vm_start >= end) {
			/* unmapped meanwhile */
			cxla_mmap_unlock(mm, wlock);
			res->refused += (end - addr) >> PAGE_SHIFT;
			break;
		}
		merge = to_dev && (vma->vm_flags & VM_MERGEABLE);
		if (merge && !wlock) {
			/* this window again, locked for writing */
			cxla_mmap_unlock(mm, false);
			cxla_ksm_guard_start(&ksm, mm, start, end);
			wlock = true;
			next = addr;
			continue;
		}
		if (vma->vm_start > addr) {
			res->refused += (vma->vm_start - addr) >> PAGE_SHIFT;
			addr = vma->vm_start;
		}
		next = min3(end, vma->vm_end, ALIGN_DOWN(addr, win) + win);
		if (!cxla_vma_migratable(vma, to_dev))
			res->refused += (next - addr) >> PAGE_SHIFT;
		else if (merge)
			ret = cxla_mig_window_ksm(x, &ksm, vma, addr, next);
		else
			ret = cxla_mig_window(x, vma, addr, next);
		cxla_mmap_unlock(mm, wlock);
		/* the vma's next window is mergeable too */
		wlock = merge && next < vma->vm_end;
		if (ret)
			break;
		cond_resched();
	}
	cxla_ksm_guard_end(&ksm);
out:
	up_read(&mig->sem);
	return ret;
}

long cxla_ioc_migrate(struct cxla_file *cf, void __user *arg, bool to_dev)
{
	struct cxla_dev *cd = cf->dev;
	struct cxla_mig *mig = cd->mig;
	struct cxla_mig_ctx x = {
		.mig = mig,
		.mode = to_dev ? CXLA_MIG_TO_DEV : CXLA_MIG_TO_RAM,
		.intr = true,
		.dma = true,
	};
	struct cxl_accel_migrate m;
	int ret, i;

	if (copy_from_user(&m, arg, sizeof(m)))
		return -EFAULT;
	for (i = 0; i < ARRAY_SIZE(m.reserved); i++)
		if (m.reserved[i])
			return -EINVAL;
	if ((m.flags & ~CXL_ACCEL_MIGRATE_PRIVATE) || !m.len ||
	    !PAGE_ALIGNED(m.addr) || !PAGE_ALIGNED(m.len) ||
	    m.addr + m.len < m.addr || m.addr + m.len > TASK_SIZE)
		return -EINVAL;
	if (!mig->coherent)
		return -EOPNOTSUPP;	/* NUMA mode: move_pages()/mbind() */
	x.priv = m.flags & CXL_ACCEL_MIGRATE_PRIVATE;
#ifdef CXLA_PRIVATE_THP
	x.compound = x.priv && to_dev;	/* 2 MiB folios go whole */
#endif
	if (x.priv && !cd->priv)
		return -EOPNOTSUPP;	/* no CONFIG_DEVICE_PRIVATE */
	if (!current->mm)
		return -EINVAL;
	m.migrated = 0;
	m.already = 0;
	m.refused = 0;
	m.busy = 0;
	m.no_space = 0;
	m.poisoned = 0;
	x.res = &m;
	/* mmap_lock is held while the device copies: bounded well below hung-task */
	x.timeout_ms = min_t(u32, m.timeout_ms ?: READ_ONCE(cxla_cmd_timeout_ms),
			     CXLA_MIG_MAX_TIMEOUT_MS);
	ret = cxla_mig_ctx_alloc(&x, min(m.len >> PAGE_SHIFT, CXLA_MIG_WINDOW));
	if (ret)
		return ret;
	ret = cxla_migrate_range(&x, current->mm, m.addr, m.addr + m.len);
	cxla_mig_ctx_free(&x);
	if (ret)
		return ret;
	return copy_to_user(arg, &m, sizeof(m)) ? -EFAULT : 0;
}

/* ------------------------------------------- CPU faults on private pages */

#ifdef CONFIG_DEVICE_PRIVATE
#ifdef CXLA_PRIVATE_THP
/* A CPU access to a PMD-mapped 2 MiB private folio: all of it comes back. */
static vm_fault_t cxla_mig_priv_fault_huge(struct cxla_dev *cd,
					   struct vm_fault *vmf)
{
	unsigned long start = ALIGN_DOWN(vmf->address, HPAGE_PMD_SIZE);
	struct cxl_accel_migrate res = { };
	struct cxla_mig_ctx x = {
		.mig = cd->mig,
		.mode = CXLA_MIG_TO_RAM,
		.priv = true,
		.compound = true,
		.fault_page = vmf->page,
		.timeout_ms = min_t(u32, READ_ONCE(cxla_cmd_timeout_ms),
				    CXLA_MIG_MAX_TIMEOUT_MS),
		.dma = !READ_ONCE(cd->stopped),
		.cpu_fallback = true,
		.res = &res,
	};
	int ret;

	if (cxla_mig_ctx_alloc(&x, CXLA_THP_NR))
		return VM_FAULT_OOM;
	atomic64_inc(&cd->mig->stat[CXLA_MS_CPU_FAULTS]);
	ret = cxla_mig_window(&x, vmf->vma, start, start + HPAGE_PMD_SIZE);
	cxla_mig_ctx_free(&x);
	/* a failed device copy the CPU made up for is no failure of the access */
	return ret && !res.migrated ? VM_FAULT_SIGBUS : 0;
}
#endif

/*
 * A CPU access to a private page of cd: bring it back to system RAM, by DMA
 * (by the CPU, from the backing page, if the device does not answer), the
 * private pagemap's migrate_to_ram() (private.c). Called with the mmap_lock
 * held: takes no lock that a migration ioctl holds while it waits for the
 * mmap_lock.
 */
vm_fault_t cxla_mig_priv_fault(struct cxla_dev *cd, struct vm_fault *vmf)
{
	unsigned long addr = vmf->address & PAGE_MASK, src = 0, dst = 0;
	struct cxl_accel_migrate res = { };
	struct cxla_xpage xp;
	struct page *pg[2];
	struct cxla_mig_ctx x = {
		.mig = cd->mig,
		.mode = CXLA_MIG_TO_RAM,
		.priv = true,
		.fault_page = vmf->page,
		.src = &src,
		.dst = &dst,
		.xp = &xp,
		.pages = pg,
		.cap = 1,
		.timeout_ms = min_t(u32, READ_ONCE(cxla_cmd_timeout_ms),
				    CXLA_MIG_MAX_TIMEOUT_MS),
		.dma = !READ_ONCE(cd->stopped),
		.cpu_fallback = true,
		.res = &res,
	};

#ifdef CXLA_PRIVATE_THP
	/* a PMD maps it (no pte): the folio moves whole */
	if (folio_test_large(page_folio(vmf->page)) && !vmf->pte)
		return cxla_mig_priv_fault_huge(cd, vmf);
#endif
	atomic64_inc(&cd->mig->stat[CXLA_MS_CPU_FAULTS]);
	/*
	 * Its data is on poisoned memory: the access cannot be satisfied, as
	 * a machine check on real memory would say. The page stays private;
	 * once the range is cleared the next access brings it back.
	 */
	if (cxla_priv_backing_poisoned(vmf->page)) {
		cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_HWPOISON);
		return VM_FAULT_HWPOISON;
	}
	if (cxla_mig_window(&x, vmf->vma, addr, addr + PAGE_SIZE) && !res.migrated)
		return VM_FAULT_SIGBUS;
	/* not moved (busy): the access faults again */
	return 0;
}
#endif /* CONFIG_DEVICE_PRIVATE */

/* ------------------------------------------------------ info, ioctls */

static void cxla_hmm_info(struct cxla_dev *cd, struct cxl_accel_hmm_info *h)
{
	struct cxla_mig *mig = cd->mig;

	memset(h, 0, sizeof(*h));
	h->flags = mig->coherent ? CXL_ACCEL_HMM_COHERENT : 0;
	if (cd->features & CXL_ACCEL_F_NUMA)
		h->flags |= CXL_ACCEL_HMM_NUMA;
	if (cd->priv)
		h->flags |= CXL_ACCEL_HMM_PRIVATE;
	h->numa_node = mig->node;
	h->mem_start = mig->mem_start;
	h->mem_size = mig->mem_end ? mig->mem_end - mig->mem_start : 0;
	h->chunk_size = CXLA_CHUNK_SIZE;
	spin_lock_irq(&mig->lock);
	/* removal frees the private pool under this lock (an open file asks) */
	h->private_pages = cxla_priv_used(cd);
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
	h->cpu_faults = atomic64_read(&mig->stat[CXLA_MS_CPU_FAULTS]);
	cxla_pool_poison_info(mig, h);
}

long cxla_ioc_hmm_info(struct cxla_file *cf, void __user *arg)
{
	struct cxl_accel_hmm_info h;
	int ret;

	/* chunks emptied by munmap or exit go back first: exact counts */
	ret = cxla_pool_settle(cf->dev, true);
	if (ret)
		return ret;
	cxla_hmm_info(cf->dev, &h);
	return copy_to_user(arg, &h, sizeof(h)) ? -EFAULT : 0;
}

static ssize_t migration_show(struct device *dev, struct device_attribute *attr,
			      char *buf)
{
	struct cxl_accel_hmm_info h;
	struct cxla_ram_stats rs;

	cxla_hmm_info(to_cxla_dev(dev), &h);
	cxla_ram_reserve_stats(&rs);
	return sysfs_emit(buf,
			  "mode %s%s\nnuma_node %d\npool_chunks %llu\npool_pages_used %llu\npool_pages_free %llu\nmigrated_to_dev %llu\nmigrated_to_ram %llu\nevicted %llu\ncpu_evicted %llu\ncopy_commands %llu\ncopy_failures %llu\nsvm_faults %llu\nsvm_retries %llu\nsvm_mirror_hits %llu\nsvm_invalidations %llu\nsvm_invalidate_waits %llu\nsvm_mirrors %llu\nprivate_pages %llu\ncpu_faults %llu\npool_pages_poisoned %llu\npoison_skipped %llu\ncpu_copied %llu\ncopy_mismatches %llu\nram_reserve_pages %lu\nram_reserve_taken %lu\nram_reserve_missed %lu\n",
			  h.flags & CXL_ACCEL_HMM_NUMA ? "numa" :
			  h.flags & CXL_ACCEL_HMM_COHERENT ? "coherent" : "none",
			  h.flags & CXL_ACCEL_HMM_PRIVATE ? " private" : "",
			  h.numa_node, h.pool_chunks, h.pool_pages_used,
			  h.pool_pages_free, h.migrated_to_dev, h.migrated_to_ram,
			  h.evicted, h.cpu_evicted, h.copy_commands,
			  h.copy_failures, h.svm_faults, h.svm_retries,
			  h.svm_mirror_hits, h.svm_invalidations,
			  h.svm_invalidate_waits, h.svm_mirrors, h.private_pages,
			  h.cpu_faults, h.pool_pages_poisoned, h.poison_skipped,
			  (u64)atomic64_read(&to_cxla_dev(dev)->mig->stat[CXLA_MS_CPU_COPIED]),
			  (u64)atomic64_read(&to_cxla_dev(dev)->mig->stat[CXLA_MS_COPY_MISMATCH]),
			  rs.pages, rs.taken, rs.missed);
}
static DEVICE_ATTR_RO(migration);

/*
 * Where migration time goes, one line per kind of window (coherent or
 * private memory, to the device, to RAM, eviction): windows, pages moved,
 * and nanoseconds in each stage, summed. Differences between two reads
 * give a run's figures (hmm-bench prints them per page).
 */
static ssize_t migration_stages_show(struct device *dev,
				     struct device_attribute *attr, char *buf)
{
	static const char *const kinds[CXLA_STAGE_KINDS] = {
		"coherent_to_dev", "coherent_to_ram", "coherent_evict",
		"private_to_dev", "private_to_ram", "private_evict",
	};
	struct cxla_mig *mig = to_cxla_dev(dev)->mig;
	int k, n = 0;

	for (k = 0; k < CXLA_STAGE_KINDS; k++) {
		atomic64_t *row = mig->stage[k];

		n += sysfs_emit_at(buf, n,
				   "%s windows %lld pages %lld setup_ns %lld destination_ns %lld copy_ns %lld migrate_ns %lld finalize_ns %lld\n",
				   kinds[k], atomic64_read(&row[CXLA_STAGE_WINDOWS]),
				   atomic64_read(&row[CXLA_STAGE_PAGES]),
				   atomic64_read(&row[CXLA_STAGE_SETUP]),
				   atomic64_read(&row[CXLA_STAGE_DEST]),
				   atomic64_read(&row[CXLA_STAGE_COPY]),
				   atomic64_read(&row[CXLA_STAGE_MIGRATE]),
				   atomic64_read(&row[CXLA_STAGE_FINALIZE]));
	}
	return n;
}
static DEVICE_ATTR_RO(migration_stages);

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
	&dev_attr_migration_stages.attr,
	NULL,
};

const struct attribute_group cxla_mig_group = {
	.attrs = cxla_mig_attrs,
};

