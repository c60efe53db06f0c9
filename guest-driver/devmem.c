// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: device memory.
 *
 * The accelerator's memory is a BAR: of the virtio function itself, as
 * VIRTIO shared memory region CXLA_SHM_ID_DEVMEM (CXLA_F_SHMEM, QEMU 11.1),
 * or BAR2 of an ivshmem-plain function in the same slot (QEMU 10.2). In the
 * first case the device's memory is only there while the device runs: a
 * virtio reset takes it away (reads see zeros), so removal moves data out
 * before it resets the device. The driver maps it with
 * memremap_pages(MEMORY_DEVICE_COHERENT): each page gets a ZONE_DEVICE
 * struct page, the direct map covers it with normal write-back caching, and
 * CPU and device see each other's writes with no flush (the memory is
 * coherent, like CXL.mem of a Type-2 device).
 *
 * Page ownership. Coherent device pages start free (refcount 0). The device
 * allocates; for each buffer it hands out the driver initialises every page
 * (zone_device_page_init: refcount 1 plus a pgmap reference) and keeps that
 * reference while the buffer object lives. User mappings (vm_insert_page)
 * and pins take their own page references. When the buffer object's last
 * reference goes, the driver drops its page references, and each page comes
 * back through page_free() once nobody else holds it. Only when every page
 * is back is the device told to FREE the range: the device never reuses
 * memory that a CPU mapping or a pin can still reach.
 *
 * Removal. memunmap_pages() waits until every page is free. User mappings
 * are zapped and migrated pages evicted first, but a page can outlive all
 * of that: a pipe holding it after vmsplice(), a pin. Then removal does not
 * wait: the memory stays mapped (and its PCI region claimed, and the module
 * loaded) until the last such page comes back through page_free(), which
 * finishes the teardown from a work item. A rebind meanwhile is refused.
 * Module unload cannot leave pages behind (page_free() is module code): it
 * waits for them, saying so.
 */
#include <linux/delay.h>
#include <linux/mm.h>
#include <linux/pagemap.h>
#include <linux/pci.h>
#include <linux/slab.h>
#include <linux/virtio.h>
#include <linux/virtio_config.h>

#include "cxl_accel.h"
#include "compat.h"
#include "core.h"
#include "devmem.h"
#include "vq.h"

/* ivshmem-plain, the function that carries the device memory BAR */
#define CXLA_IVSHMEM_VENDOR	0x1af4
#define CXLA_IVSHMEM_DEVICE	0x1110
#define CXLA_IVSHMEM_BAR	2

#define CXLA_SET_BASE_TRIES	100	/* x 20 ms while the BAR is not mapped */

u8 cxla_pgmap_owner;

struct page *cxla_buf_page(struct cxla_buf *buf, unsigned long idx)
{
	return pfn_to_page(PHYS_PFN(buf->dev->devmem_gpa + buf->offset) + idx);
}

bool cxla_page_is_ours(struct cxla_dev *cd, struct page *page)
{
	return is_zone_device_page(page) && cxla_page_pgmap(page) == &cd->pgmap;
}

/* Every page of the buffer is back: return the range to the device. */
static void cxla_buf_finish(struct cxla_buf *buf)
{
	struct cxla_dev *cd = buf->dev;
	struct cxla_free *f;
	struct cxla_req *req;
	bool send;
	int ret, tries;

	mutex_lock(&cd->buf_lock);
	send = !buf->dev_freed;
	buf->dev_freed = true;
	mutex_unlock(&cd->buf_lock);

	for (tries = 0; send && !READ_ONCE(cd->stopped); tries++) {
		req = cxla_req_alloc(cd, CXLA_OP_FREE, 0, sizeof(*f), 0);
		if (IS_ERR(req)) {
			dev_warn(&cd->dev, "cannot free device buffer %llu: %ld\n",
				 buf->id, PTR_ERR(req));
			break;
		}
		f = cxla_req_payload(req);
		f->id = cpu_to_le64(buf->id);
		if (READ_ONCE(cd->wedged)) {
			/* do not stall every close on a dead device */
			cxla_req_fire_and_forget(cd, req);
			break;
		}
		ret = cxla_exec(cd, &req, 0, false);
		cxla_req_free(cd, req);
		/*
		 * -EIO: the daemon restarted and cannot say whether the FREE
		 * ran. FREE is idempotent: ask again; -ENOENT then means it
		 * had.
		 */
		if (ret == -EIO && tries < 3)
			continue;
		if (ret == -ENOENT && tries)
			ret = 0;
		if (ret && ret != -ENODEV)
			dev_warn(&cd->dev,
				 "FREE of device buffer %llu failed: %d\n",
				 buf->id, ret);
		break;
	}

	mutex_lock(&cd->buf_lock);
	list_del(&buf->node);
	cd->nbufs--;
	mutex_unlock(&cd->buf_lock);
	cxla_dstat_dec(cd, CXL_ACCEL_DSTAT_BUFFERS);
	kfree(buf);
	put_device(&cd->dev);
}

