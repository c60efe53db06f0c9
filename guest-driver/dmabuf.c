// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: DMA-BUF export and import, peer-to-peer between devices.
 *
 * Export. A device-memory buffer becomes a DMA-BUF (virtio_dma_buf_export,
 * so that virtio drivers can ask for its UUID). The DMA-BUF holds a
 * reference on the buffer; the buffer's pages, mapped through the DMA-BUF
 * with vm_insert_page() like the driver's own mmap, hold theirs: device
 * memory goes back to the device only when the DMA-BUF, every mapping and
 * every other handle are gone. The driver picks a random UUID for each
 * export and tells the device (EXPORT, UNEXPORT at release): the device
 * protocol names exported buffers by UUIDs chosen by the driver, and the
 * host side (vhost-user shared objects) uses them.
 *
 * The exporter is dynamic (pin/unpin, move_notify), although device memory
 * never moves: the only "move" is revocation, when the exporting device is
 * removed. Mappings for importers:
 *  - peer-to-peer, when the importer allows it and can reach the BAR: an
 *    sg_table without pages whose DMA addresses are bus addresses of the
 *    BAR, like a P2P VRAM export. Where the kernel has PCI P2PDMA (7.x),
 *    through its provider for the BAR (pcim_p2pdma_provider; no pgmap of
 *    its own, so it sits beside ours): pci_p2pdma_distance() decides who
 *    may (on QEMU's q35, devices behind one PCIe switch; the root bus's
 *    host bridge is on no allowlist) and dma_buf_phys_vec_to_sgt() makes
 *    the table. Without it (6.12), PCI devices under the same host bridge
 *    with no IOMMU translating for them;
 *  - otherwise the coherent ZONE_DEVICE pages, mapped with
 *    dma_map_sgtable() like system memory (they are CPU memory with struct
 *    pages, which is what CXL Type-2 memory is).
 *
 * Import. Any DMA-BUF is attached dynamically (dma_buf_dynamic_attach with
 * move_notify, peer2peer allowed) to the PCI function that issues our DMA,
 * mapped, and its DMA addresses are sent to the device as guest-physical
 * ranges (addresses in our own BAR as device-memory offsets). The device
 * takes guest-physical addresses, so an IOMMU translating for it is refused.
 *
 * Import life cycle. struct cxla_import is refcounted (handle, commands
 * being built, requests at the device). Its mapping (sgt) is read under
 * map_lock while segments are built; every request built from it counts in
 * dma_users until it is freed (completed, or reaped from quarantine).
 * Invalidation (move_notify from the exporter, with the reservation lock
 * held, or detach) takes the mapping away under map_lock, waits - bounded -
 * for dma_users to drain, then unmaps. Commands never hold the reservation
 * lock while they wait for the device, and they map only before the first
 * request of a transfer exists, so an exporter waiting in move_notify can
 * not deadlock with them.
 *
 * Removal of the exporting device revokes its DMA-BUFs (move_notify to
 * dynamic importers, their later maps fail with -ENODEV, CPU mappings
 * zapped); removal of an importing device detaches its imports. Module
 * unload is refused while a DMA-BUF exported by it lives: dma_buf_export()
 * holds a module reference for each.
 */
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/file.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/uuid.h>
#include <linux/virtio_dma_buf.h>

#include "cxl_accel.h"
#include "badrange.h"
#include "compat.h"
#include "core.h"
#include "devmem.h"
#include "dmabuf.h"
#include "vq.h"
#ifdef CXLA_P2P_PROVIDER	/* compat.h decides */
#include <linux/dma-buf-mapping.h>
#include <linux/pci-p2pdma.h>
#endif

CXLA_IMPORT_NS(DMA_BUF);

/* Bound of the wait for an importer's commands on an invalidated mapping */
#define CXLA_DRAIN_MAX_JIFFIES	(10 * HZ)

static bool cxla_dmabuf_p2p = true;
module_param_named(dmabuf_p2p, cxla_dmabuf_p2p, bool, 0644);
MODULE_PARM_DESC(dmabuf_p2p,
		 "Give peer-to-peer importers of exported DMA-BUFs bus addresses (else map the device pages through the DMA API)");

/* Per-device counters (sysfs dmabuf/), indices of cd->dmabuf_stat */
enum {
	CXLA_DB_EXPORTS,		/* live DMA-BUFs exported */
	CXLA_DB_EXPORTS_TOTAL,		/* DMA-BUFs ever exported */
	CXLA_DB_ATTACHMENTS,		/* live attachments to them */
	CXLA_DB_P2P_ATTACHMENTS,	/* of which peer-to-peer */
	CXLA_DB_MAPPINGS,		/* live sg_table mappings of them */
	CXLA_DB_PINS,			/* live pins */
	CXLA_DB_REVOKED,		/* DMA-BUFs revoked at removal */
	CXLA_DB_IMPORTS,		/* live imports held by this device */
	CXLA_DB_IMPORTS_MAPPED,		/* of which mapped now */
	CXLA_DB_MOVE_NOTIFY,		/* invalidations received */
	CXLA_DB_COUNT
};

static_assert(CXLA_DB_COUNT == CXLA_DMABUF_NSTATS);

/* Module-wide, including devices already removed (leak checks) */
static atomic_t cxla_all_exports = ATOMIC_INIT(0);
static atomic_t cxla_all_attachments = ATOMIC_INIT(0);
static atomic_t cxla_all_imports = ATOMIC_INIT(0);

/* A buffer being released while it is exported again */
static DECLARE_WAIT_QUEUE_HEAD(cxla_export_wq);

struct cxla_exported {
	struct list_head node;		/* cd->exports, under dmabuf_lock */
	struct cxla_buf *buf;		/* holds a buffer reference */
	struct dma_buf *dmabuf;
	uuid_t uuid;
	u64 bus_addr;			/* bus address of the buffer */
	bool revoked;			/* set under dmabuf->resv, then stays */
	bool revoke_seen;		/* removal walk, under dmabuf_lock */
};

struct cxla_import {
	struct kref ref;		/* handle, operands, requests */
	struct cxla_dev *cd;		/* holds a device reference */
	struct device *dma_dev;		/* attached device, holds a reference */
	struct list_head node;		/* cd->imports, under dmabuf_lock */
	bool removal_seen;		/* removal walk, under dmabuf_lock */
	struct dma_buf *dmabuf;		/* holds a file reference */
	struct dma_buf_attachment *attach;
	bool detached;			/* under dmabuf->resv */
	struct mutex map_lock;		/* sgt, invalid */
	struct sg_table *sgt;		/* current mapping, or NULL */
	bool invalid;			/* moved, revoked or detached */
	atomic_t dma_users;		/* requests built from the mapping */
	wait_queue_head_t drain;
	u64 size;
	u32 kind;			/* CXL_ACCEL_IMPORT_* */
	u32 attach_flags;		/* CXL_ACCEL_IMPORT_P2P, _DYNAMIC */
};

