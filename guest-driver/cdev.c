// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: character device, ioctls and mmap of device memory.
 *
 * mmap. A buffer is mapped with vm_insert_page() of its ZONE_DEVICE
 * coherent pages, from the fault handler. These are real, refcounted struct
 * pages (unlike a PFN map of the BAR with remap_pfn_range or
 * vmf_insert_pfn, which x86 installs as "special" PTEs without a page
 * reference):
 *  - each PTE holds a page reference, so a page cannot go back to the device
 *    allocator while any process maps it, whatever the order of munmap,
 *    FREE and close;
 *  - get_user_pages()/pin_user_pages() work on the mapping, so a pointer
 *    into device memory can be handed to this driver's commands (it is
 *    recognised and sent as a device-memory address), to a peer device, or
 *    to O_DIRECT I/O;
 *  - the default page protection is write-back cached, which is right for
 *    coherent memory.
 * With CXL_ACCEL_MMAP_REGION in the offset, a buffer of a CXL device whose
 * region is backed is mapped through the region's host-physical range
 * instead (vmf_insert_pfn: loads and stores over CXL.mem); the vma still
 * holds the buffer, so the pages cannot be reused while it is mapped.
 * On removal the driver zaps every mapping (unmap_mapping_range over each
 * open file) before dropping its own page references and calling
 * memunmap_pages(); later faults get SIGBUS. Poisoned pages (poison.c) are
 * zapped too and refused with VM_FAULT_HWPOISON until the range is cleared.
 */
#include <linux/fs.h>
#include <linux/mm.h>
#include <linux/pci.h>
#include <linux/module.h>
#include <linux/poll.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/virtio.h>

#include "cxl_accel.h"
#include "badrange.h"
#include "cdev.h"
#include "core.h"
#include "devmem.h"
#include "dmabuf.h"
#include "evict.h"
#include "migrate.h"
#include "ops.h"
#include "pool.h"
#include "svm.h"
#include "vq.h"

#define CXLA_MMAP_PGSHIFT	(CXL_ACCEL_MMAP_SHIFT - PAGE_SHIFT)
#define CXLA_MMAP_REGION_PG	(CXL_ACCEL_MMAP_REGION >> PAGE_SHIFT)
#define CXLA_MMAP_PGMASK	(CXLA_MMAP_REGION_PG - 1)

static dev_t cxla_devt;
static struct class *cxla_class;


static vm_fault_t cxla_vm_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct cxla_buf *buf = vma->vm_private_data;
	struct cxla_dev *cd = buf->dev;
	unsigned long idx = vmf->pgoff & CXLA_MMAP_PGMASK;
	vm_fault_t ret = VM_FAULT_SIGBUS;
	int err;

	if (idx >= buf->npages)
		return VM_FAULT_SIGBUS;
	err = cxla_map_read_lock(cd);
	if (err)	/* killed (no retry then), or a reset that did not end */
		return err == -EINTR ? VM_FAULT_NOPAGE : VM_FAULT_SIGBUS;
	if (cd->dead || !buf->pages_held) {
		ret = VM_FAULT_SIGBUS;	/* the device or the buffer's memory is gone */
	} else if (cxla_badrange_hit(cd, buf->offset + ((u64)idx << PAGE_SHIFT),
				   PAGE_SIZE)) {
		/* a media error: SIGBUS with BUS_MCEERR_AR, as a machine check */
		cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_HWPOISON);
		ret = VM_FAULT_HWPOISON;
	} else if (vma->vm_flags & VM_PFNMAP) {
		/* CXL_ACCEL_MMAP_REGION: the page's address in the region */
		ret = vmf_insert_pfn(vma, vmf->address,
				     PHYS_PFN(cd->cxl_range.start + buf->offset) +
				     idx);
	} else {
		err = vm_insert_page(vma, vmf->address, cxla_buf_page(buf, idx));
		if (!err || err == -EBUSY)	/* -EBUSY: raced, already mapped */
			ret = VM_FAULT_NOPAGE;
		else if (err == -ENOMEM)
			ret = VM_FAULT_OOM;
	}
	up_read(&cd->map_sem);
	return ret;
}

