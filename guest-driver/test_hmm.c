// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: the interface of the kernel's test_hmm module on top of
 * cxl-accel devices, so that the kernel's own HMM selftests
 * (tools/testing/selftests/mm/hmm-tests.c) run unmodified against them.
 * Loaded with test_hmm=1, the driver creates /dev/hmm_dmirror0..3:
 *
 *   hmm_dmirror0, 1: cxl-accel0, 1 with device-private pages (private.c,
 *                    kernels with CONFIG_DEVICE_PRIVATE; without it they
 *                    mirror system memory only: migration -EOPNOTSUPP)
 *   hmm_dmirror2, 3: cxl-accel0, 1 with coherent pages (devmem.c)
 *
 * Each open file is a "device mirror" of the opening process as test_hmm
 * defines it: a device page table (virtual page -> page, with write and
 * atomic tags) filled by hmm_range_fault() and emptied by an interval
 * notifier on every invalidation. The work behind each ioctl is the
 * device's: READ and WRITE are copies by its DMA engine between the
 * mirrored pages and a bounce buffer, MIGRATE_TO_DEV and MIGRATE_TO_SYS
 * are migrations through the engine (migrate.c), SNAPSHOT reads the CPU
 * page table as the device would, EXCLUSIVE takes pages for device atomics
 * (make_device_exclusive()), RELEASE evicts the device's memory. The
 * counters mean what test_hmm means by them: cpages, the pages a command
 * handled; faults, the device page table misses that needed
 * hmm_range_fault().
 *
 * Kernels with device-private huge pages (7.x): migrations of the private
 * mirrors move 2 MiB folios whole, both ways, as test_hmm's do, and
 * SNAPSHOT reports their PMD mappings. FLAGS sets the file's flags:
 * FAIL_ALLOC makes the next destination allocation of its migrations fail
 * (a huge page then falls back to single pages, the kernel splitting it; a
 * single page is tried again, as after any failed allocation, where
 * test_hmm leaves it behind). READ_UNLOCKED is READ with the mmap_lock
 * taken inside the fault, which may drop it (a userfaultfd handler
 * resolving the fault), where the kernel can do that
 * (hmm_range_fault_unlocked_timeout(), 7.3); without it the ioctl is
 * unknown, as in test_hmm of those kernels. test_hmm's FAIL_ALLOC also
 * covers CPU faults on the pages a file migrated; here it covers the
 * file's own migrations only (CPU faults are the device's, not a file's).
 *
 * The UAPI (lib/test_hmm_uapi.h) is the kernel's: its structure and
 * numbers are written out here, as every user of an ioctl interface does.
 */
#include <linux/cdev.h>
#include <linux/hmm.h>
#include <linux/highmem.h>
#include <linux/mm.h>
#include <linux/mmap_lock.h>
#include <linux/mmu_notifier.h>
#include <linux/module.h>
#include <linux/rmap.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/xarray.h>

#include "cxl_accel.h"
#include "cdev.h"
#include "compat.h"
#include "core.h"
#include "devmem.h"
#include "evict.h"
#include "migrate.h"
#include "pool.h"
#include "private.h"
#include "svm.h"
#include "test_hmm.h"

static bool cxla_test_hmm;
module_param_named(test_hmm, cxla_test_hmm, bool, 0444);
MODULE_PARM_DESC(test_hmm,
		 "Offer the test_hmm interface (/dev/hmm_dmirror0..3) on cxl-accel0 and 1, for the kernel's HMM selftests");

/* lib/test_hmm_uapi.h */
struct hmm_dmirror_cmd {
	__u64 addr;
	__u64 ptr;
	__u64 npages;
	__u64 cpages;
	__u64 faults;
};

