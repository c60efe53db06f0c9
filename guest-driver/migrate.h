/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: page migration to device memory (migrate.c) and shared virtual
 * memory through HMM (svm.c), internal definitions.
 */
#ifndef CXL_ACCEL_MIGRATE_H
#define CXL_ACCEL_MIGRATE_H

#include <linux/bitmap.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/rwsem.h>
#include <linux/sizes.h>
#include <linux/spinlock.h>
#include <linux/types.h>
#include <linux/workqueue.h>

struct cxla_buf;
struct cxla_dev;
struct cxl_accel_migrate;
struct cxl_accel_hmm_info;
struct mm_struct;
struct vm_area_struct;
struct cxla_file;
struct cxla_req;
struct page;

/* Pool chunks: device buffers (ALLOC) carved into migration pages */
#define CXLA_CHUNK_SIZE		SZ_2M
#define CXLA_CHUNK_PAGES	(CXLA_CHUNK_SIZE >> PAGE_SHIFT)

struct cxla_mig;

struct cxla_chunk {
	struct cxla_mig *mig;
	struct cxla_buf *buf;		/* the device buffer; our reference */
	struct list_head node;		/* mig->chunks */
	unsigned long first_pfn;
	unsigned int nfree;		/* pages with refcount 0 */
	unsigned int cursor;		/* next page to look at */
	bool live;			/* on mig->chunks: hands out pages */
	unsigned int nquar;		/* free pages held back: poisoned */
	DECLARE_BITMAP(free, CXLA_CHUNK_PAGES);
	DECLARE_BITMAP(quar, CXLA_CHUNK_PAGES);
};

/* Counters (cxla_mig.stat) */
enum {
	CXLA_MS_TO_DEV,
	CXLA_MS_TO_RAM,
	CXLA_MS_EVICTED,
	CXLA_MS_CPU_EVICTED,	/* evicted by CPU copy: device gone */
	CXLA_MS_COPY_CMDS,
	CXLA_MS_COPY_FAIL,
	CXLA_MS_SVM_FAULTS,
	CXLA_MS_SVM_RETRIES,
	CXLA_MS_SVM_HITS,
	CXLA_MS_SVM_INVAL,
	CXLA_MS_SVM_INVAL_WAITS,
	CXLA_MS_SVM_MIRRORS,	/* gauge */
	CXLA_MS_CPU_FAULTS,	/* migrate_to_ram() of private pages */
	CXLA_MS_POISON_SKIPPED,	/* pages left in place: poisoned memory */
	CXLA_MS_COUNT
};

/* Per device: migration page pool and counters */
struct cxla_mig {
	struct cxla_dev *cd;
	/*
	 * Migrations and the shrinker hold it for reading; eviction (EVICT,
	 * removal) for writing, so pool chunks stay put while it walks them.
	 */
	struct rw_semaphore sem;
	struct mutex grow_lock;		/* one ALLOC for the pool at a time */
	spinlock_t lock;		/* chunks, bitmaps, page counts */
	struct list_head chunks;
	unsigned long nchunks;
	unsigned long pages_used;	/* handed out, not yet back */
	unsigned long pages_free;
	unsigned long pages_quar;	/* free but poisoned: never handed out */
	bool closed;			/* removal: no more pages handed out */
	bool coherent;			/* ZONE_DEVICE pages exist (BAR mode) */
	int node;			/* NUMA mode: node of device memory */
	struct work_struct shrink_work;
	/* address spaces that migrated pages here, for eviction */
	struct mutex mm_lock;
	struct list_head mms;
	unsigned int nmms;
	/* every device, for classifying pages (cxla_mig_devs) */
	struct list_head reg;
	phys_addr_t mem_start;
	phys_addr_t mem_end;		/* exclusive; 0 = not registered */
	atomic64_t stat[CXLA_MS_COUNT];
};

/* Where a page is (cxla_page_owner_dev) */
enum {
	CXLA_ON_RAM,		/* system RAM or any other memory */
	CXLA_ON_LOCAL,		/* this device's memory */
	CXLA_ON_PEER,		/* another cxl-accel device's memory */
};

/*
 * Page references a device command holds while it lives: the device may
 * write them until it completes, also after a timeout (quarantine).
 */
struct cxla_page_hold {
	unsigned int n;
	unsigned int max;
	struct page *pages[];
};

extern u8 cxla_pgmap_owner;	/* dev_pagemap.owner of every cxl-accel device */

/* Limits shared by the migration files */
#define CXLA_MIG_WINDOW		4096UL	/* pages per migrate_vma_setup() */
#define CXLA_EVICT_SCAN		512UL	/* pages per look at page tables */
#define CXLA_COPY_MAX_ORDER	(21 - PAGE_SHIFT)	/* 2 MiB pages at most */
#define CXLA_MAX_NOINTR		(30 * HZ)
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
	struct folio *huge_dst;	/* its destination folio, or NULL: 512 pages */
	struct cxl_accel_migrate *res;	/* counters */
	u64 cpu_copied;		/* pages the CPU copied */
};