static void cxla_vm_open(struct vm_area_struct *vma)
{
	cxla_buf_get(vma->vm_private_data);
}

static void cxla_vm_close(struct vm_area_struct *vma)
{
	/* mmap_lock is held: never wait for the device here */
	cxla_buf_put_async(vma->vm_private_data);
}

static const struct vm_operations_struct cxla_vm_ops = {
	.open = cxla_vm_open,
	.close = cxla_vm_close,
	.fault = cxla_vm_fault,
};

static int cxla_mmap(struct file *filp, struct vm_area_struct *vma)
{
	struct cxla_file *cf = filp->private_data;
	unsigned long handle = vma->vm_pgoff >> CXLA_MMAP_PGSHIFT;
	unsigned long first = vma->vm_pgoff & CXLA_MMAP_PGMASK;
	struct cxla_buf *buf;

	if (READ_ONCE(cf->dev->dead))
		return -ENODEV;
	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;		/* a private COW copy makes no sense */
	if (handle > CXLA_MAX_HANDLE)
		return -EINVAL;
	buf = cxla_file_buf_get(cf, handle);
	if (!buf)
		return -ENOENT;
	if (first > buf->npages || vma_pages(vma) > buf->npages - first) {
		cxla_buf_put(buf);
		return -EINVAL;
	}
	if (vma->vm_pgoff & CXLA_MMAP_REGION_PG) {
		struct cxla_dev *cd = cf->dev;

		/* the region covers device memory from its start */
		if (cd->cxl_status || !cd->cxl_backed ||
		    cd->cxl_range.start + buf->offset +
		    ((u64)buf->npages << PAGE_SHIFT) - 1 > cd->cxl_range.end) {
			cxla_buf_put(buf);
			return -ENXIO;
		}
		vm_flags_set(vma, VM_PFNMAP | VM_IO | VM_DONTEXPAND |
			     VM_DONTDUMP);
	} else {
		vm_flags_set(vma, VM_MIXEDMAP | VM_DONTEXPAND | VM_DONTDUMP);
	}
	vma->vm_private_data = buf;	/* holds the reference */
	vma->vm_ops = &cxla_vm_ops;
	return 0;
}


static int cxla_open(struct inode *inode, struct file *filp)
{
	struct cxla_dev *cd = container_of(inode->i_cdev, struct cxla_dev, cdev);
	struct cxla_file *cf;

	cf = kzalloc(sizeof(*cf), GFP_KERNEL);
	if (!cf)
		return -ENOMEM;
	cf->dev = cd;
	cf->filp = filp;
	mutex_init(&cf->lock);
	xa_init_flags(&cf->bufs, XA_FLAGS_ALLOC1);
	cxla_dmabuf_file_init(cf);
	spin_lock_irq(&cd->evt_lock);
	cf->evt_pos = cd->evt_head;
	spin_unlock_irq(&cd->evt_lock);

	mutex_lock(&cd->files_lock);
	if (READ_ONCE(cd->dead)) {
		mutex_unlock(&cd->files_lock);
		kfree(cf);
		return -ENODEV;
	}
	get_device(&cd->dev);
	list_add_tail(&cf->node, &cd->files);
	mutex_unlock(&cd->files_lock);
	filp->private_data = cf;
	return 0;
}

static int cxla_release(struct inode *inode, struct file *filp)
{
	struct cxla_file *cf = filp->private_data;
	struct cxla_dev *cd = cf->dev;
	struct cxla_buf *buf;
	unsigned long idx;

	cxla_dmabuf_file_release(cf);
	cxla_svm_release(cf);		/* svm.c: device mirrors */
	/* mappings are gone already: they hold the file */
	xa_for_each(&cf->bufs, idx, buf) {
		xa_erase(&cf->bufs, idx);
		cxla_buf_put(buf);
	}
	xa_destroy(&cf->bufs);

	mutex_lock(&cd->files_lock);
	list_del(&cf->node);
	mutex_unlock(&cd->files_lock);
	mutex_destroy(&cf->lock);
	kfree(cf);
	put_device(&cd->dev);
	return 0;
}

