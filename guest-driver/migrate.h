/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: page migration between RAM and device memory (migrate.c): the
 * windows of migrate_vma and the MIGRATE ioctls.
 */
#ifndef CXL_ACCEL_MIGRATE_H
#define CXL_ACCEL_MIGRATE_H

#include <linux/compiler.h>
#include <linux/mm_types.h>
#include <linux/types.h>

#include "xcopy.h"

struct cxl_accel_migrate;
struct cxla_dev;
struct cxla_file;
struct cxla_mig;
struct folio;
struct mm_struct;
struct page;
struct vm_area_struct;
struct vm_fault;

/* Limits shared by the migration files */
#define CXLA_MIG_WINDOW		4096UL	/* pages per migrate_vma_setup() */
#define CXLA_MIG_MAX_TIMEOUT_MS	30000	/* per command of a migration ioctl */

/* What a window does with the pages it finds */
enum cxla_mig_mode {
	CXLA_MIG_TO_DEV,	/* RAM and other devices' pages to this device */
	CXLA_MIG_TO_RAM,	/* cxl-accel device pages to RAM */
	CXLA_MIG_EVICT,		/* this device's pages to RAM */
};

/* A window's pages: coherent or this device's private ones (x->priv) */

struct cxla_mig_ctx {
	struct cxla_mig *mig;
	enum cxla_mig_mode mode;
	unsigned long *src;
	unsigned long *dst;
	struct cxla_xpage *xp;
	struct page **pages;	/* 2 * cap: pool pages, then private pages */
	unsigned long cap;	/* pages of a window at most */
	unsigned int timeout_ms;
	bool priv;		/* to or from private pages (private.c) */
	struct page *fault_page;	/* migrate_to_ram() */
	bool intr;		/* device waits end on signals (ioctls) */
	bool dma;		/* the device copies, else the CPU */
	bool cpu_fallback;	/* to RAM: the CPU copies what the device failed */
	bool local_only;	/* to RAM: only this device's pages */
	bool system_only;	/* to the device: only from system RAM */
	bool compound;		/* 2 MiB folios may move whole (private THP) */
	bool huge;		/* this window is one 2 MiB folio or hole */
	bool fail_alloc;	/* in/out: the next destination allocation
				 * fails, then this clears (test_hmm's
				 * FAIL_ALLOC)
				 */
	struct folio *huge_dst;	/* its destination folio, or NULL: 512 pages */
	struct cxl_accel_migrate *res;	/* counters */
	u64 cpu_copied;		/* pages the CPU copied */
};

int cxla_mig_ctx_alloc(struct cxla_mig_ctx *x, unsigned long npages);
void cxla_mig_ctx_free(struct cxla_mig_ctx *x);
int cxla_mig_window(struct cxla_mig_ctx *x, struct vm_area_struct *vma,
		    unsigned long start, unsigned long end);
bool cxla_vma_migratable(struct vm_area_struct *vma, bool to_dev);
int cxla_migrate_range(struct cxla_mig_ctx *x, struct mm_struct *mm,
		       unsigned long start, unsigned long end);
long cxla_ioc_migrate(struct cxla_file *cf, void __user *arg, bool to_dev);
long cxla_ioc_hmm_info(struct cxla_file *cf, void __user *arg);
#ifdef CONFIG_DEVICE_PRIVATE
vm_fault_t cxla_mig_priv_fault(struct cxla_dev *cd, struct vm_fault *vmf);
#else
#define cxla_mig_priv_fault	NULL	/* no private pages to fault */
#endif

extern const struct attribute_group cxla_mig_group;	/* sysfs */

#endif /* CXL_ACCEL_MIGRATE_H */
