// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: the ranges of device memory that are poisoned (media errors),
 * sorted, merged where they touch. poison.c adds and removes them as the
 * device reports them; the buffer and DMA-BUF fault handlers and the
 * migration pool ask whether memory they are about to hand out is bad
 * (as drivers/nvdimm keeps its bad ranges low).
 */
#include <linux/slab.h>
#include <linux/spinlock.h>

#include "cxl_accel.h"
#include "badrange.h"

struct cxla_badrange {
	spinlock_t lock;		/* r, n; taken inside mig->lock */
	unsigned int n;
	struct cxla_badrange_entry r[CXLA_BADRANGE_MAX];
};

int cxla_badrange_init(struct cxla_dev *cd)
{
	struct cxla_badrange *b = kzalloc(sizeof(*b), GFP_KERNEL);

	if (!b)
		return -ENOMEM;
	spin_lock_init(&b->lock);
	cd->bad = b;
	return 0;
}

void cxla_badrange_free(struct cxla_dev *cd)
{
	kfree(cd->bad);
	cd->bad = NULL;
}

/* Whether any byte of [off, off + len) of device memory is poisoned. */
bool cxla_badrange_hit(struct cxla_dev *cd, u64 off, u64 len)
{
	struct cxla_badrange *b = cd->bad;
	unsigned long flags;
	unsigned int i;
	bool hit = false;

	if (!b || !READ_ONCE(b->n))
		return false;
	spin_lock_irqsave(&b->lock, flags);
	for (i = 0; i < b->n && !hit; i++)
		hit = b->r[i].start < off + len && b->r[i].end > off;
	spin_unlock_irqrestore(&b->lock, flags);
	return hit;
}

/* Add [start, end), merging with what it overlaps or touches; false: full. */
bool cxla_badrange_add(struct cxla_dev *cd, u64 start, u64 end)
{
	struct cxla_badrange *b = cd->bad;
	unsigned int i, j;
	bool ok = true;

	spin_lock_irq(&b->lock);
	for (i = 0, j = 0; i < b->n; i++) {
		if (b->r[i].end >= start && b->r[i].start <= end) {
			start = min(start, b->r[i].start);
			end = max(end, b->r[i].end);
			continue;	/* absorbed into the new range */
		}
		b->r[j++] = b->r[i];
	}
	b->n = j;
	if (b->n < CXLA_BADRANGE_MAX) {
		/* keep them sorted: sysfs lists them in order */
		for (i = b->n; i > 0 && b->r[i - 1].start > start; i--)
			b->r[i] = b->r[i - 1];
		b->r[i].start = start;
		b->r[i].end = end;
		b->n++;
	} else {
		ok = false;
	}
	spin_unlock_irq(&b->lock);
	return ok;
}

/* Remove [start, end), splitting what it cuts in two; whether it hit. */
bool cxla_badrange_remove(struct cxla_dev *cd, u64 start, u64 end)
{
	struct cxla_badrange *b = cd->bad;
	struct cxla_badrange_entry *out;
	unsigned int i, n = 0;
	bool hit = false;

	/* each range yields at most two: room for all of them plus one */
	out = kmalloc_array(CXLA_BADRANGE_MAX + 1, sizeof(*out), GFP_KERNEL);
	if (!out)
		return false;
	spin_lock_irq(&b->lock);
	for (i = 0; i < b->n; i++) {
		struct cxla_badrange_entry r = b->r[i];

		if (r.end <= start || r.start >= end) {
			out[n++] = r;
			continue;
		}
		hit = true;
		if (r.start < start && n <= CXLA_BADRANGE_MAX)
			out[n++] = (struct cxla_badrange_entry){ r.start, start };
		if (r.end > end && n <= CXLA_BADRANGE_MAX)
			out[n++] = (struct cxla_badrange_entry){ end, r.end };
	}
	/* a split can only overflow if the table was full: keep the first */
	n = min_t(unsigned int, n, CXLA_BADRANGE_MAX);
	memcpy(b->r, out, n * sizeof(*out));
	b->n = n;
	spin_unlock_irq(&b->lock);
	kfree(out);
	return hit;
}

/* The ranges now, up to max of them into r (NULL: none); how many there are */
unsigned int cxla_badrange_list(struct cxla_dev *cd,
				struct cxla_badrange_entry *r, unsigned int max)
{
	struct cxla_badrange *b = cd->bad;
	unsigned int n;

	if (!b)
		return 0;
	spin_lock_irq(&b->lock);
	n = b->n;
	if (r)
		memcpy(r, b->r, min(n, max) * sizeof(*r));
	spin_unlock_irq(&b->lock);
	return n;
}