static void cxla_buf_finish_work(struct work_struct *work)
{
	struct cxla_buf *buf = container_of(work, struct cxla_buf, finish_work);
	struct cxla_dev *cd = buf->dev;

	get_device(&cd->dev);	/* the buffer's own reference goes with it */
	cxla_buf_finish(buf);
	cxla_deferred_done(cd);
	put_device(&cd->dev);
}

/* Pages of cd with references: the last one finishes an orphaned removal. */
static void cxla_pages_live_dec(struct cxla_dev *cd)
{
	if (atomic_long_dec_and_test(&cd->pages_live) &&
	    READ_ONCE(cd->devmem_orphan) &&
	    !test_and_set_bit(0, &cd->devmem_unmapping))
		queue_work(cxla_wq, &cd->devmem_work);
}

static void cxla_page_free(struct page *page)
{
	struct cxla_buf *buf = page->zone_device_data;
	struct cxla_dev *cd = container_of(cxla_page_pgmap(page), struct cxla_dev,
					   pgmap);
	struct folio *folio = page_folio(page);

	/*
	 * The kernel does not check ZONE_DEVICE pages at free: a page that
	 * comes back while a page table still maps it lost a reference, and
	 * handing it out again would give it two owners.
	 */
	if (folio_mapped(folio)) {
		dev_err(&cd->dev, "page %#lx freed while mapped (mapcount %d)\n",
			page_to_pfn(page), folio_mapcount(folio));
		dump_page(page, "cxl-accel: freed while mapped");
		WARN_ON_ONCE(1);
	}
	if (buf && buf->chunk) {	/* a migration page: back to its pool */
		cd->devmem_hooks->page_free(buf, page);
		cxla_pages_live_dec(cd);
		return;
	}
	page->zone_device_data = NULL;
	if (WARN_ON_ONCE(!buf))
		return;
	if (atomic_long_dec_and_test(&buf->pages_out))
		cxla_defer(cd, &buf->finish_work);
	cxla_pages_live_dec(cd);
}

CXLA_DECLARE_PAGEMAP_FREE(cxla_page_free)

static const struct dev_pagemap_ops cxla_pgmap_ops = {
	CXLA_PAGEMAP_FREE(cxla_page_free),
};

/* Drop the driver's own reference on every page of the buffer. */
static void cxla_buf_drop_pages(struct cxla_buf *buf)
{
	struct cxla_dev *cd = buf->dev;
	unsigned long i;
	bool held;

	mutex_lock(&cd->buf_lock);
	held = buf->pages_held;
	buf->pages_held = false;
	mutex_unlock(&cd->buf_lock);
	if (!held)
		return;
	for (i = 0; i < buf->npages; i++) {
		put_page(cxla_buf_page(buf, i));
		if (!(i % 1024))
			cond_resched();
	}
}

static void cxla_buf_release(struct kref *ref)
{
	struct cxla_buf *buf = container_of(ref, struct cxla_buf, ref);

	cxla_buf_drop_pages(buf);
	/* drop the bias: the last page_free() or we finish the buffer */
	if (atomic_long_dec_and_test(&buf->pages_out))
		cxla_buf_finish(buf);
}

static void cxla_buf_release_work(struct work_struct *work)
{
	struct cxla_buf *buf = container_of(work, struct cxla_buf, release_work);
	struct cxla_dev *cd = buf->dev;

	get_device(&cd->dev);	/* the buffer's own reference goes with it */
	cxla_buf_release(&buf->ref);
	cxla_deferred_done(cd);
	put_device(&cd->dev);
}

