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

struct cxla_buf;
struct cxla_chunk;
struct cxla_dev;
struct cxla_file;
struct page;

#define CXLA_DEVMEM_ALIGN	SZ_2M	/* memremap_pages granularity */

/* dev_pagemap.owner of every cxl-accel device's coherent pages */
extern u8 cxla_pgmap_owner;

/*
 * What the part that carves device memory into pages of its own (the
 * migration pool, pool.c) needs from here, as hooks it sets: a page of one
 * of its buffers (buf->chunk set) came back, and the memory is about to be
 * unmapped (the last moment to give emptied buffers back to the device).
 */
struct cxla_devmem_hooks {
	void (*page_free)(struct cxla_buf *buf, struct page *page);
	void (*unmapping)(struct cxla_dev *cd);
};

extern bool cxla_unloading;	/* module exit runs */

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
bool cxla_devmem_before_reset(struct cxla_dev *cd);
void cxla_devmem_reset_grace(struct cxla_dev *cd);
bool cxla_devmem_teardown(struct cxla_dev *cd);
void cxla_devmem_release_pci(struct cxla_dev *cd);
int cxla_devmem_notifier_register(void);
void cxla_devmem_notifier_unregister(void);
int cxla_buf_alloc(struct cxla_dev *cd, u64 size, u64 align,
		   struct cxla_buf **out);
void cxla_buf_put(struct cxla_buf *buf);
void cxla_buf_put_async(struct cxla_buf *buf);
static inline void cxla_buf_get(struct cxla_buf *buf)
{
	kref_get(&buf->ref);
}

bool cxla_page_is_ours(struct cxla_dev *cd, struct page *page);
struct page *cxla_buf_page(struct cxla_buf *buf, unsigned long idx);
struct cxla_buf *cxla_file_buf_get(struct cxla_file *cf, u32 handle);
void cxla_zap_mappings(struct cxla_dev *cd);
int cxla_map_read_lock(struct cxla_dev *cd);
int cxla_set_devmem_base(struct cxla_dev *cd);

/* numa.c */
#endif /* CXL_ACCEL_DEVMEM_H */
