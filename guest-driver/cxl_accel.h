/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel guest driver: the structures every part uses: a device (struct
 * cxla_dev), an open file of it (struct cxla_file). Each .c file declares
 * what it offers in a header of its own (foo.c: foo.h), included only where
 * used; the files are in layers (README.md); compat.h spells kernel
 * interfaces that changed.
 */
#ifndef CXL_ACCEL_H
#define CXL_ACCEL_H

#include <linux/atomic.h>
#include <linux/cdev.h>
#include <linux/device.h>
#include <linux/list.h>
#include <linux/memremap.h>
#include <linux/mutex.h>
#include <linux/range.h>
#include <linux/rwsem.h>
#include <linux/spinlock.h>
#include <linux/types.h>
#include <linux/wait.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>

#include "cxl_accel_proto.h"
#include "uapi/cxl_accel.h"

#define CXLA_NAME		"cxl-accel"
#define CXLA_MAX_DEVICES	64
#define CXLA_EVENT_RING		256	/* events remembered for readers */
#define CXLA_EVT_HANDLERS	8	/* event types a part may handle */
#define CXLA_MAX_HANDLE		((1U << 23) - 1)
#define CXLA_DMABUF_NSTATS	10	/* counters of dmabuf.c */

struct cxla_cmdq;
struct cxla_badrange;
struct cxla_devmem_hooks;
struct cxla_mig;
struct cxla_poison;
struct cxla_priv;
struct cxla_svm_file;
struct pci_dev;
struct virtio_device;
struct virtqueue;

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
	/*
	 * A function reset (main.c's reset_prepare .. reset_done): faults and
	 * migrations wait (set under map_sem and the pool's sem for writing),
	 * commands wait while cmds_held (set under every queue's lock); all
	 * wait on unpaused.
	 */
	bool resetting;
	bool cmds_held;
	struct task_struct *reset_owner;	/* submits while cmds_held */
	wait_queue_head_t unpaused;
	bool mem_enabled;		/* we enabled mem_pdev (not virtio-pci) */
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
	/* what a part does on an event type (cxla_evt_set_handler) */
	void (*evt_handler[CXLA_EVT_HANDLERS])(struct cxla_dev *cd);

	/* device memory */
	struct pci_dev *mem_pdev;	/* the function whose BAR is the memory */
	int mem_bar;			/* that BAR */
	struct list_head mem_node;	/* cxla_mem_devs while mem_pdev is held */
	phys_addr_t devmem_gpa;
	u64 devmem_bus;			/* devmem_gpa as peers address it */
	/* CXL Type-2 endpoint (cxl.c) */
	struct range cxl_range;		/* the region's host-physical range */
	int cxl_status;			/* 0: region attached, else why not */
	bool cxl_backed;		/* the region's range reaches device memory */
	void *p2p_provider;		/* PCI P2PDMA provider of the BAR, or NULL */
	struct dev_pagemap pgmap;
	const struct cxla_devmem_hooks *devmem_hooks;	/* the pool's (devmem.h) */
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

	struct cxla_mig *mig;		/* migration pool, counters (pool.c) */
	struct cxla_priv *priv;		/* private device pages (private.c) */
	struct cxla_poison *poison;	/* poison events (poison.c) */
	struct cxla_badrange *bad;	/* poisoned ranges (badrange.c) */
	struct cxla_ras *ras;		/* CXL RAS registers (ras.c), or NULL */
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

#endif /* CXL_ACCEL_H */
