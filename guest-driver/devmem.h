/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: device memory (devmem.c: the BAR or shared memory region,
 * its ZONE_DEVICE pages, removal; numa.c: the memory as a CPU-less NUMA
 * node instead) and the buffers carved from it.
 */
#ifndef CXL_ACCEL_DEVMEM_H
#define CXL_ACCEL_DEVMEM_H

#include <linux/atomic.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/sizes.h>
#include <linux/types.h>
#include <linux/workqueue.h>

struct cxla_chunk;
struct cxla_dev;
struct page;

#define CXLA_DEVMEM_ALIGN	SZ_2M	/* memremap_pages granularity */

extern bool cxla_unloading;	/* module exit runs */
extern struct workqueue_struct *cxla_wq;	/* deferred work (main.c) */

/* A device-memory buffer */
struct cxla_buf {
	struct kref ref;		/* file handle, mappings, requests */
	struct cxla_dev *dev;		/* holds a device reference */
	struct list_head node;		/* dev->bufs */
	u64 id;				/* device buffer id */
	u64 offset;			/* in device memory */
	u64 size;			/* multiple of PAGE_SIZE */
	unsigned long npages;
	bool pages_held;		/* our reference on each page */
	bool dev_freed;			/* FREE sent (removal) */
	/* pages not yet given back by the mm, plus one while ref > 0 */
	atomic_long_t pages_out;
	struct work_struct release_work;	/* last reference, deferred */
	struct work_struct finish_work;		/* last page back, deferred */
	struct cxla_chunk *chunk;	/* migration pool chunk (pool.c) */
	bool export_fence;		/* an UNEXPORT not waited for (dmabuf.c) */
};

int cxla_devmem_init(struct cxla_dev *cd);
void cxla_devmem_init_dev(struct cxla_dev *cd);
void cxla_devmem_free_all(struct cxla_dev *cd);
void cxla_devmem_before_reset(struct cxla_dev *cd);
bool cxla_devmem_teardown(struct cxla_dev *cd);
void cxla_devmem_release_pci(struct cxla_dev *cd);
int cxla_devmem_notifier_register(void);
void cxla_devmem_notifier_unregister(void);
int cxla_buf_alloc(struct cxla_dev *cd, u64 size, u64 align,
		   struct cxla_buf **out);
void cxla_buf_put(struct cxla_buf *buf);
void cxla_buf_put_async(struct cxla_buf *buf);
void cxla_defer(struct cxla_dev *cd, struct work_struct *work);
void cxla_defer_delayed(struct cxla_dev *cd, struct delayed_work *dwork,
			unsigned long delay);
void cxla_deferred_done(struct cxla_dev *cd);
int cxla_deferred_wait(struct cxla_dev *cd, bool intr);
static inline void cxla_buf_get(struct cxla_buf *buf)
{
	kref_get(&buf->ref);
}

bool cxla_page_is_ours(struct cxla_dev *cd, struct page *page);
struct page *cxla_buf_page(struct cxla_buf *buf, unsigned long idx);

/* numa.c */
int cxla_numa_init(struct cxla_dev *cd);

#endif /* CXL_ACCEL_DEVMEM_H */