#define HMM_DMIRROR_READ		_IOWR('H', 0x00, struct hmm_dmirror_cmd)
#define HMM_DMIRROR_WRITE		_IOWR('H', 0x01, struct hmm_dmirror_cmd)
#define HMM_DMIRROR_MIGRATE_TO_DEV	_IOWR('H', 0x02, struct hmm_dmirror_cmd)
#define HMM_DMIRROR_MIGRATE_TO_SYS	_IOWR('H', 0x03, struct hmm_dmirror_cmd)
#define HMM_DMIRROR_SNAPSHOT		_IOWR('H', 0x04, struct hmm_dmirror_cmd)
#define HMM_DMIRROR_EXCLUSIVE		_IOWR('H', 0x05, struct hmm_dmirror_cmd)
#define HMM_DMIRROR_CHECK_EXCLUSIVE	_IOWR('H', 0x06, struct hmm_dmirror_cmd)
#define HMM_DMIRROR_RELEASE		_IOWR('H', 0x07, struct hmm_dmirror_cmd)
#define HMM_DMIRROR_FLAGS		_IOWR('H', 0x08, struct hmm_dmirror_cmd)
#define HMM_DMIRROR_READ_UNLOCKED	_IOWR('H', 0x09, struct hmm_dmirror_cmd)

enum {
	HMM_DMIRROR_PROT_ERROR			= 0xFF,
	HMM_DMIRROR_PROT_NONE			= 0x00,
	HMM_DMIRROR_PROT_READ			= 0x01,
	HMM_DMIRROR_PROT_WRITE			= 0x02,
	HMM_DMIRROR_PROT_PMD			= 0x04,
	HMM_DMIRROR_PROT_PUD			= 0x08,
	HMM_DMIRROR_PROT_ZERO			= 0x10,
	HMM_DMIRROR_PROT_DEV_PRIVATE_LOCAL	= 0x20,
	HMM_DMIRROR_PROT_DEV_PRIVATE_REMOTE	= 0x30,
	HMM_DMIRROR_PROT_DEV_COHERENT_LOCAL	= 0x40,
	HMM_DMIRROR_PROT_DEV_COHERENT_REMOTE	= 0x50,
};

#define CXLA_DMIRRORS		4	/* 0, 1 private; 2, 3 coherent */
#define CXLA_DMIRROR_BATCH	64	/* pages per fault or device command */
#define CXLA_DMIRROR_TRIES	3	/* map-and-read rounds after a migration */
#define CXLA_DPT_WRITE		1UL	/* xarray pointer tags */
#define CXLA_DPT_ATOMIC		2UL
#define CXLA_DMIRROR_FAIL_ALLOC_BIT	0	/* FLAGS: HMM_DMIRROR_FLAG_FAIL_ALLOC */

/* One open file: a device mirror of the opening process */
struct cxla_dmirror {
	struct cxla_dev *cd;		/* holds a device reference */
	bool priv;			/* private pages, else coherent */
	struct mmu_interval_notifier notifier;	/* the whole address space */
	struct mutex mutex;		/* pt; the invalidation takes it */
	struct xarray pt;		/* virtual page -> tagged page */
	unsigned long flags;		/* FLAGS: HMM_DMIRROR_FLAG_*, as bits */
};

static dev_t cxla_dmirror_devt;
static struct cdev cxla_dmirror_cdev;
static struct device *cxla_dmirror_dev[CXLA_DMIRRORS];
static struct class *cxla_dmirror_class;

static bool cxla_dmirror_invalidate(struct mmu_interval_notifier *mni,
				    const struct mmu_notifier_range *range,
				    unsigned long cur_seq)
{
	struct cxla_dmirror *dm = container_of(mni, struct cxla_dmirror,
					       notifier);
	unsigned long idx;
	void *entry;

	if (mmu_notifier_range_blockable(range))
		mutex_lock(&dm->mutex);
	else if (!mutex_trylock(&dm->mutex))
		return false;
	mmu_interval_set_seq(mni, cur_seq);
	/* the table holds no page references: the notifier keeps it right */
	xa_for_each_range(&dm->pt, idx, entry, range->start >> PAGE_SHIFT,
			  (range->end - 1) >> PAGE_SHIFT)
		xa_erase(&dm->pt, idx);
	mutex_unlock(&dm->mutex);
	return true;
}

static const struct mmu_interval_notifier_ops cxla_dmirror_ops = {
	.invalidate = cxla_dmirror_invalidate,
};

static void *cxla_dmirror_owner(struct cxla_dmirror *dm)
{
	return dm->priv ? cxla_priv_owner(dm->cd) : NULL;
}

#ifdef CXLA_HMM_FAULT_UNLOCKED
/*
 * As cxla_hmm_fault_locked(), but the fault takes the mmap_lock itself and
 * may drop it (a userfaultfd handler resolving the fault); its -EBUSY
 * retries are bounded as READ's, counted afresh whenever a fault made
 * progress. The mirror's lock stays held on success.
 */