static void cxla_db_inc(struct cxla_dev *cd, int idx)
{
	atomic_inc(&cd->dmabuf_stat[idx]);
}

static void cxla_db_dec(struct cxla_dev *cd, int idx)
{
	atomic_dec(&cd->dmabuf_stat[idx]);
}

void cxla_dmabuf_init_dev(struct cxla_dev *cd)
{
	int i;

	mutex_init(&cd->dmabuf_lock);
	mutex_init(&cd->export_lock);
	INIT_LIST_HEAD(&cd->exports);
	INIT_LIST_HEAD(&cd->imports);
	for (i = 0; i < CXLA_DB_COUNT; i++)
		atomic_set(&cd->dmabuf_stat[i], 0);
}

/*
 * A reference on a DMA-BUF whose file may be in its last fput (its release
 * callback has not run yet, so the file is still there). Like the dma-buf
 * core's own list walkers; get_file_active() would spin here, since the
 * file pointer never changes.
 */
static bool cxla_dmabuf_tryget(struct dma_buf *dmabuf)
{
	return cxla_file_tryget(dmabuf->file);
}

/* ------------------------------------------------------------- exporter */

static const struct virtio_dma_buf_ops cxla_dmabuf_ops;

static bool cxla_is_our_dmabuf(struct dma_buf *dmabuf)
{
	return dmabuf->ops == &cxla_dmabuf_ops.ops;
}

static struct cxla_dev *cxla_export_dev(struct cxla_exported *exp)
{
	return exp->buf->dev;
}

/*
 * The BAR as a PCI P2PDMA provider, where the kernel has them. The
 * provider is devres of the memory function: in shmem attach that is the
 * virtio function, bound to virtio-pci for longer than we are; in bar
 * attach the ivshmem function, which no other driver may bind afterwards.
 */
void cxla_dmabuf_p2p_init(struct cxla_dev *cd)
{
#ifdef CXLA_P2P_PROVIDER
	int ret = pcim_p2pdma_init(cd->mem_pdev);

	if (ret) {
		dev_info(&cd->vdev->dev,
			 "no PCI P2PDMA provider for %s (%d): peer-to-peer by host bridge\n",
			 pci_name(cd->mem_pdev), ret);
		return;
	}
	cd->p2p_provider = pcim_p2pdma_provider(cd->mem_pdev, cd->mem_bar);
#endif
}

/*
 * Can dev reach our BAR by bus address? With a P2PDMA provider the
 * kernel's distance says; without (6.12 has no PCI_P2PDMA) accept PCI
 * devices under the same host bridge with no IOMMU translation between.
 */
static bool cxla_p2p_reachable(struct cxla_dev *cd, struct device *dev)
{
	struct pci_dev *mem = READ_ONCE(cd->mem_pdev);

	if (!mem || !dev_is_pci(dev))
		return false;
#ifdef CXLA_P2P_PROVIDER
	if (cd->p2p_provider)
		return pci_p2pdma_distance(mem, dev, false) >= 0;
#endif
	if (device_iommu_mapped(dev))
		return false;
	return pci_find_host_bridge(to_pci_dev(dev)->bus) ==
	       pci_find_host_bridge(mem->bus);
}

static int cxla_dmabuf_device_attach(struct dma_buf *dmabuf,
				     struct dma_buf_attachment *attach)
{
	struct cxla_exported *exp = dmabuf->priv;
	struct cxla_dev *cd = cxla_export_dev(exp);

	if (READ_ONCE(exp->revoked) || READ_ONCE(cd->dead))
		return -ENODEV;
	if (attach->peer2peer &&
	    (!READ_ONCE(cxla_dmabuf_p2p) || !cxla_p2p_reachable(cd, attach->dev)))
		attach->peer2peer = false;
	cxla_db_inc(cd, CXLA_DB_ATTACHMENTS);
	if (attach->peer2peer)
		cxla_db_inc(cd, CXLA_DB_P2P_ATTACHMENTS);
	atomic_inc(&cxla_all_attachments);
	return 0;
}

static void cxla_dmabuf_detach(struct dma_buf *dmabuf,
			       struct dma_buf_attachment *attach)
{
	struct cxla_exported *exp = dmabuf->priv;
	struct cxla_dev *cd = cxla_export_dev(exp);

	cxla_db_dec(cd, CXLA_DB_ATTACHMENTS);
	if (attach->peer2peer)
		cxla_db_dec(cd, CXLA_DB_P2P_ATTACHMENTS);
	atomic_dec(&cxla_all_attachments);
}

/* Device memory never moves: pinning only refuses revoked buffers. */
static int cxla_dmabuf_pin(struct dma_buf_attachment *attach)
{
	struct cxla_exported *exp = attach->dmabuf->priv;

	if (exp->revoked)
		return -ENODEV;
	cxla_db_inc(cxla_export_dev(exp), CXLA_DB_PINS);
	return 0;
}

static void cxla_dmabuf_unpin(struct dma_buf_attachment *attach)
{
	struct cxla_exported *exp = attach->dmabuf->priv;

	cxla_db_dec(cxla_export_dev(exp), CXLA_DB_PINS);
}

static struct sg_table *cxla_dmabuf_map(struct dma_buf_attachment *attach,
					enum dma_data_direction dir)
{
	struct cxla_exported *exp = attach->dmabuf->priv;
	struct cxla_buf *buf = exp->buf;
	unsigned int seg, i;
	struct scatterlist *sg;
	struct sg_table *sgt;
	int ret;

	dma_resv_assert_held(attach->dmabuf->resv);
	if (exp->revoked)
		return ERR_PTR(-ENODEV);
#ifdef CXLA_P2P_PROVIDER
	if (attach->peer2peer && cxla_export_dev(exp)->p2p_provider) {
		struct cxla_dev *cd = cxla_export_dev(exp);
		struct phys_vec range = {
			.paddr = cd->devmem_gpa + buf->offset,
			.len = buf->size,
		};

		sgt = dma_buf_phys_vec_to_sgt(attach, cd->p2p_provider, &range,
					      1, buf->size, dir);
		if (!IS_ERR(sgt))
			cxla_db_inc(cd, CXLA_DB_MAPPINGS);
		return sgt;
	}
#endif

	/* page-sized multiples within the importer's segment limit */
	seg = max_t(unsigned int, PAGE_SIZE,
		    rounddown(dma_get_max_seg_size(attach->dev), PAGE_SIZE));
	sgt = kzalloc(sizeof(*sgt), GFP_KERNEL);
	if (!sgt)
		return ERR_PTR(-ENOMEM);
	ret = sg_alloc_table(sgt, DIV_ROUND_UP_ULL(buf->size, seg), GFP_KERNEL);
	if (ret)
		goto err_free;

