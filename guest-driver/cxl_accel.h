/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel guest driver: internal definitions.
 */
#ifndef CXL_ACCEL_H
#define CXL_ACCEL_H

#include <linux/cdev.h>
#include <linux/device.h>
#include <linux/memremap.h>
#include <linux/mutex.h>
#include <linux/rwsem.h>
#include <linux/spinlock.h>
#include <linux/types.h>
#include <linux/virtio.h>
#include <linux/wait.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>

#include "compat.h"
#include "cxl_accel_proto.h"
#include "uapi/cxl_accel.h"

#define CXLA_NAME		"cxl-accel"
#define CXLA_MAX_DEVICES	64
#define CXLA_EVENT_BUFS		32	/* buffers posted on the event queue */
#define CXLA_EVENT_RING		256	/* events remembered for readers */
#define CXLA_MAX_HANDLE		((1U << 23) - 1)
#define CXLA_MMAP_PGSHIFT	(CXL_ACCEL_MMAP_SHIFT - PAGE_SHIFT)
#define CXLA_DEVMEM_ALIGN	SZ_2M	/* memremap_pages granularity */
#define CXLA_DMABUF_NSTATS	10	/* counters of dmabuf.c */
/* the highest status the protocol defines: above it, a protocol error */
#define CXLA_S_LAST		CXLA_S_MEDIA_ERROR

/* ivshmem-plain, the function that carries the device memory BAR */
#define CXLA_IVSHMEM_VENDOR	0x1af4
#define CXLA_IVSHMEM_DEVICE	0x1110
#define CXLA_IVSHMEM_BAR	2

extern unsigned int cxla_cmd_timeout_ms;
extern unsigned int cxla_poll_us;
extern bool cxla_unloading;	/* module exit runs */
extern struct workqueue_struct *cxla_wq;

struct cxla_req;

#define CXLA_REQ_INLINE		256	/* request + response bytes inside the request */
/* data commands moving at most this much are polled for (the daemon runs them inline) */
#define CXLA_POLL_BYTES		SZ_64K
#define CXLA_REQ_CACHE		16	/* small requests kept per queue for reuse */
#define CXLA_POLL_MAX_US	1000	/* poll_us is capped: preemption is off */

/*
 * A command queue. Each CPU submits on one of them (cxla_cmdq_here()), so
 * threads on different CPUs take different locks and notify different
 * rings.
 */
struct cxla_cmdq {
	struct cxla_dev *cd;
	struct virtqueue *vq;
	unsigned int size;		/* of the vring, kept: vq goes at removal */
	unsigned int index;		/* 0 .. nr_cmdq - 1 */
	spinlock_t lock;		/* vq, states of its requests, pollers, cache */
	wait_queue_head_t space;	/* room in this queue */
	unsigned int pollers;		/* waiters polling: interrupts off */
	struct list_head cache;		/* free small requests */
	unsigned int ncache;
} ____cacheline_aligned_in_smp;

struct cxla_dev {
	struct device dev;		/* the char device; owns this struct */
	struct cdev cdev;
	struct virtio_device *vdev;	/* NULL once removed */
	int minor;
	bool registered;		/* cdev_device_add done */

	/* configuration read at probe */
	u64 features;
	u64 devmem_size;
	u32 num_dma_engines;
	u32 max_segments;
	u32 max_request;
	u32 page_size;
	u32 device_index;
	u32 version_minor;
	u32 read_latency_ns;
	u32 write_latency_ns;
	u32 read_bandwidth_mbs;
	u32 write_bandwidth_mbs;
	u32 num_cmd_queues;		/* offered by the device (1.1), else 1 */

	/* command queues */
	struct cxla_cmdq *cmdq;
	unsigned int nr_cmdq;
	spinlock_t cmd_lock;		/* reap_list (inside a queue's lock) */
	bool dead;			/* removing: no new ioctls or mappings */
	bool stopped;			/* queues stopped: set under every queue's lock */
	bool wedged;			/* last command timed out */
	bool indirect;			/* VIRTIO_RING_F_INDIRECT_DESC */
	atomic64_t next_tag;
	struct list_head reap_list;	/* abandoned requests given back */
	struct work_struct reap_work;