static int cxla_dmirror_fault_unlocked(struct hmm_range *range,
				       struct mutex *lock)
{
	unsigned long timeout = msecs_to_jiffies(HMM_RANGE_DEFAULT_TIMEOUT);
	int ret;

	for (;;) {
		if (fatal_signal_pending(current))
			return -EINTR;
		ret = cxla_hmm_range_fault_unlocked(range, timeout);
		if (ret)
			return ret;
		mutex_lock(lock);
		if (!mmu_interval_read_retry(range->notifier,
					     range->notifier_seq))
			return 0;
		mutex_unlock(lock);
	}
}
#endif

/*
 * Fill the table for [start, end) with hmm_range_fault(): faulting pages in
 * (one device page table miss), or, with only_ours, just looking and
 * taking the pages that are on this device. With unlocked, the fault runs
 * without the mmap_lock held around it (READ_UNLOCKED).
 */
static int cxla_dmirror_fill(struct cxla_dmirror *dm, unsigned long start,
			     unsigned long end, bool write, bool only_ours,
			     bool unlocked)
{
	struct mm_struct *mm = dm->notifier.mm;
	unsigned long pfns[CXLA_DMIRROR_BATCH], addr, i;
	struct hmm_range range = {
		.notifier = &dm->notifier,
		.hmm_pfns = pfns,
		.default_flags = only_ours ? 0 : HMM_PFN_REQ_FAULT |
				 (write ? HMM_PFN_REQ_WRITE : 0),
		.dev_private_owner = cxla_dmirror_owner(dm),
	};
	int ret = 0;

	if (!mmget_not_zero(mm))
		return -EINVAL;
	for (addr = start; addr < end && !ret; addr = range.end) {
		range.start = addr;
		range.end = min(end, addr + (CXLA_DMIRROR_BATCH << PAGE_SHIFT));
#ifdef CXLA_HMM_FAULT_UNLOCKED
		if (unlocked)
			ret = cxla_dmirror_fault_unlocked(&range, &dm->mutex);
		else
#endif
			ret = cxla_hmm_fault_locked(&range, mm, &dm->mutex,
						    HMM_RANGE_DEFAULT_TIMEOUT);
		if (ret)
			break;
		for (i = 0; i < (range.end - range.start) >> PAGE_SHIFT; i++) {
			struct page *page;
			void *e;

			if (!(pfns[i] & HMM_PFN_VALID))
				continue;
			page = hmm_pfn_to_page(pfns[i]);
			if (only_ours && !(dm->priv ?
					   cxla_page_is_priv(dm->cd, page) :
					   cxla_page_is_ours(dm->cd, page)))
				continue;
			e = page;
			if (pfns[i] & HMM_PFN_WRITE)
				e = xa_tag_pointer(e, CXLA_DPT_WRITE);
			e = xa_store(&dm->pt, (range.start >> PAGE_SHIFT) + i, e,
				     GFP_ATOMIC);
			if (xa_is_err(e)) {
				ret = xa_err(e);
				break;
			}
		}
		mutex_unlock(&dm->mutex);
	}
	mmput(mm);
	return ret;
}

/*
 * The device copies between the mirrored pages of [start, start + n pages)
 * and the bounce pages (to_bounce: from the mirror). The mirror mutex is
 * held from the look-up to the end of the copy, so an invalidation (fork
 * write-protecting a page for copy-on-write, a migration) waits until the
 * device is done with the pages, as test_hmm's memcpy does. The copy
 * allocates without reclaim: reclaim may invalidate, which takes the mutex.
 * -ENOENT: a page is not in the table (or not writable for a write), *done
 * pages were copied.
 */