	for_each_sgtable_sg(sgt, sg, i) {
		u64 off = (u64)i * seg;
		unsigned int len = min_t(u64, seg, buf->size - off);

		if (attach->peer2peer) {
			/* no struct pages for a P2P importer: bus addresses */
			sg_set_page(sg, NULL, len, 0);
			sg_dma_address(sg) = exp->bus_addr + off;
			sg_dma_len(sg) = len;
		} else {
			sg_set_page(sg, cxla_buf_page(buf, off >> PAGE_SHIFT),
				    len, 0);
		}
	}
	if (!attach->peer2peer) {
		/* coherent memory: no cache maintenance */
		ret = dma_map_sgtable(attach->dev, sgt, dir,
				      DMA_ATTR_SKIP_CPU_SYNC);
		if (ret)
			goto err_table;
	}
	cxla_db_inc(cxla_export_dev(exp), CXLA_DB_MAPPINGS);
	return sgt;

err_table:
	sg_free_table(sgt);
err_free:
	kfree(sgt);
	return ERR_PTR(ret);
}

static void cxla_dmabuf_unmap(struct dma_buf_attachment *attach,
			      struct sg_table *sgt,
			      enum dma_data_direction dir)
{
	struct cxla_exported *exp = attach->dmabuf->priv;

#ifdef CXLA_P2P_PROVIDER
	if (attach->peer2peer && cxla_export_dev(exp)->p2p_provider) {
		dma_buf_free_sgt(attach, sgt, dir);
		cxla_db_dec(cxla_export_dev(exp), CXLA_DB_MAPPINGS);
		return;
	}
#endif
	if (!attach->peer2peer)
		dma_unmap_sgtable(attach->dev, sgt, dir, DMA_ATTR_SKIP_CPU_SYNC);
	sg_free_table(sgt);
	kfree(sgt);
	cxla_db_dec(cxla_export_dev(exp), CXLA_DB_MAPPINGS);
}

/* CPU access is coherent: nothing to flush, only revocation to report. */
static int cxla_dmabuf_begin_cpu(struct dma_buf *dmabuf,
				 enum dma_data_direction dir)
{
	struct cxla_exported *exp = dmabuf->priv;

	return READ_ONCE(exp->revoked) ? -ENODEV : 0;
}

static int cxla_dmabuf_end_cpu(struct dma_buf *dmabuf,
			       enum dma_data_direction dir)
{
	return 0;
}

static vm_fault_t cxla_dmabuf_fault(struct vm_fault *vmf)
{
	struct cxla_exported *exp = vmf->vma->vm_private_data;
	struct cxla_buf *buf = exp->buf;
	struct cxla_dev *cd = buf->dev;
	vm_fault_t ret = VM_FAULT_SIGBUS;
	int err;

	if (vmf->pgoff >= buf->npages)
		return VM_FAULT_SIGBUS;
	err = cxla_map_read_lock(cd);
	if (err)	/* killed (no retry then), or a reset that did not end */
		return err == -EINTR ? VM_FAULT_NOPAGE : VM_FAULT_SIGBUS;
	if (!cd->dead && !READ_ONCE(exp->revoked) && buf->pages_held &&
	    cxla_badrange_hit(cd, buf->offset + ((u64)vmf->pgoff << PAGE_SHIFT),
			    PAGE_SIZE)) {
		/* a media error (poison.c): SIGBUS with BUS_MCEERR_AR */
		cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_HWPOISON);
		ret = VM_FAULT_HWPOISON;
	} else if (!cd->dead && !READ_ONCE(exp->revoked) && buf->pages_held) {
		err = vm_insert_page(vmf->vma, vmf->address,
				     cxla_buf_page(buf, vmf->pgoff));
		if (!err || err == -EBUSY)	/* -EBUSY: raced, mapped */
			ret = VM_FAULT_NOPAGE;
		else if (err == -ENOMEM)
			ret = VM_FAULT_OOM;
	}
	up_read(&cd->map_sem);
	return ret;
}

/* The VMA holds the DMA-BUF file, which holds the export and the buffer. */
static const struct vm_operations_struct cxla_dmabuf_vm_ops = {
	.fault = cxla_dmabuf_fault,
};

static int cxla_dmabuf_mmap(struct dma_buf *dmabuf, struct vm_area_struct *vma)
{
	struct cxla_exported *exp = dmabuf->priv;

	if (READ_ONCE(exp->revoked) || READ_ONCE(cxla_export_dev(exp)->dead))
		return -ENODEV;
	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;		/* a private COW copy makes no sense */
	vm_flags_set(vma, VM_MIXEDMAP | VM_DONTEXPAND | VM_DONTDUMP);
	vma->vm_private_data = exp;
	vma->vm_ops = &cxla_dmabuf_vm_ops;
	return 0;
}

static int cxla_dmabuf_get_uuid(struct dma_buf *dmabuf, uuid_t *uuid)
{
	struct cxla_exported *exp = dmabuf->priv;

	uuid_copy(uuid, &exp->uuid);
	return 0;
}

/*
 * UNEXPORT the UUID; the device forgets it anyway when the buffer is freed.
 * async: an EXPORT of it timed out or was interrupted and may still run, or
 * came back -EIO (a daemon restart: it may have run): fenced, so that it
 * runs after that EXPORT, and not waited for.
 */
static void cxla_export_unexport(struct cxla_dev *cd, struct cxla_exported *exp,
				 bool async)
{
	struct cxla_unexport *u;
	struct cxla_req *req;
	int ret, tries = 0;

	if (READ_ONCE(cd->stopped))
		return;
again:
	req = cxla_req_alloc(cd, CXLA_OP_UNEXPORT, async ? CXLA_FLAG_FENCE : 0,
			     sizeof(*u), 0);
	if (IS_ERR(req))
		return;
	u = cxla_req_payload(req);
	memcpy(u->uuid, exp->uuid.b, sizeof(u->uuid));
	if (async || READ_ONCE(cd->wedged)) {
		/* the next EXPORT of the buffer must not overtake it */
		WRITE_ONCE(exp->buf->export_fence, true);
		cxla_req_fire_and_forget(cd, req);
		return;
	}
	ret = cxla_exec(cd, &req, 0, false);
	if (!ret && le64_to_cpu(cxla_req_resp(req)->result0) != exp->buf->id) {
		/* result0 is the buffer the UUID belonged to */
		cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_PROTOCOL);
		dev_err(&cd->dev, "UNEXPORT of %pUb answers buffer %llu, exported was %llu\n",
			&exp->uuid, le64_to_cpu(cxla_req_resp(req)->result0),
			exp->buf->id);
	}
	cxla_req_free(cd, req);
	/* timed out: it may still run, after the next EXPORT unless fenced */
	if (ret == -ETIMEDOUT)
		WRITE_ONCE(exp->buf->export_fence, true);
	/*
	 * -EIO: the daemon restarted with the UNEXPORT in flight and cannot
	 * say whether it ran. Left alone, the UUID could stay on the buffer
	 * and every later EXPORT of it fail (EXISTS): ask again; -ENOENT then
	 * means the first one had run.
	 */
	if (ret == -EIO && tries++ < 3 && !READ_ONCE(cd->stopped))
		goto again;
	if (ret == -ENOENT && tries)
		ret = 0;
	if (ret && ret != -ENODEV)
		dev_warn(&cd->dev, "UNEXPORT of buffer %llu (%pUb) failed: %d\n",
			 exp->buf->id, &exp->uuid, ret);
}