int cxla_identify(struct cxla_dev *cd, struct cxl_accel_identify *out,
		  bool intr)
{
	struct cxla_identify id;
	int ret;

	/* buffer frees deferred from munmap: make devmem_free exact */
	ret = cxla_pool_settle(cd, intr);
	if (ret)
		return ret;
	ret = cxla_simple_cmd(cd, CXLA_OP_IDENTIFY, NULL, 0, &id, sizeof(id),
			      NULL, 0, intr);
	if (ret)
		return ret;
	memset(out, 0, sizeof(*out));
	out->magic = le32_to_cpu(id.magic);
	out->version_major = le16_to_cpu(id.version_major);
	out->version_minor = le16_to_cpu(id.version_minor);
	out->features = le64_to_cpu(id.features);
	out->devmem_size = le64_to_cpu(id.devmem_size);
	out->devmem_free = le64_to_cpu(id.devmem_free);
	out->devmem_gpa = le64_to_cpu(id.devmem_gpa);
	out->num_dma_engines = le32_to_cpu(id.num_dma_engines);
	out->max_segments = le32_to_cpu(id.max_segments);
	out->buffers = le32_to_cpu(id.buffers);
	out->device_index = le32_to_cpu(id.device_index);
	out->read_latency_ns = cd->read_latency_ns;
	out->write_latency_ns = cd->write_latency_ns;
	out->read_bandwidth_mbs = cd->read_bandwidth_mbs;
	out->write_bandwidth_mbs = cd->write_bandwidth_mbs;
	out->page_size = cd->page_size;
	out->max_request = cd->max_request;
	out->minor = cd->minor;
	if (cd->mig->mem_end)	/* migrate.c: the node in NUMA mode */
		out->numa_node = cd->mig->node;
	else
		out->numa_node = cd->mem_pdev ? dev_to_node(&cd->mem_pdev->dev) :
						NUMA_NO_NODE;
	return 0;
}

static long cxla_ioc_identify(struct cxla_file *cf, void __user *arg)
{
	struct cxl_accel_identify id;
	int ret;

	ret = cxla_identify(cf->dev, &id, true);
	if (ret)
		return ret;
	return copy_to_user(arg, &id, sizeof(id)) ? -EFAULT : 0;
}

static long cxla_ioc_alloc(struct cxla_file *cf, void __user *arg)
{
	struct cxla_dev *cd = cf->dev;
	struct cxl_accel_alloc a;
	struct cxla_buf *buf;
	u64 size, align;
	bool undo;
	u32 handle;
	int ret;

	if (copy_from_user(&a, arg, sizeof(a)))
		return -EFAULT;
	if (a.flags || !a.size)
		return -EINVAL;
	if (a.align && !is_power_of_2(a.align))
		return -EINVAL;
	if (a.size > cd->devmem_size)
		return -ENOSPC;
	size = PAGE_ALIGN(a.size);
	align = max_t(u64, a.align, PAGE_SIZE);
	if (align > cd->devmem_size)
		return -EINVAL;

	ret = cxla_buf_alloc(cd, size, align, &buf);
	/* empty pool chunks waiting to go back may be what is missing */
	if (ret == -ENOSPC && cd->mig && cxla_pool_linger_end(cd->mig))
		ret = cxla_buf_alloc(cd, size, align, &buf);
	if (ret)
		return ret;
	a.offset = buf->offset;
	a.alloc_size = size;

	/*
	 * Once the handle exists, another thread may FREE it (handles are
	 * easy to guess) and drop the reference it owns: keep one of our own
	 * until the handle is reported, and undo only a handle that still
	 * names this buffer, not one freed and reused meanwhile.
	 */
	cxla_buf_get(buf);
	mutex_lock(&cf->lock);
	ret = xa_alloc(&cf->bufs, &handle, buf, XA_LIMIT(1, CXLA_MAX_HANDLE),
		       GFP_KERNEL);
	mutex_unlock(&cf->lock);
	if (ret) {
		cxla_buf_put(buf);	/* ours */
		cxla_buf_put(buf);	/* the handle's: FREE */
		return ret == -EBUSY ? -ENOSPC : ret;
	}

	a.handle = handle;
	a.mmap_offset = (u64)handle << CXL_ACCEL_MMAP_SHIFT;
	if (copy_to_user(arg, &a, sizeof(a))) {
		mutex_lock(&cf->lock);
		undo = xa_cmpxchg(&cf->bufs, handle, buf, NULL, 0) == buf;
		mutex_unlock(&cf->lock);
		if (undo)
			cxla_buf_put(buf);
		ret = -EFAULT;
	}
	cxla_buf_put(buf);
	return ret;
}

