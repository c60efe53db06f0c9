// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: poisoned device memory (media errors).
 *
 * The device reports a range of its memory that went bad with a POISON
 * event, and a range that is usable again with POISON_CLEARED (device
 * specification, section 8). Until it is cleared:
 *  - commands that touch the range fail on the device (MEDIA_ERROR, which
 *    user space sees as -EIO);
 *  - CPU mappings of its pages fault with SIGBUS (BUS_MCEERR_AR): the buffer
 *    and DMA-BUF fault handlers refuse them with VM_FAULT_HWPOISON, and the
 *    pages already mapped are zapped so that the next access faults;
 *  - the migration pool hands none of its pages out (pool.c quarantines
 *    them, including pages given back later), and migration leaves
 *    migrated pages there in place rather than copy from bad memory;
 *  - a device-private page whose backing is poisoned cannot come back to
 *    RAM: the CPU access gets SIGBUS (private.c).
 *
 * The emulation raises no machine check, so a CPU load from a coherent
 * page that was migrated there before the event is not intercepted; real
 * hardware would deliver a machine check for it instead.
 *
 * Events arrive in interrupt context (vq.c records them in the event
 * ring); a work item reads the ring behind them, in order, and acts.
 */
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/sysfs.h>

#include "cxl_accel.h"
#include "badrange.h"
#include "core.h"
#include "devmem.h"
#include "dmabuf.h"
#include "poison.h"
#include "pool.h"
#include "vq.h"

struct cxla_poison {
	struct cxla_dev *cd;
	u64 pos;			/* next event ring index (evt_lock) */
	u64 cleared;			/* POISON_CLEARED events handled */
	u64 lost;			/* events overwritten before the work ran */
	struct work_struct work;
};

static void cxla_poison_set(struct cxla_dev *cd, u64 off, u64 len)
{
	u64 end;

	if (!len || check_add_overflow(off, len, &end) || end > cd->devmem_size) {
		cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_PROTOCOL);
		dev_err_ratelimited(&cd->dev,
				    "POISON event for %#llx + %#llx outside device memory\n",
				    off, len);
		return;
	}
	cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_POISON);
	/*
	 * With map_sem held for writing no fault handler is between its
	 * poison check and inserting the page: a page inserted before is
	 * zapped below, a fault after sees the range.
	 */
	down_write(&cd->map_sem);
	if (!cxla_badrange_add(cd, off, end))
		dev_err(&cd->dev,
			"more than %u poisoned ranges: %#llx + %#llx not recorded\n",
			CXLA_BADRANGE_MAX, off, len);
	up_write(&cd->map_sem);
	dev_warn(&cd->dev,
		 "media error: device memory %#llx + %#llx poisoned; accesses fail, CPU mappings get SIGBUS\n",
		 off, len);
	/* free pool pages there are never handed out */
	cxla_pool_poison(cd->mig, off, end);
	/* existing CPU mappings refault (and get SIGBUS there) */
	cxla_zap_mappings(cd);
	cxla_dmabuf_zap(cd, off, end);
}

static void cxla_poison_clear(struct cxla_dev *cd, u64 off, u64 len)
{
	struct cxla_poison *pz = cd->poison;
	u64 end = off + min(len, U64_MAX - off);

	pz->cleared++;
	if (!cxla_badrange_remove(cd, off, end))
		return;
	dev_info(&cd->dev, "device memory %#llx + %#llx usable again\n",
		 off, len);
	/* quarantined pool pages go back; mappings fault normally again */
	cxla_pool_unpoison(cd->mig);
}

static void cxla_poison_work(struct work_struct *work)
{
	struct cxla_poison *pz = container_of(work, struct cxla_poison, work);
	struct cxla_dev *cd = pz->cd;
	struct cxl_accel_event ev[16];
	unsigned int n, i;
	u64 lost;

	do {
		n = 0;
		lost = 0;
		spin_lock_irq(&cd->evt_lock);
		if (cd->evt_head - pz->pos > CXLA_EVENT_RING) {
			lost = cd->evt_head - pz->pos - CXLA_EVENT_RING;
			pz->pos = cd->evt_head - CXLA_EVENT_RING;
		}
		while (pz->pos < cd->evt_head && n < ARRAY_SIZE(ev)) {
			struct cxl_accel_event *e;

			e = &cd->evt_ring[pz->pos++ % CXLA_EVENT_RING];
			if (e->type == CXLA_EVENT_POISON ||
			    e->type == CXLA_EVENT_POISON_CLEARED)
				ev[n++] = *e;
		}
		spin_unlock_irq(&cd->evt_lock);
		if (lost) {
			pz->lost += lost;
			dev_err(&cd->dev,
				"%llu events overwritten before they were looked at: poison reports may be missing\n",
				lost);
		}
		for (i = 0; i < n; i++) {
			if (ev[i].type == CXLA_EVENT_POISON)
				cxla_poison_set(cd, ev[i].value0, ev[i].value1);
			else
				cxla_poison_clear(cd, ev[i].value0, ev[i].value1);
		}
	} while (n);
	cxla_deferred_done(cd);
}