/* Last reference to the DMA-BUF (file, mappings, importers) is gone. */
static void cxla_dmabuf_release(struct dma_buf *dmabuf)
{
	struct cxla_exported *exp = dmabuf->priv;
	struct cxla_dev *cd = cxla_export_dev(exp);

	/*
	 * UNEXPORT before leaving the list: an export of the same buffer
	 * waits while it finds this one on the list, and its EXPORT would be
	 * refused (EXISTS) while the device still knows the old UUID.
	 */
	if (!exp->revoked)
		cxla_export_unexport(cd, exp, false);
	mutex_lock(&cd->dmabuf_lock);
	list_del(&exp->node);
	mutex_unlock(&cd->dmabuf_lock);
	wake_up_all(&cxla_export_wq);

	cxla_db_dec(cd, CXLA_DB_EXPORTS);
	atomic_dec(&cxla_all_exports);
	/* device memory goes back once no mapping or pin holds a page */
	cxla_buf_put(exp->buf);
	kfree(exp);
}

static const struct virtio_dma_buf_ops cxla_dmabuf_ops = {
	.ops = {
		.attach = virtio_dma_buf_attach,	/* calls device_attach */
		.detach = cxla_dmabuf_detach,
		.pin = cxla_dmabuf_pin,
		.unpin = cxla_dmabuf_unpin,
		.map_dma_buf = cxla_dmabuf_map,
		.unmap_dma_buf = cxla_dmabuf_unmap,
		.release = cxla_dmabuf_release,
		.begin_cpu_access = cxla_dmabuf_begin_cpu,
		.end_cpu_access = cxla_dmabuf_end_cpu,
		.mmap = cxla_dmabuf_mmap,
	},
	.device_attach = cxla_dmabuf_device_attach,
	.get_uuid = cxla_dmabuf_get_uuid,
};

/*
 * The live DMA-BUF of buf with a new file reference, NULL if there is none,
 * or ERR_PTR(-EAGAIN) if one is being released right now.
 */
static struct dma_buf *cxla_export_lookup(struct cxla_dev *cd,
					  struct cxla_buf *buf)
{
	struct dma_buf *dmabuf = NULL;
	struct cxla_exported *exp;

	mutex_lock(&cd->dmabuf_lock);
	list_for_each_entry(exp, &cd->exports, node) {
		if (exp->buf != buf)
			continue;
		dmabuf = cxla_dmabuf_tryget(exp->dmabuf) ? exp->dmabuf :
							   ERR_PTR(-EAGAIN);
		break;
	}
	mutex_unlock(&cd->dmabuf_lock);
	return dmabuf;
}

static bool cxla_export_gone(struct cxla_dev *cd, struct cxla_buf *buf)
{
	struct cxla_exported *exp;
	bool gone = true;

	mutex_lock(&cd->dmabuf_lock);
	list_for_each_entry(exp, &cd->exports, node)
		if (exp->buf == buf)
			gone = false;
	mutex_unlock(&cd->dmabuf_lock);
	return gone;
}

/*
 * Wait until the buffer's DMA-BUF has left the list; -ERESTARTSYS on a
 * signal. The condition takes a mutex, so it is looked at while running
 * (wait_woken), not in the sleeping state wait_event() would look in.
 */
static int cxla_export_wait_gone(struct cxla_dev *cd, struct cxla_buf *buf)
{
	DEFINE_WAIT_FUNC(wait, woken_wake_function);
	int ret = 0;

	add_wait_queue(&cxla_export_wq, &wait);
	while (!cxla_export_gone(cd, buf)) {
		if (signal_pending(current)) {
			ret = -ERESTARTSYS;
			break;
		}
		wait_woken(&wait, TASK_INTERRUPTIBLE, MAX_SCHEDULE_TIMEOUT);
	}
	remove_wait_queue(&cxla_export_wq, &wait);
	return ret;
}

/* Create the DMA-BUF of a buffer; consumes the caller's buffer reference. */
static struct dma_buf *cxla_export_create(struct cxla_dev *cd,
					  struct cxla_buf *buf)
{
	DEFINE_DMA_BUF_EXPORT_INFO(info);
	struct pci_dev *mem = READ_ONCE(cd->mem_pdev);
	struct cxla_export cmd;		/* wire format: EXPORT payload */
	struct cxla_exported *exp;
	struct dma_buf *dmabuf;
	struct cxla_req *req;
	bool fence;
	int ret;

	exp = kzalloc(sizeof(*exp), GFP_KERNEL);
	if (!exp || !mem) {
		kfree(exp);
		cxla_buf_put(buf);
		return ERR_PTR(exp ? -ENODEV : -ENOMEM);
	}
	INIT_LIST_HEAD(&exp->node);
	exp->buf = buf;
	uuid_gen(&exp->uuid);
	/* what a peer puts on the bus to reach the buffer (no IOMMU) */
	exp->bus_addr = cd->devmem_bus + buf->offset;

	cmd.id = cpu_to_le64(buf->id);
	memcpy(cmd.uuid, exp->uuid.b, sizeof(cmd.uuid));
	/*
	 * An UNEXPORT of an earlier UUID of this buffer that nobody waited
	 * for (an EXPORT interrupted or timed out) may not have run yet; it
	 * is fenced behind busy engines, and later commands are not: fence
	 * this EXPORT too, or the device still sees the old UUID (EXISTS).
	 * export_lock keeps other exports of the buffer out meanwhile.
	 */
	fence = READ_ONCE(buf->export_fence);
	req = cxla_req_alloc(cd, CXLA_OP_EXPORT, fence ? CXLA_FLAG_FENCE : 0,
			     sizeof(cmd), 0);
	if (IS_ERR(req)) {
		ret = PTR_ERR(req);
		goto err_free;
	}
	memcpy(cxla_req_payload(req), &cmd, sizeof(cmd));
	ret = cxla_exec(cd, &req, 0, true);
	cxla_req_free(cd, req);		/* NULL when abandoned */
	if (!ret && fence)
		WRITE_ONCE(buf->export_fence, false);
	if (ret) {
		if (ret == -EEXIST)
			dev_err(&cd->dev,
				"EXPORT of buffer %llu: the device says it is exported already\n",
				buf->id);
		else if (ret == -ETIMEDOUT || ret == -EINTR || ret == -EIO)
			cxla_export_unexport(cd, exp, true);
		goto err_free;
	}

