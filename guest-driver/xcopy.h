/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: the page copy engine of migration (xcopy.c): pages copied or
 * zeroed by the device, each destination held by its command.
 */
#ifndef CXL_ACCEL_XCOPY_H
#define CXL_ACCEL_XCOPY_H

#include <linux/types.h>

struct cxla_mig;
struct page;

/* One 4 KiB page to copy, or to zero-fill (no source) */
struct cxla_xpage {
	u64 src;
	u64 dst;
	u16 sspace;
	u16 dspace;
	bool zero;
	bool failed;		/* out: its command failed */
	unsigned long idx;	/* in the migrate arrays */
	struct page *spage;	/* where the data is (a private page's backing) */
	struct page *dpage;	/* the destination page for migrate_vma */
	struct page *dstore;	/* what the device writes, if not dpage (a
				 * private page's backing); the command holds it
				 */
};

int cxla_xcopy(struct cxla_mig *mig, struct cxla_xpage *xp, unsigned int n,
	       unsigned int timeout_ms, bool intr);

#endif /* CXL_ACCEL_XCOPY_H */