static int cxla_dmirror_copy(struct cxla_dmirror *dm, unsigned long start,
			     unsigned long n, struct page **bounce,
			     bool to_bounce, unsigned long *done)
{
	struct cxla_dev *cd = dm->cd;
	struct cxla_xpage *xp;
	unsigned int noreclaim;
	unsigned long i, k;
	int ret = 0;

	*done = 0;
	xp = kvcalloc(CXLA_DMIRROR_BATCH, sizeof(*xp), GFP_KERNEL);
	if (!xp)
		return -ENOMEM;
	for (i = 0; i < n && !ret; i += k) {
		unsigned long cnt = min(n - i, CXLA_DMIRROR_BATCH);

		mutex_lock(&dm->mutex);
		for (k = 0; k < cnt; k++) {
			void *e = xa_load(&dm->pt, (start >> PAGE_SHIFT) + i + k);
			struct page *page = xa_untag_pointer(e);
			struct cxla_xpage *x = &xp[k];
			u64 addr;
			u16 space;

			if (!page || (!to_bounce && !(xa_pointer_tag(e) & CXLA_DPT_WRITE)))
				break;
			ret = cxla_page_dev_addr(cd, page, &addr, &space);
			if (ret)
				break;
			memset(x, 0, sizeof(*x));
			if (to_bounce) {
				x->src = addr;
				x->sspace = space;
				x->dst = page_to_phys(bounce[i + k]);
				x->dspace = CXLA_SPACE_GPA;
				x->dpage = bounce[i + k];
			} else {
				x->src = page_to_phys(bounce[i + k]);
				x->sspace = CXLA_SPACE_GPA;
				x->dst = addr;
				x->dspace = space;
				x->dpage = page;
			}
		}
		if (k && !ret) {
			noreclaim = memalloc_noreclaim_save();
			ret = cxla_xcopy(cd->mig, xp, k, 0, true);
			memalloc_noreclaim_restore(noreclaim);
		}
		mutex_unlock(&dm->mutex);
		if (ret)
			break;
		*done += k;
		if (k < cnt)
			ret = -ENOENT;
	}
	kvfree(xp);
	return ret;
}

/* A bounce buffer of n pages for the device. */
static struct page **cxla_bounce_alloc(unsigned long n)
{
	struct page **b = kvcalloc(n, sizeof(*b), GFP_KERNEL);
	unsigned long i;

	if (!b)
		return NULL;
	for (i = 0; i < n; i++) {
		b[i] = alloc_page(GFP_KERNEL);
		if (!b[i]) {
			while (i--)
				__free_page(b[i]);
			kvfree(b);
			return NULL;
		}
	}
	return b;
}

static void cxla_bounce_free(struct page **b, unsigned long n)
{
	unsigned long i;

	if (!b)
		return;
	for (i = 0; i < n; i++)
		put_page(b[i]);
	kvfree(b);
}

static int cxla_bounce_user(struct page **b, unsigned long n, u64 uptr,
			    bool to_user)
{
	void __user *u = u64_to_user_ptr(uptr);
	unsigned long i, left;

	for (i = 0; i < n; i++, u += PAGE_SIZE) {
		void *k = kmap_local_page(b[i]);

		left = to_user ? copy_to_user(u, k, PAGE_SIZE) :
				 copy_from_user(k, u, PAGE_SIZE);
		kunmap_local(k);
		if (left)
			return -EFAULT;
	}
	return 0;
}

/*
 * READ and WRITE: the device copies the range out of (into) the mirrored
 * pages; every miss in the device page table is one fault pass (for
 * READ_UNLOCKED, without the mmap_lock held around it).
 */
static int cxla_dmirror_rw(struct cxla_dmirror *dm, struct hmm_dmirror_cmd *cmd,
			   bool write, bool unlocked)
{
	unsigned long start = cmd->addr, n = cmd->npages, done;
	struct page **b;
	int ret;

	b = cxla_bounce_alloc(n);
	if (!b)
		return -ENOMEM;
	if (write) {
		ret = cxla_bounce_user(b, n, cmd->ptr, false);
		if (ret)
			goto out;
	}
	for (;;) {
		ret = cxla_dmirror_copy(dm, start + (cmd->cpages << PAGE_SHIFT),
					n - cmd->cpages, b + cmd->cpages, !write,
					&done);
		cmd->cpages += done;
		if (ret != -ENOENT)
			break;
		ret = cxla_dmirror_fill(dm, start + (cmd->cpages << PAGE_SHIFT),
					start + (n << PAGE_SHIFT), write, false,
					unlocked);
		if (ret)
			break;
		cmd->faults++;
	}
	if (!ret && !write)
		ret = cxla_bounce_user(b, n, cmd->ptr, true);
out:
	cxla_bounce_free(b, n);
	return ret;
}