/* An event arrived (interrupt context, evt_lock held): look at it soon. */
static void cxla_poison_kick(struct cxla_dev *cd)
{
	if (cd->poison)
		cxla_defer(cd, &cd->poison->work);
}

int cxla_poison_init(struct cxla_dev *cd)
{
	struct cxla_poison *pz;

	pz = kzalloc(sizeof(*pz), GFP_KERNEL);
	if (!pz)
		return -ENOMEM;
	if (cxla_badrange_init(cd)) {
		kfree(pz);
		return -ENOMEM;
	}
	pz->cd = cd;
	INIT_WORK(&pz->work, cxla_poison_work);
	cd->poison = pz;
	cxla_evt_set_handler(cd, CXLA_EVENT_POISON, cxla_poison_kick);
	cxla_evt_set_handler(cd, CXLA_EVENT_POISON_CLEARED, cxla_poison_kick);
	return 0;
}

/* Removal, after the device reset: no event comes any more. */
void cxla_poison_stop(struct cxla_dev *cd)
{
	if (cd->poison && cancel_work_sync(&cd->poison->work))
		cxla_deferred_done(cd);
}

void cxla_poison_free(struct cxla_dev *cd)
{
	if (!cd->poison)
		return;
	cancel_work_sync(&cd->poison->work);
	kfree(cd->poison);
	cd->poison = NULL;
	cxla_badrange_free(cd);
}

/* sysfs: the poisoned ranges, "offset length" in hex, one per line */
static ssize_t poison_show(struct device *dev, struct device_attribute *attr,
			   char *buf)
{
	struct cxla_badrange_entry *r;
	unsigned int i, n;
	ssize_t len = 0;

	r = kmalloc_array(CXLA_BADRANGE_MAX, sizeof(*r), GFP_KERNEL);
	if (!r)
		return -ENOMEM;
	n = cxla_badrange_list(to_cxla_dev(dev), r, CXLA_BADRANGE_MAX);
	for (i = 0; i < n && len < PAGE_SIZE - 40; i++)
		len += sysfs_emit_at(buf, len, "%#llx %#llx\n", r[i].start,
				     r[i].end - r[i].start);
	kfree(r);
	return len;
}
static DEVICE_ATTR_RO(poison);

/* sysfs: what the driver did about poison */
static ssize_t poison_stats_show(struct device *dev,
				 struct device_attribute *attr, char *buf)
{
	struct cxla_dev *cd = to_cxla_dev(dev);
	struct cxla_poison *pz = cd->poison;
	struct cxl_accel_hmm_info h;
	unsigned int n = cxla_badrange_list(cd, NULL, 0);

	cxla_pool_poison_info(cd->mig, &h);
	return sysfs_emit(buf,
			  "ranges %u\npoison_events %lld\ncleared_events %llu\nlost_events %llu\nhwpoison_faults %lld\npool_pages_poisoned %llu\npoison_skipped %llu\n",
			  n, atomic64_read(&cd->dstat[CXL_ACCEL_DSTAT_POISON]),
			  pz ? pz->cleared : 0, pz ? pz->lost : 0,
			  atomic64_read(&cd->dstat[CXL_ACCEL_DSTAT_HWPOISON]),
			  h.pool_pages_poisoned, h.poison_skipped);
}
static DEVICE_ATTR_RO(poison_stats);

static struct attribute *cxla_poison_attrs[] = {
	&dev_attr_poison.attr,
	&dev_attr_poison_stats.attr,
	NULL,
};

const struct attribute_group cxla_poison_group = {
	.attrs = cxla_poison_attrs,
};