static void cxla_buf_release_async(struct kref *ref)
{
	struct cxla_buf *buf = container_of(ref, struct cxla_buf, ref);

	cxla_defer(buf->dev, &buf->release_work);
}

/* Drop a reference; the last one may talk to the device and sleep. */
void cxla_buf_put(struct cxla_buf *buf)
{
	kref_put(&buf->ref, cxla_buf_release);
}

/* Drop a reference from a context that should not wait for the device. */
void cxla_buf_put_async(struct cxla_buf *buf)
{
	kref_put(&buf->ref, cxla_buf_release_async);
}

static void cxla_free_device_buffer(struct cxla_dev *cd, u64 id)
{
	struct cxla_free *f;
	struct cxla_req *req;

	req = cxla_req_alloc(cd, CXLA_OP_FREE, 0, sizeof(*f), 0);
	if (IS_ERR(req))
		return;
	f = cxla_req_payload(req);
	f->id = cpu_to_le64(id);
	cxla_req_fire_and_forget(cd, req);
}

int cxla_buf_alloc(struct cxla_dev *cd, u64 size, u64 align,
		   struct cxla_buf **out)
{
	struct cxla_alloc a = {
		.size = cpu_to_le64(size),
		.align = cpu_to_le64(align),
	};
	struct cxla_resp resp;
	struct cxla_buf *buf;
	unsigned long i;
	u64 id, off;
	int ret;

	if (!(cd->features & CXLA_F_ALLOC))
		return -EOPNOTSUPP;	/* NUMA mode: the kernel owns the memory */
	buf = kzalloc(sizeof(*buf), GFP_KERNEL);
	if (!buf)
		return -ENOMEM;

	ret = cxla_simple_cmd(cd, CXLA_OP_ALLOC, &a, sizeof(a), NULL, 0, &resp,
			      0, true);
	if (ret) {
		kfree(buf);
		return ret;
	}
	id = le64_to_cpu(resp.result0);
	off = le64_to_cpu(resp.result1);
	if (!IS_ALIGNED(off, PAGE_SIZE) || !IS_ALIGNED(off, align) ||
	    off > cd->devmem_size || size > cd->devmem_size - off) {
		cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_PROTOCOL);
		dev_err(&cd->dev,
			"ALLOC size %llu align %llu returned id %llu offset %#llx: outside device memory or misaligned\n",
			size, align, id, off);
		cxla_free_device_buffer(cd, id);
		kfree(buf);
		return -EIO;
	}

	buf->dev = cd;
	buf->id = id;
	buf->offset = off;
	buf->size = size;
	buf->npages = size >> PAGE_SHIFT;
	kref_init(&buf->ref);
	atomic_long_set(&buf->pages_out, buf->npages + 1);
	INIT_WORK(&buf->release_work, cxla_buf_release_work);
	INIT_WORK(&buf->finish_work, cxla_buf_finish_work);

	down_read(&cd->map_sem);
	if (cd->dead) {
		up_read(&cd->map_sem);
		cxla_free_device_buffer(cd, id);
		kfree(buf);
		return -ENODEV;
	}
	for (i = 0; i < buf->npages; i++) {
		struct page *page = cxla_buf_page(buf, i);

		if (page_ref_count(page)) {
			up_read(&cd->map_sem);
			cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_PROTOCOL);
			dev_err(&cd->dev,
				"ALLOC returned id %llu offset %#llx, but page %#llx is still in use\n",
				id, off, off + ((u64)i << PAGE_SHIFT));
			cxla_free_device_buffer(cd, id);
			kfree(buf);
			return -EIO;
		}
	}
	atomic_long_add(buf->npages, &cd->pages_live);
	for (i = 0; i < buf->npages; i++) {
		struct page *page = cxla_buf_page(buf, i);

		cxla_zone_device_page_init(page, &cd->pgmap);	/* locked */
		page->zone_device_data = buf;
		unlock_page(page);
	}
	get_device(&cd->dev);
	mutex_lock(&cd->buf_lock);
	buf->pages_held = true;
	list_add_tail(&buf->node, &cd->bufs);
	cd->nbufs++;
	mutex_unlock(&cd->buf_lock);
	up_read(&cd->map_sem);
	cxla_dstat_inc(cd, CXL_ACCEL_DSTAT_BUFFERS);

	*out = buf;
	return 0;
}