static int cxla_dmirror_migrate(struct cxla_dmirror *dm,
				struct hmm_dmirror_cmd *cmd, bool to_dev)
{
	struct mm_struct *mm = dm->notifier.mm;
	unsigned long end = cmd->addr + (cmd->npages << PAGE_SHIFT);
	struct cxl_accel_migrate res = { };
	struct cxla_mig_ctx x = {
		.mig = dm->cd->mig,
		.mode = to_dev ? CXLA_MIG_TO_DEV : CXLA_MIG_TO_RAM,
		.priv = dm->priv,
		.local_only = true,	/* as test_hmm: this device's pages */
		.system_only = true,
		.intr = true,
		.dma = true,
		.res = &res,
		.timeout_ms = READ_ONCE(cxla_cmd_timeout_ms),
	};
	struct vm_area_struct *vma;
	unsigned long addr, done = 0;
	struct page **b;
	int ret, tries;

	if (dm->priv && !dm->cd->priv)
		return -EOPNOTSUPP;	/* no device-private memory here */
#ifdef CXLA_PRIVATE_THP
	x.compound = dm->priv;	/* as test_hmm: 2 MiB folios go whole */
#endif
	if (!mmget_not_zero(mm))
		return -EINVAL;
	/* as test_hmm: every page readable */
	mmap_read_lock(mm);
	for (addr = cmd->addr, ret = 0; addr < end && !ret; addr = vma->vm_end) {
		vma = vma_lookup(mm, addr);
		if (!vma || !(vma->vm_flags & VM_READ))
			ret = -EINVAL;
	}
	mmap_read_unlock(mm);
	if (!ret)
		ret = cxla_mig_ctx_alloc(&x, min(cmd->npages, CXLA_MIG_WINDOW));
	if (!ret) {
		/* FAIL_ALLOC: the next allocation fails; unused, it stays set */
		x.fail_alloc = test_and_clear_bit(CXLA_DMIRROR_FAIL_ALLOC_BIT,
						  &dm->flags);
		ret = cxla_migrate_range(&x, mm, cmd->addr, end);
		if (x.fail_alloc)
			set_bit(CXLA_DMIRROR_FAIL_ALLOC_BIT, &dm->flags);
	}
	cxla_mig_ctx_free(&x);
	mmput(mm);
	if (ret)
		return ret;
	if (!to_dev) {
		cmd->cpages = res.migrated;
		return 0;
	}
	/*
	 * The device maps what it now holds (the migration's invalidation
	 * dropped the range from its page table) and reads it back, for the
	 * test to compare; a page that is not on this device is -ENOENT. An
	 * invalidation between the two (another process's work on the same
	 * memory) drops entries again: map and read again, a few times.
	 */
	b = cxla_bounce_alloc(cmd->npages);
	if (!b)
		return -ENOMEM;
	for (tries = 0; tries < CXLA_DMIRROR_TRIES; tries++) {
		ret = cxla_dmirror_fill(dm, cmd->addr, end, false, true, false);
		if (ret)
			break;
		ret = cxla_dmirror_copy(dm, cmd->addr, cmd->npages, b, true,
					&done);
		if (ret != -ENOENT)
			break;
	}
	if (ret && ret != -ENOENT) {
		cxla_bounce_free(b, cmd->npages);
		return ret;
	}
	cmd->cpages = done;
	if (!ret)
		ret = cxla_bounce_user(b, cmd->npages, cmd->ptr, true);
	cxla_bounce_free(b, cmd->npages);
	return ret;
}

/* test_hmm's snapshot byte of one hmm_range_fault() entry */
static u8 cxla_dmirror_perm(struct cxla_dmirror *dm, unsigned long entry)
{
	struct cxla_dev *cd = dm->cd;
	struct page *page;
	u8 perm;

	if (entry & HMM_PFN_ERROR)
		return HMM_DMIRROR_PROT_ERROR;
	if (!(entry & HMM_PFN_VALID))
		return HMM_DMIRROR_PROT_NONE;
	page = hmm_pfn_to_page(entry);
	if (is_device_private_page(page))
		perm = cxla_page_is_priv(cd, page) ?
		       HMM_DMIRROR_PROT_DEV_PRIVATE_LOCAL :
		       HMM_DMIRROR_PROT_DEV_PRIVATE_REMOTE;
	else if (is_device_coherent_page(page))
		perm = cxla_page_is_ours(cd, page) ?
		       HMM_DMIRROR_PROT_DEV_COHERENT_LOCAL :
		       HMM_DMIRROR_PROT_DEV_COHERENT_REMOTE;
	else if (is_zero_pfn(page_to_pfn(page)))
		perm = HMM_DMIRROR_PROT_ZERO;
	else
		perm = HMM_DMIRROR_PROT_NONE;
	perm |= (entry & HMM_PFN_WRITE) ? HMM_DMIRROR_PROT_WRITE :
					 HMM_DMIRROR_PROT_READ;
	if (hmm_pfn_to_map_order(entry) + PAGE_SHIFT == PMD_SHIFT)
		perm |= HMM_DMIRROR_PROT_PMD;
	else if (hmm_pfn_to_map_order(entry) + PAGE_SHIFT == PUD_SHIFT)
		perm |= HMM_DMIRROR_PROT_PUD;
	return perm;
}