	info.exp_name = KBUILD_MODNAME;
	info.owner = THIS_MODULE;
	info.ops = &cxla_dmabuf_ops.ops;
	info.size = buf->size;
	info.flags = O_RDWR;
	info.priv = exp;
	dmabuf = virtio_dma_buf_export(&info);
	if (IS_ERR(dmabuf)) {
		ret = PTR_ERR(dmabuf);
		cxla_export_unexport(cd, exp, false);
		goto err_free;
	}
	exp->dmabuf = dmabuf;

	/* from here on the release callback undoes everything */
	cxla_db_inc(cd, CXLA_DB_EXPORTS);
	cxla_db_inc(cd, CXLA_DB_EXPORTS_TOTAL);
	atomic_inc(&cxla_all_exports);
	mutex_lock(&cd->dmabuf_lock);
	if (READ_ONCE(cd->dead)) {
		/* removal already walked the list: never hand it out */
		exp->revoked = true;
		mutex_unlock(&cd->dmabuf_lock);
		dma_buf_put(dmabuf);
		return ERR_PTR(-ENODEV);
	}
	list_add_tail(&exp->node, &cd->exports);
	mutex_unlock(&cd->dmabuf_lock);
	return dmabuf;

err_free:
	cxla_buf_put(buf);
	kfree(exp);
	return ERR_PTR(ret);
}

long cxla_ioc_export_dmabuf(struct cxla_file *cf, void __user *arg)
{
	struct cxla_dev *cd = cf->dev;
	struct cxl_accel_dmabuf_export e;
	struct cxla_exported *exp;
	struct dma_buf *dmabuf;
	struct cxla_buf *buf;
	int fd;

	if (copy_from_user(&e, arg, sizeof(e)))
		return -EFAULT;
	if ((e.flags & ~CXL_ACCEL_DMABUF_CLOEXEC) || e.reserved)
		return -EINVAL;
	if (!(cd->features & CXLA_F_EXPORT))
		return -EOPNOTSUPP;
	if (e.handle & CXL_ACCEL_HANDLE_IMPORTED)
		return -EINVAL;		/* an import is not ours to export */
	buf = cxla_file_buf_get(cf, e.handle);
	if (!buf)
		return -ENOENT;

	/*
	 * Lookup and creation in one go: two exports of a buffer at the same
	 * time would both find no DMA-BUF and both send EXPORT, and the
	 * device refuses the second (EXISTS), where the caller must get
	 * another fd of the first.
	 */
	if (mutex_lock_interruptible(&cd->export_lock)) {
		cxla_buf_put(buf);
		return -ERESTARTSYS;	/* nothing done yet */
	}
	for (;;) {
		dmabuf = cxla_export_lookup(cd, buf);
		if (dmabuf != ERR_PTR(-EAGAIN))
			break;
		/* its last fd is closing right now: wait for the release */
		if (cxla_export_wait_gone(cd, buf)) {
			mutex_unlock(&cd->export_lock);
			cxla_buf_put(buf);
			return -ERESTARTSYS;	/* nothing done yet */
		}
	}
	if (dmabuf)
		cxla_buf_put(buf);	/* the DMA-BUF holds its own */
	else
		dmabuf = cxla_export_create(cd, buf);
	mutex_unlock(&cd->export_lock);
	if (IS_ERR(dmabuf))
		return PTR_ERR(dmabuf);

	exp = dmabuf->priv;
	fd = get_unused_fd_flags((e.flags & CXL_ACCEL_DMABUF_CLOEXEC) ?
				 O_CLOEXEC : 0);
	if (fd < 0) {
		dma_buf_put(dmabuf);
		return fd;
	}
	e.fd = fd;
	e.size = dmabuf->size;
	memcpy(e.uuid, exp->uuid.b, sizeof(e.uuid));
	if (copy_to_user(arg, &e, sizeof(e))) {
		put_unused_fd(fd);
		dma_buf_put(dmabuf);
		return -EFAULT;
	}
	fd_install(fd, dmabuf->file);	/* takes over our reference */
	return 0;
}

/*
 * Removal of the exporting device, before its memory goes away: revoke
 * every DMA-BUF. Dynamic importers are told (move_notify) and unmap; later
 * maps, attaches, pins and CPU faults fail. Importers that pinned a static
 * mapping cannot be told: they are named in the log.
 */
void cxla_dmabuf_revoke_exports(struct cxla_dev *cd)
{
	struct dma_buf_attachment *attach;
	struct cxla_exported *exp;
	struct dma_buf *dmabuf;

	for (;;) {
		dmabuf = NULL;
		mutex_lock(&cd->dmabuf_lock);
		list_for_each_entry(exp, &cd->exports, node) {
			if (exp->revoke_seen)
				continue;
			exp->revoke_seen = true;
			if (cxla_dmabuf_tryget(exp->dmabuf)) {
				dmabuf = exp->dmabuf;
				break;
			}
		}
		mutex_unlock(&cd->dmabuf_lock);
		if (!dmabuf)
			break;

		exp = dmabuf->priv;
		dma_resv_lock(dmabuf->resv, NULL);
		WRITE_ONCE(exp->revoked, true);
		cxla_dma_buf_invalidate(dmabuf);
		list_for_each_entry(attach, &dmabuf->attachments, node)
			if (!attach->importer_ops)
				dev_warn(&cd->dev,
					 "buffer %llu revoked while %s holds a static mapping of it\n",
					 exp->buf->id, dev_name(attach->dev));
		dma_resv_unlock(dmabuf->resv);
		/* CPU mappings through the DMA-BUF fd: SIGBUS from now on */
		unmap_mapping_range(dmabuf->file->f_mapping, 0, 0, 1);
		cxla_db_inc(cd, CXLA_DB_REVOKED);
		dev_info(&cd->dev, "revoked DMA-BUF of buffer %llu (%pUb)\n",
			 exp->buf->id, &exp->uuid);
		dma_buf_put(dmabuf);
	}
}

/*
 * Poison in [start, end) of device memory (poison.c): CPU mappings through
 * DMA-BUF fds of buffers there are zapped, so that the next access faults
 * and meets the poison check. The DMA-BUFs are taken with a file reference
 * under dmabuf_lock and zapped outside it.
 */