	/* event queue */
	struct virtqueue *evt_vq;
	spinlock_t evt_lock;		/* evt_vq, evt_ring, evt_head, evt_pos */
	struct cxla_event *evt_bufs;	/* CXLA_EVENT_BUFS device-written */
	struct cxl_accel_event evt_ring[CXLA_EVENT_RING];
	u64 evt_head;			/* events ever recorded */
	wait_queue_head_t evt_wait;

	/* device memory */
	struct pci_dev *mem_pdev;	/* the function whose BAR is the memory */
	int mem_bar;			/* that BAR */
	struct list_head mem_node;	/* cxla_mem_devs while mem_pdev is held */
	phys_addr_t devmem_gpa;
	u64 devmem_bus;			/* devmem_gpa as peers address it */
	void *p2p_provider;		/* PCI P2PDMA provider of the BAR, or NULL */
	struct dev_pagemap pgmap;
	bool pgmap_live;
	atomic_long_t pages_live;	/* pages of pgmap with references */
	bool devmem_orphan;		/* removed; pages_live ends the teardown */
	unsigned long devmem_unmapping;	/* bit 0: teardown started */
	struct work_struct devmem_work;	/* orphaned teardown */
	atomic_t deferred;		/* our work on cxla_wq (cxla_defer) */
	wait_queue_head_t deferred_wait;	/* deferred reached 0 */
	struct rw_semaphore map_sem;	/* page handout (fault, alloc) vs removal */
	struct mutex buf_lock;		/* bufs, nbufs, cxla_buf.pages_held */
	struct list_head bufs;
	unsigned int nbufs;

	struct mutex files_lock;	/* files */
	struct list_head files;

	/* DMA-BUF exports and imports (dmabuf.c) */
	struct mutex dmabuf_lock;	/* exports, imports */
	struct mutex export_lock;	/* export lookup and creation */
	struct list_head exports;
	struct list_head imports;
	atomic_t dmabuf_stat[CXLA_DMABUF_NSTATS];

	atomic64_t dstat[CXL_ACCEL_DSTAT_COUNT];

	struct cxla_mig *mig;		/* migration pool, counters (migrate.c) */
	struct cxla_priv *priv;		/* private device pages (private.c) */
	struct cxla_poison *poison;	/* poisoned ranges (poison.c) */
};

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
	struct cxla_chunk *chunk;	/* migration pool chunk (migrate.c) */
	bool export_fence;		/* an UNEXPORT not waited for (dmabuf.c) */
};

struct cxla_file {
	struct cxla_dev *dev;
	struct file *filp;
	struct list_head node;		/* dev->files */
	struct mutex lock;
	struct xarray bufs;		/* handle -> cxla_buf */
	u64 evt_pos;			/* next event index to read */
	u32 evt_lost;
	struct cxla_svm_file *svm;	/* device mirrors (svm.c) */
	struct xarray imports;		/* handle -> cxla_import (dmabuf.c) */
};

/* Pinned user pages attached to a request */
struct cxla_pin {
	struct page **pages;
	unsigned int npages;
	bool write;
	struct cxla_import *imp;	/* imported DMA-BUF in use (dmabuf.c) */
};

#define CXLA_REQ_PINS	2
#define CXLA_REQ_BUFS	2

enum cxla_req_state {
	CXLA_REQ_NEW,
	CXLA_REQ_INFLIGHT,
	CXLA_REQ_DONE,
	CXLA_REQ_ABANDONED,
};