static bool cxla_snap_invalidate(struct mmu_interval_notifier *mni,
				 const struct mmu_notifier_range *range,
				 unsigned long cur_seq)
{
	mmu_interval_set_seq(mni, cur_seq);
	return true;
}

static const struct mmu_interval_notifier_ops cxla_snap_ops = {
	.invalidate = cxla_snap_invalidate,
};

/* SNAPSHOT: the CPU page table as the device sees it, nothing faulted */
static int cxla_dmirror_snapshot(struct cxla_dmirror *dm,
				 struct hmm_dmirror_cmd *cmd)
{
	struct mm_struct *mm = dm->notifier.mm;
	unsigned long pfns[CXLA_DMIRROR_BATCH], addr, next, i, n;
	unsigned long end = cmd->addr + (cmd->npages << PAGE_SHIFT);
	u8 perm[CXLA_DMIRROR_BATCH];
	u8 __user *uptr = u64_to_user_ptr(cmd->ptr);
	int ret = 0;

	if (!mmget_not_zero(mm))
		return -EINVAL;
	for (addr = cmd->addr; addr < end && !ret; addr = next) {
		/* a notifier of its own: any change restarts the window */
		struct mmu_interval_notifier mni;
		struct hmm_range range = {
			.notifier = &mni,
			.hmm_pfns = pfns,
			.dev_private_owner = cxla_dmirror_owner(dm),
		};

		next = min(end, addr + (CXLA_DMIRROR_BATCH << PAGE_SHIFT));
		range.start = addr;
		range.end = next;
		ret = cxla_notifier_insert(&mni, mm, addr, next - addr,
					   &cxla_snap_ops);
		if (ret)
			break;
		do {
			range.notifier_seq = mmu_interval_read_begin(&mni);
			mmap_read_lock(mm);
			ret = cxla_hmm_range_fault(&range);
			mmap_read_unlock(mm);
		} while (ret == -EBUSY ||
			 (!ret && mmu_interval_read_retry(&mni, range.notifier_seq)));
		mmu_interval_notifier_remove(&mni);
		if (ret)
			break;
		n = (next - addr) >> PAGE_SHIFT;
		for (i = 0; i < n; i++)
			perm[i] = cxla_dmirror_perm(dm, pfns[i]);
		if (copy_to_user(uptr, perm, n)) {
			ret = -EFAULT;
			break;
		}
		uptr += n;
		cmd->cpages += n;
	}
	mmput(mm);
	return ret;
}

/*
 * EXCLUSIVE: take the pages for device atomics: the CPU mapping becomes a
 * device-exclusive entry, and a CPU access (which restores it) clears the
 * atomic tag through the notifier. Then the device reads them back.
 */
static int cxla_dmirror_exclusive(struct cxla_dmirror *dm,
				  struct hmm_dmirror_cmd *cmd)
{
	struct mm_struct *mm = dm->notifier.mm;
	unsigned long end = cmd->addr + (cmd->npages << PAGE_SHIFT), addr, done;
	struct page **b;
	int ret = 0;