static long cxla_ioc_free(struct cxla_file *cf, void __user *arg)
{
	struct cxl_accel_free f;
	struct cxla_buf *buf;

	if (copy_from_user(&f, arg, sizeof(f)))
		return -EFAULT;
	if (f.flags)
		return -EINVAL;
	if (!f.handle)
		return -ENOENT;
	if (f.handle & CXL_ACCEL_HANDLE_IMPORTED)
		return cxla_import_free(cf, f.handle);	/* dmabuf.c */
	mutex_lock(&cf->lock);
	buf = xa_erase(&cf->bufs, f.handle);
	mutex_unlock(&cf->lock);
	if (!buf)
		return -ENOENT;
	/* device memory goes back once no mapping or pin holds a page */
	cxla_buf_put(buf);
	return 0;
}

/* One NOP: the device round trip alone (latency, liveness). */
static long cxla_ioc_nop(struct cxla_file *cf, void __user *arg)
{
	struct cxla_dev *cd = cf->dev;
	struct cxl_accel_nop n;
	struct cxla_req *req;
	int ret;

	if (copy_from_user(&n, arg, sizeof(n)))
		return -EFAULT;
	if (n.flags & ~CXL_ACCEL_OP_FENCE)
		return -EINVAL;
	req = cxla_req_alloc(cd, CXLA_OP_NOP,
			     (n.flags & CXL_ACCEL_OP_FENCE) ? CXLA_FLAG_FENCE : 0,
			     0, 0);
	if (IS_ERR(req))
		return PTR_ERR(req);
	ret = cxla_exec(cd, &req, n.timeout_ms, true);
	cxla_req_free(cd, req);
	return ret;
}

static long cxla_ioc_signal(struct cxla_file *cf, void __user *arg)
{
	struct cxla_dev *cd = cf->dev;
	struct cxl_accel_signal s;
	struct cxla_signal sig;
	struct cxla_req *req;
	int ret;

	if (copy_from_user(&s, arg, sizeof(s)))
		return -EFAULT;
	if (s.flags & ~CXL_ACCEL_OP_FENCE)
		return -EINVAL;
	if (!(cd->features & CXLA_F_EVENTS) || !cd->evt_vq)
		return -EOPNOTSUPP;
	req = cxla_req_alloc(cd, CXLA_OP_SIGNAL,
			     (s.flags & CXL_ACCEL_OP_FENCE) ? CXLA_FLAG_FENCE : 0,
			     sizeof(sig), 0);
	if (IS_ERR(req))
		return PTR_ERR(req);
	sig.value = cpu_to_le64(s.value);
	memcpy(cxla_req_payload(req), &sig, sizeof(sig));
	ret = cxla_exec(cd, &req, s.timeout_ms, true);
	cxla_req_free(cd, req);
	return ret;
}

/* One NOP round trip: what a command costs with nothing to do. */
static bool cxla_evt_take(struct cxla_file *cf,
			  const struct cxl_accel_wait_event *w,
			  struct cxl_accel_event *out)
{
	struct cxla_dev *cd = cf->dev;
	struct cxl_accel_event *ev;
	bool found = false;

	spin_lock_irq(&cd->evt_lock);
	if (cd->evt_head - cf->evt_pos > CXLA_EVENT_RING) {
		cf->evt_lost += cd->evt_head - cf->evt_pos - CXLA_EVENT_RING;
		cf->evt_pos = cd->evt_head - CXLA_EVENT_RING;
	}
	while (cf->evt_pos < cd->evt_head) {
		ev = &cd->evt_ring[cf->evt_pos % CXLA_EVENT_RING];
		cf->evt_pos++;
		if (w->type && ev->type != w->type)
			continue;
		if ((w->flags & CXL_ACCEL_WAIT_MATCH_VALUE) &&
		    ev->value0 != w->value)
			continue;
		*out = *ev;
		found = true;
		break;
	}
	spin_unlock_irq(&cd->evt_lock);
	return found;
}