/*
 * Hot-unplug of a slot (acpiphp, pciehp) removes its functions last to
 * first, so the ivshmem function goes before the virtio function it pairs
 * with. Its removal releases its BAR resource together with our busy region
 * inside it: the range is free for others while our pages still map it and
 * the device may still write it, and our pci_release_region() later finds
 * nothing ("Trying to free nonexistent resource", the region leaks). No
 * driver binds the ivshmem function, so a device link cannot order the two:
 * when a memory function in use is about to be deleted, unbind the virtio
 * device that uses it first, while the BAR is still whole.
 */
static LIST_HEAD(cxla_mem_devs);
static DEFINE_MUTEX(cxla_mem_lock);

static void cxla_mem_track(struct cxla_dev *cd, bool on)
{
	mutex_lock(&cxla_mem_lock);
	if (on)
		list_add(&cd->mem_node, &cxla_mem_devs);
	else
		list_del(&cd->mem_node);
	mutex_unlock(&cxla_mem_lock);
}

static int cxla_pci_notify(struct notifier_block *nb, unsigned long action,
			   void *data)
{
	struct device *dev = data, *vdev = NULL;
	struct cxla_dev *cd;

	if (action != BUS_NOTIFY_DEL_DEVICE)
		return NOTIFY_DONE;
	mutex_lock(&cxla_mem_lock);
	list_for_each_entry(cd, &cxla_mem_devs, mem_node) {
		if (&cd->mem_pdev->dev != dev)
			continue;
		if (cd->vdev)
			vdev = get_device(&cd->vdev->dev);
		else	/* removed already: its memory is still referenced */
			dev_warn(dev, "memory function removed while %ld pages of it are still referenced\n",
				 atomic_long_read(&cd->pages_live));
		break;
	}
	mutex_unlock(&cxla_mem_lock);
	if (!vdev)
		return NOTIFY_DONE;
	dev_info(vdev, "memory function %s is being removed: unbinding first\n",
		 dev_name(dev));
	device_release_driver(vdev);	/* remove(), unless already gone */
	put_device(vdev);
	return NOTIFY_OK;
}

static struct notifier_block cxla_pci_nb = {
	.notifier_call = cxla_pci_notify,
};

int cxla_devmem_notifier_register(void)
{
	return bus_register_notifier(&pci_bus_type, &cxla_pci_nb);
}

void cxla_devmem_notifier_unregister(void)
{
	bus_unregister_notifier(&pci_bus_type, &cxla_pci_nb);
}

/* An earlier binding's memory is still referenced (an orphaned removal)? */
static bool cxla_mem_in_use(struct cxla_dev *cd, struct pci_dev *pdev)
{
	struct cxla_dev *old;
	long live = -1;

	mutex_lock(&cxla_mem_lock);
	list_for_each_entry(old, &cxla_mem_devs, mem_node)
		if (old->mem_pdev == pdev)
			live = atomic_long_read(&old->pages_live);
	mutex_unlock(&cxla_mem_lock);
	if (live < 0)
		return false;
	dev_err(&cd->vdev->dev,
		"device memory in %s is still referenced by %ld pages of the previous binding (pipes, pins): bind again once they are released\n",
		pci_name(pdev), live);
	return true;
}

static struct pci_dev *cxla_find_mem_function(struct cxla_dev *cd)
{
	struct device *parent = cd->vdev->dev.parent;
	struct pci_dev *vpdev, *pdev;
	unsigned int fn;

	if (!parent || !dev_is_pci(parent)) {
		dev_err(&cd->vdev->dev,
			"transport is not PCI: cannot find the device memory function\n");
		return NULL;
	}
	vpdev = to_pci_dev(parent);
	for (fn = 1; fn < 8; fn++) {
		unsigned int f = (PCI_FUNC(vpdev->devfn) + fn) % 8;

		pdev = pci_get_slot(vpdev->bus,
				    PCI_DEVFN(PCI_SLOT(vpdev->devfn), f));
		if (!pdev)
			continue;
		if (pdev->vendor == CXLA_IVSHMEM_VENDOR &&
		    pdev->device == CXLA_IVSHMEM_DEVICE) {
			if (!cxla_mem_in_use(cd, pdev))
				return pdev;
			pci_dev_put(pdev);
			return ERR_PTR(-EBUSY);
		}
		pci_dev_put(pdev);
	}
	dev_err(&cd->vdev->dev,
		"no ivshmem-plain function (%04x:%04x) in slot %02x of bus %02x next to %s: no device memory\n",
		CXLA_IVSHMEM_VENDOR, CXLA_IVSHMEM_DEVICE,
		PCI_SLOT(vpdev->devfn), vpdev->bus->number, pci_name(vpdev));
	return NULL;
}