	if (!mmget_not_zero(mm))
		return -EINVAL;
	mmap_read_lock(mm);
	for (addr = cmd->addr; addr < end && !ret; addr += PAGE_SIZE) {
		struct page *page = cxla_make_exclusive(mm, addr, dm->cd->mig);

		if (IS_ERR(page)) {
			ret = PTR_ERR(page) == -EOPNOTSUPP ? -EOPNOTSUPP : -EBUSY;
			break;
		}
		mutex_lock(&dm->mutex);
		xa_store(&dm->pt, addr >> PAGE_SHIFT,
			 xa_tag_pointer(page, CXLA_DPT_ATOMIC | CXLA_DPT_WRITE),
			 GFP_ATOMIC);	/* no reclaim: it may invalidate */
		mutex_unlock(&dm->mutex);
		unlock_page(page);
		put_page(page);
	}
	mmap_read_unlock(mm);
	mmput(mm);
	if (ret)
		return ret;
	b = cxla_bounce_alloc(cmd->npages);
	if (!b)
		return -ENOMEM;
	ret = cxla_dmirror_copy(dm, cmd->addr, cmd->npages, b, true, &done);
	cmd->cpages = done;
	if (!ret)
		ret = cxla_bounce_user(b, cmd->npages, cmd->ptr, true);
	cxla_bounce_free(b, cmd->npages);
	return ret;
}

static int cxla_dmirror_check_exclusive(struct cxla_dmirror *dm,
					struct hmm_dmirror_cmd *cmd)
{
	unsigned long idx, first = cmd->addr >> PAGE_SHIFT;
	void *e;
	int ret = 0;

	mutex_lock(&dm->mutex);
	xa_for_each_range(&dm->pt, idx, e, first, first + cmd->npages - 1)
		if (xa_pointer_tag(e) & CXLA_DPT_ATOMIC)
			ret = -EPERM;
	mutex_unlock(&dm->mutex);
	return ret;
}

static long cxla_dmirror_ioctl(struct file *filp, unsigned int command,
			       unsigned long arg)
{
	struct cxla_dmirror *dm = filp->private_data;
	void __user *uarg = (void __user *)arg;
	struct hmm_dmirror_cmd cmd;
	int ret;

	if (copy_from_user(&cmd, uarg, sizeof(cmd)))
		return -EFAULT;
	if (!PAGE_ALIGNED(cmd.addr) || !cmd.npages ||
	    cmd.npages > (TASK_SIZE >> PAGE_SHIFT) ||
	    cmd.addr >= cmd.addr + (cmd.npages << PAGE_SHIFT))
		return -EINVAL;
	if (READ_ONCE(dm->cd->dead))
		return -ENODEV;
	cmd.cpages = 0;
	cmd.faults = 0;

	switch (command) {
	case HMM_DMIRROR_READ:
		ret = cxla_dmirror_rw(dm, &cmd, false, false);
		break;
	case HMM_DMIRROR_WRITE:
		ret = cxla_dmirror_rw(dm, &cmd, true, false);
		break;
	case HMM_DMIRROR_MIGRATE_TO_DEV:
		ret = cxla_dmirror_migrate(dm, &cmd, true);
		break;
	case HMM_DMIRROR_MIGRATE_TO_SYS:
		ret = cxla_dmirror_migrate(dm, &cmd, false);
		break;
	case HMM_DMIRROR_SNAPSHOT:
		ret = cxla_dmirror_snapshot(dm, &cmd);
		break;
	case HMM_DMIRROR_EXCLUSIVE:
		ret = cxla_dmirror_exclusive(dm, &cmd);
		break;
	case HMM_DMIRROR_CHECK_EXCLUSIVE:
		ret = cxla_dmirror_check_exclusive(dm, &cmd);
		break;
	case HMM_DMIRROR_RELEASE:
		/* test_hmm gives its device memory up: evict all of it */
		ret = cxla_evict_device(dm->cd);
		break;
	case HMM_DMIRROR_FLAGS:
		/* test_hmm's: npages carries the flags */
		WRITE_ONCE(dm->flags, cmd.npages);
		ret = 0;
		break;
#ifdef CXLA_HMM_FAULT_UNLOCKED
	case HMM_DMIRROR_READ_UNLOCKED:
		ret = cxla_dmirror_rw(dm, &cmd, false, true);
		break;
#endif
	default:
		return -EINVAL;
	}
	if (ret)
		return ret;
	return copy_to_user(uarg, &cmd, sizeof(cmd)) ? -EFAULT : 0;
}

/* mmap of the file: zeroed kernel pages (test_hmm's mixed mappings) */
static int cxla_dmirror_mmap(struct file *filp, struct vm_area_struct *vma)
{
	unsigned long addr;
	struct page *page;
	int ret;

	for (addr = vma->vm_start; addr < vma->vm_end; addr += PAGE_SIZE) {
		page = alloc_page(GFP_KERNEL | __GFP_ZERO);
		if (!page)
			return -ENOMEM;
		ret = vm_insert_page(vma, addr, page);
		put_page(page);		/* the mapping holds it */
		if (ret)
			return ret;
	}
	return 0;
}