struct cxla_req {
	struct list_head node;		/* reap_list, or a queue's cache */
	struct completion done;
	struct cxla_cmdq *q;		/* where it is submitted */
	enum cxla_req_state state;	/* under q->lock */
	bool cancelled;			/* device removed before completion */
	bool poll;			/* the device answers fast: poll before sleeping */
	bool small;			/* out and in point into inline[] */
	u16 opcode;
	u64 tag;
	void *out;			/* header + payload, device-readable */
	size_t out_len;
	void *in;			/* response + payload, device-writable */
	size_t in_len;
	u32 used_len;
	struct cxla_pin pins[CXLA_REQ_PINS];
	struct cxla_buf *bufs[CXLA_REQ_BUFS];
	/* owner's clean-up when the request is freed, also after quarantine */
	void (*release)(struct cxla_req *req);
	void *release_data;
	u8 inline_buf[CXLA_REQ_INLINE] __aligned(8);	/* small requests */
};

/* vq.c */
struct cxla_req *cxla_req_alloc(struct cxla_dev *cd, u16 opcode, u16 flags,
				size_t payload_len, size_t resp_payload_len);
static inline void *cxla_req_payload(struct cxla_req *req)
{
	return req->out + sizeof(struct cxla_cmd_hdr);
}

static inline struct cxla_resp *cxla_req_resp(struct cxla_req *req)
{
	return req->in;
}

void cxla_req_free(struct cxla_dev *cd, struct cxla_req *req);
/*
 * intr: the wait ends early on a signal (user commands). Driver-internal
 * commands (probe, FREE on release or removal) wait uninterruptibly, still
 * bounded by the timeout: a release running with SIGKILL pending must not
 * give up on its FREEs.
 */
int cxla_req_submit(struct cxla_dev *cd, struct cxla_req *req,
		    unsigned long deadline, bool intr);
int cxla_req_wait(struct cxla_dev *cd, struct cxla_req **reqp,
		  unsigned long timeout, bool intr);
int cxla_exec(struct cxla_dev *cd, struct cxla_req **reqp,
	      unsigned int timeout_ms, bool intr);
void cxla_req_fire_and_forget(struct cxla_dev *cd, struct cxla_req *req);
unsigned long cxla_timeout_jiffies(unsigned int timeout_ms);
int cxla_status_to_errno(u32 status);
void cxla_cmd_done(struct virtqueue *vq);
int cxla_cmdq_init(struct cxla_dev *cd, struct virtqueue **vqs, unsigned int n);
void cxla_cmdq_free(struct cxla_dev *cd);
void cxla_cmdq_stop(struct cxla_dev *cd);
void cxla_reap_work(struct work_struct *work);
void cxla_cancel_all(struct cxla_dev *cd);
int cxla_evt_init(struct cxla_dev *cd);
void cxla_evt_done(struct virtqueue *vq);
int cxla_simple_cmd(struct cxla_dev *cd, u16 opcode, const void *payload,
		    size_t len, void *resp_payload, size_t resp_len,
		    struct cxla_resp *resp_out, unsigned int timeout_ms,
		    bool intr);

/* devmem.c */
int cxla_devmem_init(struct cxla_dev *cd);
void cxla_devmem_init_dev(struct cxla_dev *cd);
void cxla_devmem_free_all(struct cxla_dev *cd);
void cxla_devmem_before_reset(struct cxla_dev *cd);
void cxla_dmabuf_p2p_init(struct cxla_dev *cd);
bool cxla_devmem_teardown(struct cxla_dev *cd);
void cxla_devmem_release_pci(struct cxla_dev *cd);
int cxla_devmem_notifier_register(void);
void cxla_devmem_notifier_unregister(void);
int cxla_buf_alloc(struct cxla_dev *cd, u64 size, u64 align,
		   struct cxla_buf **out);
void cxla_buf_put(struct cxla_buf *buf);
void cxla_buf_put_async(struct cxla_buf *buf);
void cxla_defer(struct cxla_dev *cd, struct work_struct *work);
void cxla_deferred_done(struct cxla_dev *cd);
int cxla_deferred_wait(struct cxla_dev *cd, bool intr);
static inline void cxla_buf_get(struct cxla_buf *buf)
{
	kref_get(&buf->ref);
}

