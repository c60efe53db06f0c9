/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: page migration between RAM and device memory: the windows of
 * migrate_vma and the MIGRATE ioctls (migrate.c), the device's copies of
 * their pages (xcopy.c).
 */
#ifndef CXL_ACCEL_MIGRATE_H
#define CXL_ACCEL_MIGRATE_H

#include <linux/compiler.h>
#include <linux/types.h>

struct cxl_accel_migrate;
struct cxla_file;
struct cxla_mig;
struct folio;
struct mm_struct;
struct page;
struct vm_area_struct;

/* Limits shared by the migration files */
#define CXLA_MIG_WINDOW		4096UL	/* pages per migrate_vma_setup() */
#define CXLA_MIG_MAX_TIMEOUT_MS	30000	/* per command of a migration ioctl */

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

/* xcopy.c */
int cxla_xcopy(struct cxla_mig *mig, struct cxla_xpage *xp, unsigned int n,
	       unsigned int timeout_ms, bool intr);

/* migrate.c */
int cxla_mig_ctx_alloc(struct cxla_mig_ctx *x, unsigned long npages);
void cxla_mig_ctx_free(struct cxla_mig_ctx *x);
int cxla_mig_window(struct cxla_mig_ctx *x, struct vm_area_struct *vma,
		    unsigned long start, unsigned long end);
bool cxla_vma_migratable(struct vm_area_struct *vma, bool to_dev);
int cxla_migrate_range(struct cxla_mig_ctx *x, struct mm_struct *mm,
		       unsigned long start, unsigned long end);
long cxla_ioc_migrate(struct cxla_file *cf, void __user *arg, bool to_dev);
long cxla_ioc_hmm_info(struct cxla_file *cf, void __user *arg);

#endif /* CXL_ACCEL_MIGRATE_H */