static bool cxla_evt_wait_cond(struct cxla_file *cf,
			       struct cxl_accel_wait_event *w, bool *found)
{
	*found = cxla_evt_take(cf, w, &w->event);
	return *found || READ_ONCE(cf->dev->dead);
}

static long cxla_ioc_wait_event(struct cxla_file *cf, void __user *arg)
{
	struct cxla_dev *cd = cf->dev;
	struct cxl_accel_wait_event w;
	bool found;
	long left;

	if (copy_from_user(&w, arg, sizeof(w)))
		return -EFAULT;
	if (w.flags & ~CXL_ACCEL_WAIT_MATCH_VALUE)
		return -EINVAL;
	memset(&w.event, 0, sizeof(w.event));
	found = cxla_evt_take(cf, &w, &w.event);
	if (!found) {
		if (!w.timeout_ms)
			return -EAGAIN;
		left = wait_event_interruptible_timeout(cd->evt_wait,
							cxla_evt_wait_cond(cf, &w, &found),
							msecs_to_jiffies(w.timeout_ms));
		/* nothing taken yet: restarted after task work or SA_RESTART */
		if (left < 0)
			return -ERESTARTSYS;
		if (!found)
			return left ? -ENODEV : -ETIMEDOUT;
	}
	spin_lock_irq(&cd->evt_lock);
	w.lost = cf->evt_lost;
	cf->evt_lost = 0;
	spin_unlock_irq(&cd->evt_lock);
	return copy_to_user(arg, &w, sizeof(w)) ? -EFAULT : 0;
}

static long cxla_ioc_stats(struct cxla_file *cf, void __user *arg)
{
	struct cxla_dev *cd = cf->dev;
	struct cxl_accel_stats *st;
	struct cxla_stats ds;
	int i, ret;

	ret = cxla_simple_cmd(cd, CXLA_OP_STATS, NULL, 0, &ds, sizeof(ds),
			      NULL, 0, true);
	if (ret)
		return ret;
	st = kzalloc(sizeof(*st), GFP_KERNEL);
	if (!st)
		return -ENOMEM;
	for (i = 0; i < CXL_ACCEL_STAT_COUNT && i < CXLA_STAT_COUNT; i++)
		st->device[i] = le64_to_cpu(ds.counter[i]);
	for (i = 0; i < CXL_ACCEL_DSTAT_COUNT; i++)
		st->driver[i] = atomic64_read(&cd->dstat[i]);
	ret = copy_to_user(arg, st, sizeof(*st)) ? -EFAULT : 0;
	kfree(st);
	return ret;
}

static long cxla_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	struct cxla_file *cf = filp->private_data;
	void __user *uarg = (void __user *)arg;

	if (READ_ONCE(cf->dev->dead))
		return -ENODEV;

	switch (cmd) {
	case CXL_ACCEL_IOC_IDENTIFY:
		return cxla_ioc_identify(cf, uarg);
	case CXL_ACCEL_IOC_ALLOC:
		return cxla_ioc_alloc(cf, uarg);
	case CXL_ACCEL_IOC_FREE:
		return cxla_ioc_free(cf, uarg);
	case CXL_ACCEL_IOC_COPY:
		return cxla_ioc_copy(cf, uarg);
	case CXL_ACCEL_IOC_FILL:
		return cxla_ioc_fill(cf, uarg);
	case CXL_ACCEL_IOC_CHECKSUM:
		return cxla_ioc_checksum(cf, uarg);
	case CXL_ACCEL_IOC_ATOMIC:
		return cxla_ioc_atomic(cf, uarg);
	case CXL_ACCEL_IOC_SIGNAL:
		return cxla_ioc_signal(cf, uarg);
	case CXL_ACCEL_IOC_WAIT_EVENT:
		return cxla_ioc_wait_event(cf, uarg);
	case CXL_ACCEL_IOC_STATS:
		return cxla_ioc_stats(cf, uarg);
	case CXL_ACCEL_IOC_NOP:
		return cxla_ioc_nop(cf, uarg);
	/* DMA-BUF (dmabuf.c) */
	case CXL_ACCEL_IOC_EXPORT_DMABUF:
		return cxla_ioc_export_dmabuf(cf, uarg);
	case CXL_ACCEL_IOC_IMPORT_DMABUF:
		return cxla_ioc_import_dmabuf(cf, uarg);
	/* page migration (migrate.c, evict.c), shared virtual memory (svm.c) */
	case CXL_ACCEL_IOC_MIGRATE_TO_DEV:
		return cxla_ioc_migrate(cf, uarg, true);
	case CXL_ACCEL_IOC_MIGRATE_TO_RAM:
		return cxla_ioc_migrate(cf, uarg, false);
	case CXL_ACCEL_IOC_EVICT:
		return cxla_ioc_evict(cf, uarg);
	case CXL_ACCEL_IOC_HMM_INFO:
		return cxla_ioc_hmm_info(cf, uarg);
	case CXL_ACCEL_IOC_SVM:
		return cxla_ioc_svm(cf, uarg);
	case CXL_ACCEL_IOC_SNAPSHOT:
		return cxla_ioc_snapshot(cf, uarg);
	case CXL_ACCEL_IOC_PIN_CHECKSUM:
		return cxla_ioc_pin_checksum(cf, uarg);
	default:
		return -ENOTTY;
	}
}