/* pool.c */
int cxla_mig_init(struct cxla_dev *cd);
void cxla_mig_register(struct cxla_dev *cd, phys_addr_t start, u64 size,
		       bool coherent, int node);
void cxla_mig_unregister(struct cxla_mig *mig);
void cxla_mig_free(struct cxla_dev *cd);
void cxla_pool_page_free(struct cxla_buf *buf, struct page *page);
unsigned long cxla_pool_get(struct cxla_mig *mig, unsigned long n,
			    struct page **pages, int *err);
unsigned long cxla_pool_shrink(struct cxla_mig *mig);
struct page *cxla_pool_get_chunk(struct cxla_mig *mig);
unsigned long cxla_pool_mapped(struct cxla_mig *mig, bool skip_poisoned);
unsigned long cxla_pool_poisoned_used(struct cxla_mig *mig);
void cxla_pool_poison(struct cxla_mig *mig, u64 start, u64 end);
void cxla_pool_unpoison(struct cxla_mig *mig);
void cxla_pool_poison_info(struct cxla_mig *mig, struct cxl_accel_hmm_info *h);
bool cxla_mem_poisoned(phys_addr_t pa);
int cxla_page_owner_dev(struct cxla_dev *cd, struct page *page);
int cxla_page_dev_addr(struct cxla_dev *cd, struct page *page, u64 *addr,
		       u16 *space);
struct cxla_page_hold *cxla_page_hold_alloc(unsigned int max);
void cxla_page_hold_free(struct cxla_page_hold *h);
void cxla_req_set_hold(struct cxla_req *req, struct cxla_page_hold *h);

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
extern const struct attribute_group cxla_mig_group;

/* evict.c */
void cxla_mig_track_mm(struct cxla_mig *mig, struct mm_struct *mm);
void cxla_mig_forget_mms(struct cxla_mig *mig);
long cxla_ioc_evict(struct cxla_file *cf, void __user *arg);
int cxla_evict_device(struct cxla_dev *cd);
void cxla_mig_evict_all(struct cxla_dev *cd);
void cxla_mig_teardown(struct cxla_dev *cd);
void cxla_mig_final_shrink(struct cxla_dev *cd);

/* numa.c */
int cxla_numa_init(struct cxla_dev *cd);

/* private.c */
extern bool cxla_private_memory;
#ifdef CONFIG_DEVICE_PRIVATE
int cxla_priv_init(struct cxla_dev *cd);
void cxla_priv_teardown(struct cxla_dev *cd);
bool cxla_page_is_priv(struct cxla_dev *cd, struct page *page);
void *cxla_priv_owner(struct cxla_dev *cd);
struct page *cxla_priv_backing(struct page *page);
unsigned long cxla_priv_used(struct cxla_dev *cd);
unsigned long cxla_priv_mapped(struct cxla_dev *cd, bool skip_poisoned);
void cxla_priv_pfns(struct cxla_dev *cd, unsigned long *first,
		    unsigned long *last);
unsigned long cxla_priv_get(struct cxla_dev *cd, unsigned long n,
			    struct page **pages, struct page **backing,
			    int *err);
#ifdef CXLA_PRIVATE_THP
struct page *cxla_priv_get_huge(struct cxla_dev *cd, struct page **first);
#endif
#else
static inline int cxla_priv_init(struct cxla_dev *cd) { return 0; }
static inline void cxla_priv_teardown(struct cxla_dev *cd) { }
static inline bool cxla_page_is_priv(struct cxla_dev *cd, struct page *page)
{
	return false;
}
static inline void *cxla_priv_owner(struct cxla_dev *cd) { return NULL; }
static inline struct page *cxla_priv_backing(struct page *page)
{
	return page;
}
static inline unsigned long cxla_priv_used(struct cxla_dev *cd) { return 0; }
static inline unsigned long cxla_priv_mapped(struct cxla_dev *cd,
					     bool skip_poisoned)
{
	return 0;
}
static inline void cxla_priv_pfns(struct cxla_dev *cd, unsigned long *first,
				  unsigned long *last)
{
	*first = 0;
	*last = 0;
}
static inline unsigned long cxla_priv_get(struct cxla_dev *cd, unsigned long n,
					  struct page **pages,
					  struct page **backing, int *err)
{
	*err = -EOPNOTSUPP;
	return 0;
}
#endif

/* svm.c */
struct hmm_range;
int cxla_hmm_fault_locked(struct hmm_range *range, struct mm_struct *mm,
			  struct mutex *lock, unsigned int timeout_ms);
long cxla_ioc_svm(struct cxla_file *cf, void __user *arg);
long cxla_ioc_snapshot(struct cxla_file *cf, void __user *arg);
long cxla_ioc_pin_checksum(struct cxla_file *cf, void __user *arg);
void cxla_svm_release(struct cxla_file *cf);

#endif /* CXL_ACCEL_MIGRATE_H */