bool cxla_page_is_ours(struct cxla_dev *cd, struct page *page);
struct page *cxla_buf_page(struct cxla_buf *buf, unsigned long idx);

/* ops.c */
long cxla_ioc_copy(struct cxla_file *cf, void __user *arg);
long cxla_ioc_fill(struct cxla_file *cf, void __user *arg);
long cxla_ioc_checksum(struct cxla_file *cf, void __user *arg);
long cxla_ioc_atomic(struct cxla_file *cf, void __user *arg);
void cxla_pin_release(struct cxla_pin *pin);
int cxla_pin_user(unsigned long first, unsigned long npages,
		  unsigned int gup_flags, struct page **pages);

/* cdev.c */
int cxla_chrdev_init(void);
void cxla_chrdev_exit(void);
void cxla_cdev_init_dev(struct cxla_dev *cd);
int cxla_cdev_add(struct cxla_dev *cd);
void cxla_cdev_del(struct cxla_dev *cd);
void cxla_zap_mappings(struct cxla_dev *cd);
struct cxla_dev *cxla_dev_get_by_index(unsigned int minor);
struct cxla_buf *cxla_file_buf_get(struct cxla_file *cf, u32 handle);
int cxla_identify(struct cxla_dev *cd, struct cxl_accel_identify *id,
		  bool intr);

/* dmabuf.c */
struct cxla_import;
void cxla_dmabuf_init_dev(struct cxla_dev *cd);
void cxla_dmabuf_revoke_exports(struct cxla_dev *cd);
void cxla_dmabuf_detach_imports(struct cxla_dev *cd);
void cxla_dmabuf_file_init(struct cxla_file *cf);
void cxla_dmabuf_file_release(struct cxla_file *cf);
long cxla_ioc_export_dmabuf(struct cxla_file *cf, void __user *arg);
long cxla_ioc_import_dmabuf(struct cxla_file *cf, void __user *arg);
int cxla_import_free(struct cxla_file *cf, u32 handle);
int cxla_import_operand_get(struct cxla_file *cf, u32 handle, u64 addr,
			    u64 len, struct cxla_import **out);
void cxla_import_put(struct cxla_import *imp);
int cxla_import_sges(struct cxla_dev *cd, struct cxla_import *imp, u64 off,
		     u64 len, struct cxla_pin *pin, struct cxla_sge *sge,
		     unsigned int max);
void cxla_import_unpin(struct cxla_pin *pin);
void cxla_dmabuf_zap(struct cxla_dev *cd, u64 start, u64 end);
extern const struct attribute_group cxla_dmabuf_group;

/* poison.c: poisoned device memory */
int cxla_poison_init(struct cxla_dev *cd);
void cxla_poison_kick(struct cxla_dev *cd);
void cxla_poison_stop(struct cxla_dev *cd);
void cxla_poison_free(struct cxla_dev *cd);
bool cxla_poison_hit(struct cxla_dev *cd, u64 off, u64 len);
extern const struct attribute_group cxla_poison_group;

/* test_hmm.c: the test_hmm interface (/dev/hmm_dmirror*) */
int cxla_test_hmm_init(void);
void cxla_test_hmm_exit(void);

/* sysfs.c */
extern const struct attribute_group *cxla_groups[];

static inline void cxla_dstat_inc(struct cxla_dev *cd, int idx)
{
	atomic64_inc(&cd->dstat[idx]);
}

static inline void cxla_dstat_dec(struct cxla_dev *cd, int idx)
{
	atomic64_dec(&cd->dstat[idx]);
}

static inline struct cxla_dev *to_cxla_dev(struct device *dev)
{
	return container_of(dev, struct cxla_dev, dev);
}

#include "migrate.h"	/* page migration, SVM */

#endif /* CXL_ACCEL_H */
