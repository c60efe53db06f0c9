/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: a device's migration page pool (pool.c): device buffers
 * carved into pages for migrations, the counters of migration and SVM, and
 * what a page is to a device (whose memory, what address, held by a
 * command).
 */
#ifndef CXL_ACCEL_POOL_H
#define CXL_ACCEL_POOL_H

#include <linux/atomic.h>
#include <linux/bitmap.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/rwsem.h>
#include <linux/sizes.h>
#include <linux/spinlock.h>
#include <linux/types.h>
#include <linux/workqueue.h>

struct cxl_accel_hmm_info;
struct cxla_buf;
struct cxla_dev;
struct cxla_req;
struct mm_struct;
struct page;

/* Pool chunks: device buffers (ALLOC) carved into migration pages */
#define CXLA_CHUNK_SIZE		SZ_2M
#define CXLA_CHUNK_PAGES	(CXLA_CHUNK_SIZE >> PAGE_SHIFT)

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
	CXLA_MS_CPU_COPIED,	/* small windows the CPU copied (cpu_copy_pages) */
	CXLA_MS_COPY_MISMATCH,	/* verify_copies: a destination unlike its source */
	CXLA_MS_COUNT
};

/* How long an empty pool chunk stays before it goes back to the device */
#define CXLA_POOL_LINGER	msecs_to_jiffies(250)

/* Per device: migration page pool and counters */
/*
 * Where a migration window's time goes (sysfs migration_stages): one row
 * per mode (enum cxla_mig_mode) and memory kind, coherent then private.
 */
#define CXLA_STAGE_KINDS	6
enum {
	CXLA_STAGE_WINDOWS,
	CXLA_STAGE_PAGES,	/* moved */
	CXLA_STAGE_SETUP,	/* migrate_vma_setup(): collect, unmap (ns) */
	CXLA_STAGE_DEST,	/* selection, destination pages (ns) */
	CXLA_STAGE_COPY,	/* the device's or the CPU's copy (ns) */
	CXLA_STAGE_MIGRATE,	/* migrate_vma_pages() (ns) */
	CXLA_STAGE_FINALIZE,	/* migrate_vma_finalize(): remap, free (ns) */
	CXLA_STAGE_COUNT
};

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
	struct delayed_work shrink_work;	/* empty chunks back to the device */
	/* address spaces that migrated pages here, for eviction */
	struct mutex mm_lock;
	struct list_head mms;
	unsigned int nmms;
	/* every device, for classifying pages (cxla_mig_devs) */
	struct list_head reg;
	phys_addr_t mem_start;
	phys_addr_t mem_end;		/* exclusive; 0 = not registered */
	atomic64_t stat[CXLA_MS_COUNT];
	/* migration_stages: per kind of window, counts and time per stage */
	atomic64_t stage[CXLA_STAGE_KINDS][CXLA_STAGE_COUNT];
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


int cxla_mig_init(struct cxla_dev *cd);
void cxla_mig_register(struct cxla_dev *cd, phys_addr_t start, u64 size,
		       bool coherent, int node);
void cxla_mig_unregister(struct cxla_mig *mig);
void cxla_mig_free(struct cxla_dev *cd);
unsigned long cxla_pool_get(struct cxla_mig *mig, unsigned long n,
			    struct page **pages, int *err);
unsigned long cxla_pool_shrink(struct cxla_mig *mig);
bool cxla_pool_linger_end(struct cxla_mig *mig);
int cxla_pool_settle(struct cxla_dev *cd, bool intr);
void cxla_pool_track_mm(struct cxla_mig *mig, struct mm_struct *mm);
struct mm_struct **cxla_pool_mms(struct cxla_mig *mig, unsigned int *n);
struct page *cxla_pool_get_chunk(struct cxla_mig *mig);
unsigned long cxla_pool_mapped(struct cxla_mig *mig, bool skip_poisoned);
unsigned long cxla_pool_poisoned_used(struct cxla_mig *mig);
void cxla_pool_poison(struct cxla_mig *mig, u64 start, u64 end);
void cxla_pool_unpoison(struct cxla_mig *mig);
void cxla_pool_poison_info(struct cxla_mig *mig, struct cxl_accel_hmm_info *h);
bool cxla_mem_poisoned(phys_addr_t pa);
int cxla_page_owner_dev(struct cxla_dev *cd, struct page *page);
struct cxla_page_hold *cxla_page_hold_alloc(unsigned int max);
void cxla_page_hold_free(struct cxla_page_hold *h);
void cxla_req_set_hold(struct cxla_req *req, struct cxla_page_hold *h);

#endif /* CXL_ACCEL_POOL_H */