void cxla_dmabuf_zap(struct cxla_dev *cd, u64 start, u64 end)
{
	struct cxla_exported *exp;
	struct dma_buf **list;
	unsigned int n = 0, max = 0, i;

	mutex_lock(&cd->dmabuf_lock);
	list_for_each_entry(exp, &cd->exports, node)
		max++;
	mutex_unlock(&cd->dmabuf_lock);
	if (!max)
		return;
	list = kvcalloc(max, sizeof(*list), GFP_KERNEL);
	if (!list)
		return;
	mutex_lock(&cd->dmabuf_lock);
	list_for_each_entry(exp, &cd->exports, node) {
		if (n == max)
			break;	/* exported meanwhile: not mapped yet there */
		if (exp->buf->offset >= end ||
		    exp->buf->offset + exp->buf->size <= start)
			continue;
		if (cxla_dmabuf_tryget(exp->dmabuf))
			list[n++] = exp->dmabuf;
	}
	mutex_unlock(&cd->dmabuf_lock);
	for (i = 0; i < n; i++) {
		unmap_mapping_range(list[i]->file->f_mapping, 0, 0, 1);
		dma_buf_put(list[i]);
	}
	kvfree(list);
}

/* ------------------------------------------------------------- importer */

/*
 * Take the mapping away (resv held): no new segments are built from it,
 * requests built from it are waited for, bounded, then it is unmapped.
 */
static void cxla_import_invalidate(struct cxla_import *imp)
{
	struct cxla_dev *cd = imp->cd;
	struct sg_table *sgt;
	unsigned long drain;

	dma_resv_assert_held(imp->dmabuf->resv);
	mutex_lock(&imp->map_lock);
	imp->invalid = true;
	sgt = imp->sgt;
	imp->sgt = NULL;
	mutex_unlock(&imp->map_lock);
	if (!sgt)
		return;

	drain = min_t(unsigned long, cxla_timeout_jiffies(0),
		      CXLA_DRAIN_MAX_JIFFIES);
	if (!wait_event_timeout(imp->drain, !atomic_read(&imp->dma_users),
				drain))
		dev_warn(&cd->dev,
			 "%d commands on an imported DMA-BUF still at the device %u ms after it was invalidated\n",
			 atomic_read(&imp->dma_users), jiffies_to_msecs(drain));
	dma_buf_unmap_attachment(imp->attach, sgt, DMA_BIDIRECTIONAL);
	cxla_db_dec(cd, CXLA_DB_IMPORTS_MAPPED);
}

/* The exporter moves or revokes the buffer (resv held). */
static void cxla_import_move_notify(struct dma_buf_attachment *attach)
{
	struct cxla_import *imp = attach->importer_priv;

	cxla_db_inc(imp->cd, CXLA_DB_MOVE_NOTIFY);
	cxla_import_invalidate(imp);
}

static const struct dma_buf_attach_ops cxla_importer_ops = {
	.allow_peer2peer = true,
	CXLA_ATTACH_INVALIDATE(cxla_import_move_notify),
};

/* Map (or remap after a move) and wait for fences of others' work. */
static int cxla_import_map(struct cxla_import *imp)
{
	struct dma_resv *resv = imp->dmabuf->resv;
	struct sg_table *sgt;
	long left;
	int ret;

	/* -EINTR for task work too (io_uring's): restart, nothing done yet */
	ret = dma_resv_lock_interruptible(resv, NULL);
	if (ret)
		return ret == -EINTR ? -ERESTARTSYS : ret;
	if (imp->detached) {
		ret = -ENODEV;
	} else if (!imp->sgt) {
		sgt = dma_buf_map_attachment(imp->attach, DMA_BIDIRECTIONAL);
		if (IS_ERR(sgt)) {
			ret = PTR_ERR(sgt);
		} else {
			mutex_lock(&imp->map_lock);
			imp->sgt = sgt;
			imp->invalid = false;
			mutex_unlock(&imp->map_lock);
			cxla_db_inc(imp->cd, CXLA_DB_IMPORTS_MAPPED);
		}
	}
	dma_resv_unlock(resv);
	if (ret)
		return ret;

	/* implicit sync: our commands may read and write */
	left = dma_resv_wait_timeout(resv, DMA_RESV_USAGE_READ, true,
				     cxla_timeout_jiffies(0));
	if (left < 0)
		return left;
	return left ? 0 : -ETIMEDOUT;
}

/* Detach from the exporter; the DMA-BUF reference stays until release. */
static void cxla_import_detach(struct cxla_import *imp)
{
	struct dma_resv *resv = imp->dmabuf->resv;

	dma_resv_lock(resv, NULL);
	if (imp->detached) {
		dma_resv_unlock(resv);
		return;
	}
	imp->detached = true;
	cxla_import_invalidate(imp);
	dma_resv_unlock(resv);
	dma_buf_detach(imp->dmabuf, imp->attach);
	imp->attach = NULL;
}

static void cxla_import_release(struct kref *ref)
{
	struct cxla_import *imp = container_of(ref, struct cxla_import, ref);
	struct cxla_dev *cd = imp->cd;

	if (imp->attach)
		cxla_import_detach(imp);
	mutex_lock(&cd->dmabuf_lock);
	list_del(&imp->node);
	mutex_unlock(&cd->dmabuf_lock);
	dma_buf_put(imp->dmabuf);
	cxla_db_dec(cd, CXLA_DB_IMPORTS);
	atomic_dec(&cxla_all_imports);
	mutex_destroy(&imp->map_lock);
	put_device(imp->dma_dev);
	kfree(imp);
	put_device(&cd->dev);
}

void cxla_import_put(struct cxla_import *imp)
{
	kref_put(&imp->ref, cxla_import_release);
}

/* Count the DMA segments of the current mapping (for user space). */
static u32 cxla_import_nsegs(struct cxla_import *imp)
{
	u32 n = 0;

	mutex_lock(&imp->map_lock);
	if (imp->sgt)
		n = imp->sgt->nents;
	mutex_unlock(&imp->map_lock);
	return n;
}