/* Tell the device where its memory BAR is; retry while it is not mapped. */
int cxla_set_devmem_base(struct cxla_dev *cd)
{
	struct cxla_set_devmem_base b = { .gpa = cpu_to_le64(cd->devmem_gpa) };
	struct cxla_resp resp;
	int tries, ret;

	for (tries = 0; tries < CXLA_SET_BASE_TRIES; tries++) {
		memset(&resp, 0, sizeof(resp));
		ret = cxla_simple_cmd(cd, CXLA_OP_SET_DEVMEM_BASE, &b, sizeof(b),
				      NULL, 0, &resp, 0, false);
		if (ret != -EAGAIN)
			break;
		msleep(20);
	}
	if (ret)
		dev_err(&cd->vdev->dev,
			"SET_DEVMEM_BASE %#llx failed: %d (status %u, detail %u, %d tries)\n",
			(u64)cd->devmem_gpa, ret, le32_to_cpu(resp.status),
			le32_to_cpu(resp.detail), tries + 1);
	return ret;
}

/*
 * Shared-memory attach: device memory is a region of the virtio function's
 * own BAR. The range is the region; the BAR is found by its address.
 */
static struct pci_dev *cxla_find_shm_region(struct cxla_dev *cd,
					    struct resource *range, int *bar)
{
	struct device *parent = cd->vdev->dev.parent;
	struct virtio_shm_region r;
	struct pci_dev *pdev;
	int i;

	if (!virtio_get_shm_region(cd->vdev, &r, CXLA_SHM_ID_DEVMEM)) {
		dev_err(&cd->vdev->dev,
			"device memory should be VIRTIO shared memory region %d but the device has none: QEMU 11.1 or later is needed (or run the daemon with --attach bar and an ivshmem-plain function)\n",
			CXLA_SHM_ID_DEVMEM);
		return NULL;
	}
	if (!parent || !dev_is_pci(parent))
		return NULL;
	pdev = to_pci_dev(parent);
	for (i = 0; i < PCI_STD_NUM_BARS; i++) {
		if (!(pci_resource_flags(pdev, i) & IORESOURCE_MEM) ||
		    r.addr < pci_resource_start(pdev, i) ||
		    r.addr + r.len - 1 > pci_resource_end(pdev, i))
			continue;
		*bar = i;
		range->start = r.addr;
		range->end = r.addr + r.len - 1;
		if (cxla_mem_in_use(cd, pdev))
			return ERR_PTR(-EBUSY);
		return pci_dev_get(pdev);
	}
	dev_err(&cd->vdev->dev,
		"shared memory region %#llx + %#llx lies in no memory BAR of %s\n",
		r.addr, r.len, pci_name(pdev));
	return NULL;
}

/* Bar attach: BAR2 of the ivshmem function beside the virtio function. */
static struct pci_dev *cxla_find_bar(struct cxla_dev *cd,
				     struct resource *range, int *bar)
{
	struct pci_dev *pdev = cxla_find_mem_function(cd);

	if (IS_ERR_OR_NULL(pdev))
		return pdev;
	*bar = CXLA_IVSHMEM_BAR;
	range->start = pci_resource_start(pdev, CXLA_IVSHMEM_BAR);
	range->end = range->start + pci_resource_len(pdev, CXLA_IVSHMEM_BAR) - 1;
	return pdev;
}