static int cxla_dmirror_open(struct inode *inode, struct file *filp)
{
	unsigned int idx = iminor(inode);
	struct cxla_dmirror *dm;
	struct cxla_dev *cd;
	int ret;

	cd = cxla_dev_get_by_index(idx % 2);
	if (!cd)
		return -ENODEV;
	if (!cd->mig->coherent) {
		put_device(&cd->dev);
		return -ENODEV;
	}
	dm = kzalloc(sizeof(*dm), GFP_KERNEL);
	if (!dm) {
		put_device(&cd->dev);
		return -ENOMEM;
	}
	dm->cd = cd;
	dm->priv = idx < 2;
	mutex_init(&dm->mutex);
	xa_init(&dm->pt);
	ret = cxla_notifier_insert(&dm->notifier, current->mm, 0,
				   ULONG_MAX & PAGE_MASK, &cxla_dmirror_ops);
	if (ret) {
		kfree(dm);
		put_device(&cd->dev);
		return ret;
	}
	filp->private_data = dm;
	return 0;
}

static int cxla_dmirror_release(struct inode *inode, struct file *filp)
{
	struct cxla_dmirror *dm = filp->private_data;

	mmu_interval_notifier_remove(&dm->notifier);
	xa_destroy(&dm->pt);
	put_device(&dm->cd->dev);
	kfree(dm);
	return 0;
}

static const struct file_operations cxla_dmirror_fops = {
	.owner = THIS_MODULE,
	.open = cxla_dmirror_open,
	.release = cxla_dmirror_release,
	.mmap = cxla_dmirror_mmap,
	.unlocked_ioctl = cxla_dmirror_ioctl,
	.llseek = default_llseek,
};

int cxla_test_hmm_init(void)
{
	int ret, i;

	if (!cxla_test_hmm)
		return 0;
	ret = alloc_chrdev_region(&cxla_dmirror_devt, 0, CXLA_DMIRRORS,
				  "hmm_dmirror");
	if (ret)
		return ret;
	cdev_init(&cxla_dmirror_cdev, &cxla_dmirror_fops);
	cxla_dmirror_cdev.owner = THIS_MODULE;
	ret = cdev_add(&cxla_dmirror_cdev, cxla_dmirror_devt, CXLA_DMIRRORS);
	if (ret)
		goto err_region;
	cxla_dmirror_class = class_create("hmm_dmirror");
	if (IS_ERR(cxla_dmirror_class)) {
		ret = PTR_ERR(cxla_dmirror_class);
		goto err_cdev;
	}
	for (i = 0; i < CXLA_DMIRRORS; i++) {
		cxla_dmirror_dev[i] = device_create(cxla_dmirror_class, NULL,
						    cxla_dmirror_devt + i, NULL,
						    "hmm_dmirror%d", i);
		if (IS_ERR(cxla_dmirror_dev[i])) {
			ret = PTR_ERR(cxla_dmirror_dev[i]);
			goto err_devs;
		}
	}
	pr_info("cxl_accel: test_hmm interface: /dev/hmm_dmirror0, 1 (private) and 2, 3 (coherent) on cxl-accel0 and 1\n");
	return 0;

err_devs:
	while (i--)
		device_destroy(cxla_dmirror_class, cxla_dmirror_devt + i);
	class_destroy(cxla_dmirror_class);
err_cdev:
	cdev_del(&cxla_dmirror_cdev);
err_region:
	unregister_chrdev_region(cxla_dmirror_devt, CXLA_DMIRRORS);
	cxla_dmirror_class = NULL;
	return ret;
}

void cxla_test_hmm_exit(void)
{
	int i;

	if (!cxla_dmirror_class)
		return;
	for (i = 0; i < CXLA_DMIRRORS; i++)
		device_destroy(cxla_dmirror_class, cxla_dmirror_devt + i);
	class_destroy(cxla_dmirror_class);
	cdev_del(&cxla_dmirror_cdev);
	unregister_chrdev_region(cxla_dmirror_devt, CXLA_DMIRRORS);
}