long cxla_ioc_import_dmabuf(struct cxla_file *cf, void __user *arg)
{
	struct cxla_dev *cd = cf->dev;
	struct cxl_accel_dmabuf_import in;
	struct dma_buf_attachment *attach;
	struct virtio_device *vdev;
	struct cxla_import *imp;
	struct device *dma_dev;
	struct dma_buf *dmabuf;
	uuid_t uuid = { };
	bool undo;
	u32 idx;
	int ret;

	if (copy_from_user(&in, arg, sizeof(in)))
		return -EFAULT;
	if (in.flags || in.reserved[0] || in.reserved[1])
		return -EINVAL;
	vdev = READ_ONCE(cd->vdev);
	dma_dev = vdev ? vdev->dev.parent : NULL;
	if (!dma_dev)
		return -ENODEV;
	if (device_iommu_mapped(dma_dev)) {
		dev_warn_once(&cd->dev,
			      "an IOMMU translates for %s: the device takes guest-physical addresses, DMA-BUF import refused\n",
			      dev_name(dma_dev));
		return -EOPNOTSUPP;
	}

	dmabuf = dma_buf_get(in.fd);	/* -EBADF, or -EINVAL: not a DMA-BUF */
	if (IS_ERR(dmabuf))
		return PTR_ERR(dmabuf);

	imp = kzalloc(sizeof(*imp), GFP_KERNEL);
	if (!imp) {
		dma_buf_put(dmabuf);
		return -ENOMEM;
	}
	kref_init(&imp->ref);
	imp->cd = cd;
	imp->dma_dev = get_device(dma_dev);
	imp->dmabuf = dmabuf;
	imp->size = dmabuf->size;
	mutex_init(&imp->map_lock);
	init_waitqueue_head(&imp->drain);
	INIT_LIST_HEAD(&imp->node);
	get_device(&cd->dev);
	cxla_db_inc(cd, CXLA_DB_IMPORTS);
	atomic_inc(&cxla_all_imports);

	if (cxla_is_our_dmabuf(dmabuf)) {
		struct cxla_exported *exp = dmabuf->priv;

		imp->kind = cxla_export_dev(exp) == cd ? CXL_ACCEL_IMPORT_SELF :
							 CXL_ACCEL_IMPORT_PEER;
	} else {
		imp->kind = CXL_ACCEL_IMPORT_OTHER;
	}
	if (is_virtio_dma_buf(dmabuf))
		virtio_dma_buf_get_uuid(dmabuf, &uuid);

	attach = dma_buf_dynamic_attach(dmabuf, dma_dev, &cxla_importer_ops,
					imp);
	if (IS_ERR(attach)) {
		ret = PTR_ERR(attach);
		goto err_put;
	}
	imp->attach = attach;
	if (attach->peer2peer)
		imp->attach_flags |= CXL_ACCEL_IMPORT_P2P;
	if (dma_buf_is_dynamic(dmabuf))
		imp->attach_flags |= CXL_ACCEL_IMPORT_DYNAMIC;

	/* removal detaches every import on the list, and then sets no more */
	mutex_lock(&cd->dmabuf_lock);
	if (READ_ONCE(cd->dead)) {
		mutex_unlock(&cd->dmabuf_lock);
		ret = -ENODEV;
		goto err_put;
	}
	list_add_tail(&imp->node, &cd->imports);
	mutex_unlock(&cd->dmabuf_lock);

	ret = cxla_import_map(imp);
	if (ret)
		goto err_put;
	in.kind = imp->kind;
	in.size = imp->size;
	memcpy(in.uuid, uuid.b, sizeof(in.uuid));
	in.attach_flags = imp->attach_flags;
	in.nr_segments = cxla_import_nsegs(imp);

	/*
	 * Once the handle exists, another thread may FREE it (handles are
	 * easy to guess) and drop the reference it owns: keep one of our own
	 * until the handle is reported, and undo only a handle that still
	 * names this import, not one freed and reused meanwhile.
	 */
	kref_get(&imp->ref);
	mutex_lock(&cf->lock);
	ret = xa_alloc(&cf->imports, &idx, imp, XA_LIMIT(1, CXLA_MAX_HANDLE),
		       GFP_KERNEL);
	mutex_unlock(&cf->lock);
	if (ret) {
		cxla_import_put(imp);	/* ours; err_put drops the other */
		ret = ret == -EBUSY ? -ENOSPC : ret;
		goto err_put;
	}

	in.handle = idx | CXL_ACCEL_HANDLE_IMPORTED;
	if (copy_to_user(arg, &in, sizeof(in))) {
		mutex_lock(&cf->lock);
		undo = xa_cmpxchg(&cf->imports, idx, imp, NULL, 0) == imp;
		mutex_unlock(&cf->lock);
		if (undo)
			cxla_import_put(imp);
		ret = -EFAULT;
	}
	cxla_import_put(imp);
	return ret;

err_put:
	cxla_import_put(imp);	/* detaches and drops the DMA-BUF */
	return ret;
}

int cxla_import_free(struct cxla_file *cf, u32 handle)
{
	struct cxla_import *imp;

	mutex_lock(&cf->lock);
	imp = xa_erase(&cf->imports, handle & ~CXL_ACCEL_HANDLE_IMPORTED);
	mutex_unlock(&cf->lock);
	if (!imp)
		return -ENOENT;
	cxla_import_put(imp);
	return 0;
}

void cxla_dmabuf_file_init(struct cxla_file *cf)
{
	xa_init_flags(&cf->imports, XA_FLAGS_ALLOC1);
}

void cxla_dmabuf_file_release(struct cxla_file *cf)
{
	struct cxla_import *imp;
	unsigned long idx;

	xa_for_each(&cf->imports, idx, imp) {
		xa_erase(&cf->imports, idx);
		cxla_import_put(imp);
	}
	xa_destroy(&cf->imports);
}

/*
 * An imported operand of a command: a reference, and the mapping in place
 * (this is the only point where a command takes the reservation lock, and
 * it holds no request of its own yet).
 */
int cxla_import_operand_get(struct cxla_file *cf, u32 handle, u64 addr,
			    u64 len, struct cxla_import **out)
{
	struct cxla_import *imp;
	int ret;

	mutex_lock(&cf->lock);
	imp = xa_load(&cf->imports, handle & ~CXL_ACCEL_HANDLE_IMPORTED);
	if (imp)
		kref_get(&imp->ref);
	mutex_unlock(&cf->lock);
	if (!imp)
		return -ENOENT;
	if (addr > imp->size || len > imp->size - addr) {
		cxla_import_put(imp);
		return -EINVAL;
	}
	ret = cxla_import_map(imp);
	if (ret) {
		cxla_import_put(imp);
		return ret;
	}
	*out = imp;
	return 0;
}

/* Append a segment, merged with the previous one when contiguous. */
static bool cxla_sge_put(struct cxla_sge *sge, unsigned int *n,
			 unsigned int max, u64 addr, u32 len, u16 space)
{
	struct cxla_sge *prev = *n ? &sge[*n - 1] : NULL;

	if (prev && le16_to_cpu(prev->space) == space &&
	    le64_to_cpu(prev->addr) + le32_to_cpu(prev->len) == addr &&
	    le32_to_cpu(prev->len) <= U32_MAX - len) {
		le32_add_cpu(&prev->len, len);
		return true;
	}
	if (*n == max)
		return false;
	sge[*n].addr = cpu_to_le64(addr);
	sge[*n].len = cpu_to_le32(len);
	sge[*n].space = cpu_to_le16(space);
	sge[*n].reserved = 0;
	(*n)++;
	return true;
}