int cxla_devmem_init(struct cxla_dev *cd)
{
	struct device *vdev = &cd->vdev->dev;
	struct resource range = { };
	struct pci_dev *pdev;
	resource_size_t start;
	void *addr;
	int ret;

	if (cd->features & CXLA_F_SHMEM)
		pdev = cxla_find_shm_region(cd, &range, &cd->mem_bar);
	else
		pdev = cxla_find_bar(cd, &range, &cd->mem_bar);
	if (IS_ERR_OR_NULL(pdev))
		return pdev ? PTR_ERR(pdev) : -ENODEV;
	cd->mem_pdev = pdev;
	cxla_mem_track(cd, true);

	/*
	 * Shared memory: the BAR is the virtio function's, which virtio-pci
	 * enabled; a second enable would keep it enabled through virtio-pci's
	 * reset_prepare, and then its reset_done never reaches the driver.
	 */
	cd->mem_enabled = &pdev->dev != vdev->parent;
	ret = cd->mem_enabled ? pci_enable_device_mem(pdev) : 0;
	if (ret) {
		dev_err(vdev, "cannot enable %s: %d\n", pci_name(pdev), ret);
		goto err_put;
	}
	ret = pci_request_region(pdev, cd->mem_bar, CXLA_NAME);
	if (ret) {
		dev_err(vdev, "BAR%d of %s is busy: %d\n", cd->mem_bar,
			pci_name(pdev), ret);
		goto err_disable;
	}

	start = range.start;
	ret = -ENODEV;
	if (!(pci_resource_flags(pdev, cd->mem_bar) & IORESOURCE_MEM) ||
	    !start || !resource_size(&range)) {
		dev_err(vdev, "BAR%d of %s is not an assigned memory BAR\n",
			cd->mem_bar, pci_name(pdev));
		goto err_release;
	}
	if (!cd->devmem_size || cd->devmem_size > resource_size(&range)) {
		dev_err(vdev,
			"device reports %llu bytes of memory, BAR%d of %s has %llu\n",
			cd->devmem_size, cd->mem_bar, pci_name(pdev),
			(u64)resource_size(&range));
		goto err_release;
	}
	if (!IS_ALIGNED(start, CXLA_DEVMEM_ALIGN) ||
	    !IS_ALIGNED(cd->devmem_size, CXLA_DEVMEM_ALIGN)) {
		dev_err(vdev,
			"device memory %#llx + %#llx is not 2 MiB aligned: cannot map it as ZONE_DEVICE pages\n",
			(u64)start, cd->devmem_size);
		goto err_release;
	}
	cd->devmem_gpa = start;
	cd->devmem_bus = pci_bus_address(pdev, cd->mem_bar) +
			 (start - pci_resource_start(pdev, cd->mem_bar));

	/* shared memory: also waits until the device's memory is mapped */
	ret = cxla_set_devmem_base(cd);
	if (ret)
		goto err_release;

	cd->pgmap.type = MEMORY_DEVICE_COHERENT;
	cd->pgmap.range.start = start;
	cd->pgmap.range.end = start + cd->devmem_size - 1;
	cd->pgmap.nr_range = 1;
	cd->pgmap.ops = &cxla_pgmap_ops;
	/* shared by all devices: migration moves pages between them (migrate.c) */
	cd->pgmap.owner = &cxla_pgmap_owner;
	addr = memremap_pages(&cd->pgmap, dev_to_node(&pdev->dev));
	if (IS_ERR(addr)) {
		ret = PTR_ERR(addr);
		dev_err(vdev, "memremap_pages of %#llx + %#llx failed: %d\n",
			(u64)start, cd->devmem_size, ret);
		goto err_release;
	}
	cd->pgmap_live = true;
	return 0;

err_release:
	pci_release_region(pdev, cd->mem_bar);
err_disable:
	if (cd->mem_enabled)
		pci_disable_device(pdev);
err_put:
	cxla_mem_track(cd, false);
	pci_dev_put(pdev);
	cd->mem_pdev = NULL;
	return ret;
}

/*
 * Removal, while the command queue still runs and after the user mappings
 * were zapped: give every live buffer back to the device, since a device
 * reset does not free allocations and a later probe must find all device
 * memory free. Commands still in flight on these buffers finish before the
 * reset completes; nothing reuses the memory before the next probe.
 */
