// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: eviction of migrated pages back to system RAM (EVICT, unbind,
 * module unload).
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
#include <linux/hmm.h>
#include <linux/migrate.h>
#include <linux/mm.h>
#include <linux/mmap_lock.h>
#include <linux/mmu_notifier.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/slab.h>
#include <linux/sort.h>
#include <linux/uaccess.h>

#include "cxl_accel.h"
#include "compat.h"
#include "core.h"
#include "devmem.h"
#include "evict.h"
#include "migrate.h"
#include "pool.h"
#include "private.h"

#define CXLA_EVICT_SCAN		512UL	/* pages per look at page tables */
#define CXLA_EVICT_RETRY_MS	3000	/* EVICT: retry busy pages this long */
#define CXLA_EVICT_ALL_MS	500	/* retries: every process at most this often */
#define CXLA_REMOVE_RETRY_MS	10000	/* removal: likewise, per phase */
#define CXLA_REMOVE_CMD_MS	2000	/* removal: per command */

/* -------------------------------------------------------- eviction */

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
	if (set->n < set->max)
		set->mm[set->n++] = mm;
	else
		mmput_async(mm);
}

static int cxla_mm_cmp(const void *a, const void *b)
{
	uintptr_t x = (uintptr_t)*(struct mm_struct * const *)a;
	uintptr_t y = (uintptr_t)*(struct mm_struct * const *)b;

	return x < y ? -1 : x > y;
}

/* Processes sharing an address space (CLONE_VM) leave it once in the set. */
static void cxla_mm_set_unique(struct cxla_mm_set *set)
{
	unsigned int i, n = 0;

	sort(set->mm, set->n, sizeof(*set->mm), cxla_mm_cmp, NULL);
	for (i = 0; i < set->n; i++) {
		if (n && set->mm[n - 1] == set->mm[i])
			mmput_async(set->mm[i]);
		else
			set->mm[n++] = set->mm[i];
	}
	set->n = n;
}

/* The address spaces that migrated pages to this device (pool.c) */
static int cxla_tracked_mms(struct cxla_mig *mig, struct cxla_mm_set *set)
{
	set->mm = cxla_pool_mms(mig, &set->n);
	set->max = set->n;
	return set->mm ? 0 : -ENOMEM;
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
	/* after the RCU section: de-duplication is n log n, not under it */
	cxla_mm_set_unique(set);
	return 0;
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
static void cxla_evict_scan(struct cxla_mig_ctx *x,
			    struct mmu_interval_notifier *mni,
			    unsigned long *pfns, unsigned long *lo,
			    unsigned long *hi)
{
	struct cxla_dev *cd = x->mig->cd;
	struct hmm_range range = {
		.notifier = mni,
		.start = *lo,
		.end = *hi,
		.hmm_pfns = pfns,
		.default_flags = 0,	/* look, do not fault */
		.pfn_flags_mask = 0,
		.dev_private_owner = cxla_priv_owner(cd),
	};
	unsigned long i, n = (*hi - *lo) >> PAGE_SHIFT, first = n, last = 0;
	unsigned long pstart = PHYS_PFN(cd->devmem_gpa);
	unsigned long pend = pstart + PHYS_PFN(cd->devmem_size);
	int ret, tries;

	if (x->priv)
		cxla_priv_pfns(cd, &pstart, &pend);

	for (tries = 0; tries < 8; tries++) {
		range.notifier_seq = mmu_interval_read_begin(mni);
		ret = cxla_hmm_range_fault(&range);
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
	bool scan_ok;
	int ret = 0;

	/*
	 * The scan is a hint: without its notifier (an mm's first one gives up
	 * on any pending signal or task work) whole windows are migrated,
	 * which finds the same pages, only slower. Removal must not stop here.
	 */
	scan_ok = !mmu_interval_notifier_insert(&mni, mm, 0,
						ULONG_MAX & PAGE_MASK,
						&cxla_scan_ops);
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
			/* coherent pages, then this device's private ones */
			for (x->priv = false; !ret; x->priv = true) {
				lo = a;
				hi = next;
				/* hmm_range_fault() does not show what PROT_NONE hides */
				if (scan_ok && (vma->vm_flags & VM_READ))
					cxla_evict_scan(x, &mni, pfns, &lo, &hi);
				if (lo < hi)
					ret = cxla_mig_window(x, vma, lo, hi);
				if (x->priv || !x->mig->cd->priv)
					break;
			}
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
	if (scan_ok)
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
 * Pages of this device that a page table maps: coherent and private; not
 * those on poisoned memory unless the eviction copies them anyway (removal).
 */
static unsigned long cxla_evict_mapped(struct cxla_mig_ctx *x)
{
	bool skip = !x->cpu_fallback;

	return cxla_pool_mapped(x->mig, skip) + cxla_priv_mapped(x->mig->cd, skip);
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
		if (!cxla_evict_mapped(x))
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
			if (!cxla_evict_mapped(x))
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

/* Evict every page of the device that a process maps (test_hmm RELEASE). */
int cxla_evict_device(struct cxla_dev *cd)
{
	struct cxla_mig *mig = cd->mig;
	struct cxl_accel_migrate res = { };
	struct cxla_mig_ctx x = {
		.mig = mig,
		.mode = CXLA_MIG_EVICT,
		.intr = true,
		.dma = true,
		.res = &res,
		.timeout_ms = READ_ONCE(cxla_cmd_timeout_ms),
	};
	int ret;

	if (!mig->coherent)
		return -EOPNOTSUPP;
	ret = cxla_mig_ctx_alloc(&x, CXLA_EVICT_SCAN);
	if (ret)
		return ret;
	down_write(&mig->sem);
	ret = READ_ONCE(mig->closed) ? -ENODEV :
	      cxla_evict_loop(&x, CXLA_EVICT_RETRY_MS);
	cxla_pool_shrink(mig);
	up_write(&mig->sem);
	cxla_mig_ctx_free(&x);
	return ret;
}

long cxla_ioc_evict(struct cxla_file *cf, void __user *arg)
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
	/* left in place: the data there cannot be read */
	e.poisoned = cxla_pool_poisoned_used(mig);
	up_write(&mig->sem);
	cxla_mig_ctx_free(&x);
	if (ret)
		return ret;
	return copy_to_user(arg, &e, sizeof(e)) ? -EFAULT : 0;
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
	if (ret)
		dev_warn(&cd->dev,
			 "%llu migrated pages moved back to system RAM %s, %llu of them by CPU copy (error %d)\n",
			 res.migrated, when, x.cpu_copied, ret);
	else if (res.migrated)
		dev_info(&cd->dev,
			 "%llu migrated pages moved back to system RAM %s, %llu of them by CPU copy\n",
			 res.migrated, when, x.cpu_copied);
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
	if (cancel_delayed_work_sync(&mig->shrink_work))
		cxla_deferred_done(cd);
}

/*
 * A function reset is coming (main.c set cd->resetting, which migration
 * passes look at under mig->sem): wait for the passes under way, then every
 * migrated page goes back to system RAM while the device still copies, so
 * that no process maps device memory while the reset takes the BAR away.
 * The pool stays open; passes wait for the reset's end.
 */
void cxla_mig_pause(struct cxla_dev *cd)
{
	struct cxla_mig *mig = cd->mig;

	if (!mig)
		return;
	down_write(&mig->sem);
	cxla_mig_evict_removal(cd, !READ_ONCE(cd->wedged),
			       "before a function reset");
	up_write(&mig->sem);
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