static __poll_t cxla_poll(struct file *filp, poll_table *wait)
{
	struct cxla_file *cf = filp->private_data;
	struct cxla_dev *cd = cf->dev;
	__poll_t mask = 0;

	poll_wait(filp, &cd->evt_wait, wait);
	spin_lock_irq(&cd->evt_lock);
	if (cf->evt_pos != cd->evt_head)
		mask |= EPOLLIN | EPOLLRDNORM;
	spin_unlock_irq(&cd->evt_lock);
	if (READ_ONCE(cd->dead))
		mask |= EPOLLHUP | EPOLLERR;
	return mask;
}

static const struct file_operations cxla_fops = {
	.owner = THIS_MODULE,
	.open = cxla_open,
	.release = cxla_release,
	.unlocked_ioctl = cxla_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = cxla_mmap,
	.poll = cxla_poll,
	.llseek = noop_llseek,
};

/* Name the device early so that probe messages carry it. */
void cxla_cdev_init_dev(struct cxla_dev *cd)
{
	cd->dev.devt = MKDEV(MAJOR(cxla_devt), cd->minor);
	cd->dev.class = cxla_class;
	cd->dev.parent = &cd->vdev->dev;
}

int cxla_cdev_add(struct cxla_dev *cd)
{
	int ret;

	cdev_init(&cd->cdev, &cxla_fops);
	cd->cdev.owner = THIS_MODULE;
	ret = cdev_device_add(&cd->cdev, &cd->dev);
	if (!ret)
		cd->registered = true;
	return ret;
}

void cxla_cdev_del(struct cxla_dev *cd)
{
	if (cd->registered) {
		cdev_device_del(&cd->cdev, &cd->dev);
		cd->registered = false;
	}
}

/* The device /dev/cxl-accelN, with a reference; NULL if there is none. */
struct cxla_dev *cxla_dev_get_by_index(unsigned int minor)
{
	struct device *dev;

	if (minor >= CXLA_MAX_DEVICES)
		return NULL;
	dev = class_find_device_by_devt(cxla_class,
					MKDEV(MAJOR(cxla_devt), minor));
	if (!dev)
		return NULL;
	if (READ_ONCE(to_cxla_dev(dev)->dead)) {
		put_device(dev);
		return NULL;
	}
	return to_cxla_dev(dev);
}

int cxla_chrdev_init(void)
{
	int ret;

	ret = alloc_chrdev_region(&cxla_devt, 0, CXLA_MAX_DEVICES, CXLA_NAME);
	if (ret)
		return ret;
	cxla_class = class_create(CXLA_NAME);
	if (IS_ERR(cxla_class)) {
		unregister_chrdev_region(cxla_devt, CXLA_MAX_DEVICES);
		return PTR_ERR(cxla_class);
	}
	return 0;
}

void cxla_chrdev_exit(void)
{
	class_destroy(cxla_class);
	unregister_chrdev_region(cxla_devt, CXLA_MAX_DEVICES);
}