/*
 * Describe bytes [off, off + len) of an import as segments: DMA addresses
 * are guest-physical (RAM, or a peer's BAR); those in our own BAR become
 * device-memory offsets. The request (through pin) counts as a user of
 * the mapping until it is freed.
 */
int cxla_import_sges(struct cxla_dev *cd, struct cxla_import *imp, u64 off,
		     u64 len, struct cxla_pin *pin, struct cxla_sge *sge,
		     unsigned int max)
{
	u64 own_end = cd->devmem_gpa + cd->devmem_size;
	struct scatterlist *sg;
	unsigned int n = 0, i;
	u64 pos = 0, left = len;
	int ret = 0;

	mutex_lock(&imp->map_lock);
	if (imp->invalid || !imp->sgt) {
		ret = -ENODEV;	/* revoked (or moved) since the command began */
		goto out;
	}
	for_each_sgtable_dma_sg(imp->sgt, sg, i) {
		u64 daddr = sg_dma_address(sg);
		u64 dlen = sg_dma_len(sg);
		u64 skip, chunk;

		if (!left)
			break;
		if (pos + dlen <= off) {
			pos += dlen;
			continue;
		}
		skip = off > pos ? off - pos : 0;
		chunk = min(dlen - skip, left);
		daddr += skip;
		while (chunk) {
			/* a piece fits a segment and stays on one side of our BAR */
			u32 piece = min_t(u64, chunk, SZ_1G);
			u16 space = CXLA_SPACE_GPA;
			u64 addr = daddr;

			if (daddr >= cd->devmem_gpa && daddr < own_end) {
				piece = min_t(u64, piece, own_end - daddr);
				addr = daddr - cd->devmem_gpa;
				space = CXLA_SPACE_DEVMEM;
			} else if (daddr < cd->devmem_gpa &&
				   daddr + piece > cd->devmem_gpa) {
				piece = cd->devmem_gpa - daddr;
			}
			if (!cxla_sge_put(sge, &n, max, addr, piece, space)) {
				ret = -E2BIG;
				goto out;
			}
			daddr += piece;
			chunk -= piece;
			left -= piece;
		}
		pos += dlen;
	}
	if (left) {
		/* the exporter's mapping is shorter than its size */
		dev_err_ratelimited(&cd->dev,
				    "imported DMA-BUF maps fewer bytes than its size %llu\n",
				    imp->size);
		ret = -EIO;
		goto out;
	}
	kref_get(&imp->ref);
	atomic_inc(&imp->dma_users);
	pin->imp = imp;
	ret = n;
out:
	mutex_unlock(&imp->map_lock);
	return ret;
}

/* The request is freed: the device no longer touches the memory. */
void cxla_import_unpin(struct cxla_pin *pin)
{
	struct cxla_import *imp = pin->imp;

	pin->imp = NULL;
	if (atomic_dec_and_test(&imp->dma_users))
		wake_up_all(&imp->drain);
	cxla_import_put(imp);
}

/*
 * Removal of the importing device, after its queue was stopped and every
 * request given back: release the attachments now (the exporter sees them
 * go); the handles stay until their files close and give -ENODEV.
 */
void cxla_dmabuf_detach_imports(struct cxla_dev *cd)
{
	struct cxla_import *imp;

	for (;;) {
		struct cxla_import *found = NULL;

		mutex_lock(&cd->dmabuf_lock);
		list_for_each_entry(imp, &cd->imports, node) {
			if (imp->removal_seen)
				continue;
			imp->removal_seen = true;
			if (kref_get_unless_zero(&imp->ref)) {
				found = imp;
				break;
			}
		}
		mutex_unlock(&cd->dmabuf_lock);
		if (!found)
			break;
		cxla_import_detach(found);
		cxla_import_put(found);
	}
}

/* ---------------------------------------------------------------- sysfs */

#define CXLA_DB_ATTR(_name, _idx)					\
static ssize_t _name##_show(struct device *dev,				\
			    struct device_attribute *attr, char *buf)	\
{									\
	return sysfs_emit(buf, "%d\n",					\
			  atomic_read(&to_cxla_dev(dev)->dmabuf_stat[_idx])); \
}									\
static DEVICE_ATTR_RO(_name)

CXLA_DB_ATTR(exports, CXLA_DB_EXPORTS);
CXLA_DB_ATTR(exports_total, CXLA_DB_EXPORTS_TOTAL);
CXLA_DB_ATTR(attachments, CXLA_DB_ATTACHMENTS);
CXLA_DB_ATTR(p2p_attachments, CXLA_DB_P2P_ATTACHMENTS);
CXLA_DB_ATTR(mappings, CXLA_DB_MAPPINGS);
CXLA_DB_ATTR(pins, CXLA_DB_PINS);
CXLA_DB_ATTR(revoked, CXLA_DB_REVOKED);
CXLA_DB_ATTR(imports, CXLA_DB_IMPORTS);
CXLA_DB_ATTR(imports_mapped, CXLA_DB_IMPORTS_MAPPED);
CXLA_DB_ATTR(move_notify, CXLA_DB_MOVE_NOTIFY);

/* module-wide, removed devices included: "exports attachments imports" */
static ssize_t module_live_show(struct device *dev,
				struct device_attribute *attr, char *buf)
{
	return sysfs_emit(buf, "%d %d %d\n", atomic_read(&cxla_all_exports),
			  atomic_read(&cxla_all_attachments),
			  atomic_read(&cxla_all_imports));
}
static DEVICE_ATTR_RO(module_live);

/* how exported buffers reach peer-to-peer importers */
static ssize_t p2p_path_show(struct device *dev, struct device_attribute *attr,
			     char *buf)
{
	return sysfs_emit(buf, "%s\n", to_cxla_dev(dev)->p2p_provider ?
			  "pci-p2pdma" : "host-bridge");
}
static DEVICE_ATTR_RO(p2p_path);

static struct attribute *cxla_dmabuf_attrs[] = {
	&dev_attr_p2p_path.attr,
	&dev_attr_exports.attr,
	&dev_attr_exports_total.attr,
	&dev_attr_attachments.attr,
	&dev_attr_p2p_attachments.attr,
	&dev_attr_mappings.attr,
	&dev_attr_pins.attr,
	&dev_attr_revoked.attr,
	&dev_attr_imports.attr,
	&dev_attr_imports_mapped.attr,
	&dev_attr_move_notify.attr,
	&dev_attr_module_live.attr,
	NULL,
};

const struct attribute_group cxla_dmabuf_group = {
	.name = "dmabuf",
	.attrs = cxla_dmabuf_attrs,
};