void cxla_devmem_free_all(struct cxla_dev *cd)
{
	struct cxla_free f;
	struct cxla_buf *buf;
	unsigned int n = 0, i;
	u64 *ids;
	int ret;

	mutex_lock(&cd->buf_lock);
	/* one id per live buffer: possibly more than kmalloc gives in one piece */
	ids = kvmalloc_array(max(cd->nbufs, 1U), sizeof(*ids), GFP_KERNEL);
	list_for_each_entry(buf, &cd->bufs, node) {
		if (buf->dev_freed || !ids)
			continue;
		buf->dev_freed = true;
		ids[n++] = buf->id;
	}
	mutex_unlock(&cd->buf_lock);

	for (i = 0; i < n && !READ_ONCE(cd->wedged); i++) {
		f.id = cpu_to_le64(ids[i]);
		ret = cxla_simple_cmd(cd, CXLA_OP_FREE, &f, sizeof(f), NULL, 0,
				      NULL, 1000, false);
		if (ret)
			dev_warn(&cd->dev, "FREE of buffer %llu at removal: %d\n",
				 ids[i], ret);
	}
	if (n)
		dev_info(&cd->dev, "%u buffers still in use at removal freed\n", n);
	kvfree(ids);
}

/* Before memunmap_pages(): the pool's emptied buffers go back */
static void cxla_devmem_unmapping(struct cxla_dev *cd)
{
	if (cd->devmem_hooks && cd->devmem_hooks->unmapping)
		cd->devmem_hooks->unmapping(cd);
}

/* The last page of an orphaned removal came back: finish it. */
static void cxla_devmem_work(struct work_struct *work)
{
	struct cxla_dev *cd = container_of(work, struct cxla_dev, devmem_work);

	cxla_devmem_unmapping(cd);
	memunmap_pages(&cd->pgmap);
	cd->pgmap_live = false;
	cxla_devmem_release_pci(cd);
	dev_info(&cd->dev, "the last page of removed device memory was released\n");
	put_device(&cd->dev);
	/* cxla_exit() flushes cxla_wq before the module goes */
	module_put(THIS_MODULE);
}

void cxla_devmem_init_dev(struct cxla_dev *cd)
{
	atomic_long_set(&cd->pages_live, 0);
	INIT_WORK(&cd->devmem_work, cxla_devmem_work);
}

#define CXLA_DEVMEM_GRACE_MS	1000	/* removal: for pins that end soon */
#define CXLA_UNLOAD_NAG_S	10	/* unload: remind every so often */

bool cxla_unloading;

/* Module unload: wait for every page (page_free() is module code). */
static void cxla_devmem_wait_pages(struct cxla_dev *cd)
{
	unsigned long next = jiffies;

	while (atomic_long_read(&cd->pages_live)) {
		if (time_after_eq(jiffies, next)) {
			dev_warn(&cd->dev,
				 "module unload waits for %ld pages of device memory still referenced (pipes, pins): release them\n",
				 atomic_long_read(&cd->pages_live));
			next = jiffies + CXLA_UNLOAD_NAG_S * HZ;
		}
		/* idle: neither a hung task nor a busy loop once a signal is pending */
		schedule_timeout_idle(msecs_to_jiffies(50));
	}
}

/*
 * Removal, once every buffer was given back to the device: the driver's
 * own references on their pages go (the pages return as nobody else holds
 * them).
 */
static void cxla_devmem_drop_buf_pages(struct cxla_dev *cd)
{
	struct cxla_buf *buf;
	unsigned long i;

	mutex_lock(&cd->buf_lock);
	list_for_each_entry(buf, &cd->bufs, node) {
		if (!buf->pages_held)
			continue;
		buf->pages_held = false;
		for (i = 0; i < buf->npages; i++)
			put_page(cxla_buf_page(buf, i));
	}
	mutex_unlock(&cd->buf_lock);
}

/*
 * Removal: pins that end soon get a moment; module unload waits for every
 * page (page_free() is module code).
 */
static void cxla_devmem_wait_grace(struct cxla_dev *cd)
{
	unsigned long deadline = jiffies + msecs_to_jiffies(CXLA_DEVMEM_GRACE_MS);

	while (atomic_long_read(&cd->pages_live) && time_before(jiffies, deadline))
		msleep(20);
	if (READ_ONCE(cxla_unloading))
		cxla_devmem_wait_pages(cd);
}

/*
 * Removal in shared-memory attach, right before the device reset, which
 * takes device memory away from the guest: the driver's own references go
 * (what is left is held by others). Returns whether that applies; the
 * caller then copies out by CPU what the device did not evict
 * (cxla_mig_teardown()) and gives pins their moment while the data is still
 * there (cxla_devmem_reset_grace()).
 */
