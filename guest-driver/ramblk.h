/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: system RAM destination pages of migrations back to RAM
 * (ramblk.c): pages of 2 MiB blocks from a reserve kept filled in the
 * background, else allocated by this CPU and a helper on another at once.
 */
#ifndef CXL_ACCEL_RAMBLK_H
#define CXL_ACCEL_RAMBLK_H

#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/workqueue.h>

#include "migrate.h"

struct page;
struct vm_area_struct;

/* n consecutive pages from p, each a page of its own (refcount 1) */
struct cxla_ram_run {
	struct page *p;
	unsigned int n;
};

/* Runs of a window: whole blocks, up to 2 pieces of a shared block */
#define CXLA_RAM_RUNS_MAX	((CXLA_MIG_WINDOW >> (20 - PAGE_SHIFT)) + 2)

/* The pages of one window, handed out one by one */
struct cxla_ram_blocks {
	struct work_struct work;	/* the helper */
	struct completion helped;
	struct cxla_ram_run run[CXLA_RAM_RUNS_MAX];
	atomic_t next;			/* the next block to allocate */
	unsigned int n, order;
	int nid;
	unsigned int cur, used;		/* handing out: run, pages of it */
};

void cxla_ram_blocks_get(struct cxla_ram_blocks *rb, unsigned long npages,
			 struct vm_area_struct *vma);
struct page *cxla_ram_page(struct cxla_ram_blocks *rb,
			   struct vm_area_struct *vma, unsigned long addr);
void cxla_ram_blocks_put(struct cxla_ram_blocks *rb);

/* The reserve: pages in it now; pages it gave, and lacked, so far */
struct cxla_ram_stats {
	unsigned long pages, taken, missed;
};

void cxla_ram_reserve_stats(struct cxla_ram_stats *st);
int cxla_ram_reserve_init(void);
void cxla_ram_reserve_exit(void);

#endif