bool cxla_devmem_before_reset(struct cxla_dev *cd)
{
	if (!(cd->features & CXLA_F_SHMEM) || !cd->pgmap_live)
		return false;
	cxla_devmem_drop_buf_pages(cd);
	return true;
}

/*
 * Pages still referenced after the grace (a pipe, a long pin) read zeros
 * from the reset on; their struct pages stay valid until released, as in
 * bar attach.
 */
void cxla_devmem_reset_grace(struct cxla_dev *cd)
{
	cxla_devmem_wait_grace(cd);
	if (atomic_long_read(&cd->pages_live))
		dev_warn(&cd->dev,
			 "%ld pages of device memory are still referenced (pipes, pins): the device reset takes shared memory away, they read zeros from now on\n",
			 atomic_long_read(&cd->pages_live));
}

/*
 * Removal, after the device was reset and user mappings were zapped: drop
 * the driver's page references of every buffer still alive, then, when all
 * pages are free, undo the mapping. Pages still referenced elsewhere keep
 * it (and the PCI region) until they come back. Returns true then: the
 * caller must leave the PCI region alone.
 */
bool cxla_devmem_teardown(struct cxla_dev *cd)
{
	cxla_devmem_drop_buf_pages(cd);
	if (!cd->pgmap_live)
		return false;
	if (!(cd->features & CXLA_F_SHMEM))	/* else before the reset */
		cxla_devmem_wait_grace(cd);
	/* from here the last page_free() may finish the removal instead */
	__module_get(THIS_MODULE);
	get_device(&cd->dev);
	WRITE_ONCE(cd->devmem_orphan, true);
	smp_mb();	/* orphan flag before the count; page_free: the reverse */
	if (atomic_long_read(&cd->pages_live) ||
	    test_and_set_bit(0, &cd->devmem_unmapping)) {
		dev_warn(&cd->dev,
			 "%ld pages of device memory are still referenced (pipes, pins): it stays mapped until they are released\n",
			 atomic_long_read(&cd->pages_live));
		return true;
	}
	WRITE_ONCE(cd->devmem_orphan, false);
	put_device(&cd->dev);
	module_put(THIS_MODULE);
	cxla_devmem_unmapping(cd);
	memunmap_pages(&cd->pgmap);
	cd->pgmap_live = false;
	return false;
}

/*
 * map_sem for reading, for a fault about to map device memory: during a
 * function reset (cd->resetting, set under map_sem for writing) it waits
 * for the reset's end first, since QEMU takes the BAR away meanwhile.
 * 0 with the lock held, else -EINTR (killed) or -ETIMEDOUT without it.
 */
int cxla_map_read_lock(struct cxla_dev *cd)
{
	int ret;

	for (;;) {
		down_read(&cd->map_sem);
		if (!READ_ONCE(cd->resetting))
			return 0;
		up_read(&cd->map_sem);
		ret = cxla_reset_wait(cd, &cd->resetting);
		if (ret)
			return ret;
	}
}

void cxla_devmem_release_pci(struct cxla_dev *cd)
{
	if (!cd->mem_pdev)
		return;
	cxla_mem_track(cd, false);
	pci_release_region(cd->mem_pdev, cd->mem_bar);
	if (cd->mem_enabled)
		pci_disable_device(cd->mem_pdev);
	pci_dev_put(cd->mem_pdev);
	cd->mem_pdev = NULL;
}

/* Buffer handle of an open file, referenced; NULL: none (or 0) */
struct cxla_buf *cxla_file_buf_get(struct cxla_file *cf, u32 handle)
{
	struct cxla_buf *buf;

	if (!handle)
		return NULL;
	mutex_lock(&cf->lock);
	buf = xa_load(&cf->bufs, handle);
	if (buf)
		cxla_buf_get(buf);
	mutex_unlock(&cf->lock);
	return buf;
}

/* Take every user mapping of this device's buffers away (removal, poison). */
void cxla_zap_mappings(struct cxla_dev *cd)
{
	struct cxla_file *cf;

	mutex_lock(&cd->files_lock);
	list_for_each_entry(cf, &cd->files, node)
		unmap_mapping_range(cf->filp->f_mapping, 0, 0, 1);
	mutex_unlock(&cd->files_lock);
}
