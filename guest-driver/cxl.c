// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: the device as a CXL Type-2 endpoint (feature CXLA_F_CXL, the
 * daemon's --attach cxl), registered with the kernel's CXL core through the
 * Type-2 accelerator API where the kernel has it (7.3), the way the sfc
 * driver does (drivers/net/ethernet/sfc/efx_cxl.c): a CXL device state for
 * the PCI function, its component registers (RAS and HDM decoder
 * capabilities), its capacity, then devm_cxl_probe_mem(), which enumerates
 * the CXL ports above it and attaches the region the firmware stand-in
 * (cxlfw.c) committed. The region's host-physical range is reported in
 * sysfs (cxl); device memory itself stays the BAR. Stock QEMU routes loads
 * and stores to a CXL window only to its own Type-3 devices; with the
 * project's QEMU patch (x-cxl-mem-bar) they reach our BAR, which the probe
 * checks (cxla_cxl_region_backed), and user space may map buffers through
 * the region (CXL_ACCEL_MMAP_REGION, cdev.c).
 *
 * The CXL state hangs on the PCI function (the CXL core walks up from it to
 * the root port), which virtio-pci owns: it is made in a devres group of
 * ours there and belongs to the function, not to one binding of our
 * driver. An unbind and bind of ours finds it again (the memdev stays), so
 * unbind/bind behaves as in the other modes. It goes at module unload: that
 * removes the memdev, and the CXL core then detaches the whole PCI function
 * ("detach escalates to parent"); a work item waits for that and binds
 * virtio-pci again, so the function comes back without a driver of ours.
 * It also goes when virtio-pci lets go of the function (its devres).
 */
#include <linux/bitfield.h>
#include <linux/delay.h>
#include <linux/highmem.h>
#include <linux/io.h>
#include <linux/random.h>
#include <linux/pci.h>
#include <linux/sizes.h>
#include <linux/slab.h>
#include <linux/virtio.h>

#include "compat.h"
#include "cxl_accel.h"
#include "core.h"
#include "cxl.h"
#include "cxlfw.h"
#include "devmem.h"

#ifdef CXLA_CXL_TYPE2
#include <cxl/cxl.h>
#include <cxl/pci.h>

CXLA_IMPORT_NS(CXL);
/* the root of the CXL topology, which no symbol of ours pulls in */
MODULE_SOFTDEP("pre: cxl_acpi");

/* The CXL core allocates it, the CXL device state first */
struct cxla_cxl {
	struct cxl_dev_state cxlds;
};

/* A function registered with the CXL core; its devres group's id */
struct cxla_cxl_reg {
	struct list_head node;		/* on cxla_cxl_regs while it lives */
	struct pci_dev *pdev;
	struct range range;
};

static LIST_HEAD(cxla_cxl_regs);
static DEFINE_MUTEX(cxla_cxl_lock);

/* The group went (unload, or virtio-pci let go of the function) */
static void cxla_cxl_forget(void *data)
{
	struct cxla_cxl_reg *reg = data;

	mutex_lock(&cxla_cxl_lock);
	list_del_init(&reg->node);
	mutex_unlock(&cxla_cxl_lock);
	kfree(reg);
}

static struct cxla_cxl_reg *cxla_cxl_find(struct pci_dev *pdev)
{
	struct cxla_cxl_reg *reg;

	list_for_each_entry(reg, &cxla_cxl_regs, node)
		if (reg->pdev == pdev)
			return reg;
	return NULL;
}

/* A function whose CXL state went: virtio-pci binds it again */
struct cxla_cxl_rebind {
	struct work_struct work;
	struct pci_dev *pdev;
};

static void cxla_cxl_rebind_work(struct work_struct *work)
{
	struct cxla_cxl_rebind *r = container_of(work, struct cxla_cxl_rebind,
						 work);
	int i, ret;

	/* the CXL core detaches the function from a workqueue of its own */
	for (i = 0; i < 500 && READ_ONCE(r->pdev->dev.driver); i++)
		msleep(10);
	ret = device_attach(&r->pdev->dev);
	if (ret < 0)
		pci_warn(r->pdev, "cannot bind its driver again after the CXL teardown: %d\n",
			 ret);
	pci_dev_put(r->pdev);
	kfree(r);
}

/* Register the function with the CXL core: the sfc sequence */
static int cxla_cxl_register(struct cxla_dev *cd, struct pci_dev *pdev,
			     u16 dvsec, struct range *range)
{
	u64 capacity = ALIGN_DOWN(cd->devmem_size, SZ_256M);
	struct cxl_memdev *cxlmd;
	struct cxla_cxl_reg *reg;
	struct cxla_cxl *cxl;
	int ret;

	reg = kzalloc(sizeof(*reg), GFP_KERNEL);
	if (!reg)
		return -ENOMEM;
	INIT_LIST_HEAD(&reg->node);
	reg->pdev = pdev;
	if (!devres_open_group(&pdev->dev, reg, GFP_KERNEL)) {
		kfree(reg);
		return -ENOMEM;
	}
	/* from here the group frees reg, whoever releases it */
	ret = devm_add_action_or_reset(&pdev->dev, cxla_cxl_forget, reg);
	if (ret) {
		devres_release_group(&pdev->dev, reg);
		return ret;
	}
	cxl = devm_cxl_dev_state_create(&pdev->dev, CXL_DEVTYPE_DEVMEM,
					pci_get_dsn(pdev), dvsec,
					struct cxla_cxl, cxlds, false);
	ret = -ENOMEM;
	if (!cxl)
		goto err;
	ret = cxl_pci_setup_regs(pdev, CXL_REGLOC_RBI_COMPONENT,
				 &cxl->cxlds.reg_map);
	if (ret)
		goto err;
	ret = -ENODEV;
	if (!cxl->cxlds.reg_map.component_map.hdm_decoder.valid ||
	    !cxl->cxlds.reg_map.component_map.ras.valid)
		goto err;
	/* no mailbox to ask: the memory is there when the device is */
	cxl->cxlds.media_ready = true;
	ret = cxl_set_capacity(&cxl->cxlds, capacity);
	if (ret)
		goto err;
	cxlmd = devm_cxl_probe_mem(&cxl->cxlds, range);
	if (IS_ERR(cxlmd)) {
		ret = PTR_ERR(cxlmd);
		goto err;
	}
	devres_close_group(&pdev->dev, reg);
	reg->range = *range;
	/* one probe per function at a time: no other can be adding it */
	mutex_lock(&cxla_cxl_lock);
	list_add(&reg->node, &cxla_cxl_regs);
	mutex_unlock(&cxla_cxl_lock);
	return 0;

err:
	devres_release_group(&pdev->dev, reg);
	return ret;
}

/*
 * Does the region's host-physical range reach device memory? A word
 * written through the BAR is read back through the region. Stock QEMU
 * routes CXL window accesses only to its own cxl-type3 devices: loads
 * read 0 and stores are dropped.
 */
static bool cxla_cxl_region_backed(struct cxla_dev *cd,
				   const struct range *range)
{
	u64 marker = get_random_u64() | 1, got = 0, old;
	void __iomem *hpa;
	struct cxla_buf *buf;
	u64 *va;

	if (cxla_buf_alloc(cd, PAGE_SIZE, PAGE_SIZE, &buf))
		return false;
	if (range->start + buf->offset + PAGE_SIZE - 1 > range->end)
		goto out;
	hpa = ioremap(range->start + buf->offset, PAGE_SIZE);
	if (!hpa)
		goto out;
	va = kmap_local_page(cxla_buf_page(buf, 0));
	old = READ_ONCE(*va);
	WRITE_ONCE(*va, marker);
	got = readq(hpa);
	WRITE_ONCE(*va, old);	/* the page is as it was */
	kunmap_local(va);
	iounmap(hpa);
out:
	cxla_buf_put(buf);
	return got == marker;
}

int cxla_cxl_probe(struct cxla_dev *cd)
{
	struct device *parent = cd->vdev->dev.parent;
	struct cxla_cxl_reg *reg;
	struct pci_dev *pdev;
	struct range range;
	bool again;
	u16 dvsec;
	int ret = 0;

	if (!(cd->features & CXLA_F_CXL))
		return 0;
	cd->cxl_status = -ENODEV;
	if (!parent || !dev_is_pci(parent))
		return 0;
	pdev = to_pci_dev(parent);
	dvsec = pci_find_dvsec_capability(pdev, PCI_VENDOR_ID_CXL,
					  PCI_DVSEC_CXL_DEVICE);
	if (!pcie_is_cxl(pdev) || !dvsec) {
		dev_warn(&cd->dev, "the device says CXL but %s has no CXL DVSECs: not a CXL endpoint\n",
			 pci_name(pdev));
		return 0;
	}
	mutex_lock(&cxla_cxl_lock);
	reg = cxla_cxl_find(pdev);
	if (reg)
		range = reg->range;	/* registered at an earlier bind */
	mutex_unlock(&cxla_cxl_lock);
	again = reg;
	/* unlocked: a failure releases the group, whose action takes the lock */
	if (!reg)
		ret = cxla_cxl_register(cd, pdev, dvsec, &range);
	cd->cxl_status = ret;
	if (ret) {
		dev_warn(&cd->dev, "not registered with the CXL core: %d (is cxl_acpi loaded, the decoders committed? see cxlfw.c); the device works without a CXL region\n",
			 ret);
		return 0;
	}
	cd->cxl_range = range;
	cd->cxl_backed = cxla_cxl_region_backed(cd, &range);
	dev_info(&cd->dev, "CXL Type-2 endpoint %s%s: region %#llx-%#llx (%llu MiB of device memory), %s\n",
		 pci_name(pdev), again ? " (registered before)" : "",
		 range.start, range.end,
		 (unsigned long long)range_len(&range) >> 20,
		 cd->cxl_backed ? "backed: loads and stores reach device memory" :
		 "not backed by this QEMU (loads read 0, stores are dropped): device memory is used through the BAR");
	return 0;
}

/* Unload: every function's CXL state goes, and the functions come back */
void cxla_cxl_exit(void)
{
	struct cxla_cxl_rebind *r;
	struct cxla_cxl_reg *reg;
	struct pci_dev *pdev;

	for (;;) {
		mutex_lock(&cxla_cxl_lock);
		reg = list_first_entry_or_null(&cxla_cxl_regs,
					       struct cxla_cxl_reg, node);
		if (reg)
			list_del_init(&reg->node);
		mutex_unlock(&cxla_cxl_lock);
		if (!reg)
			break;
		pdev = pci_dev_get(reg->pdev);
		/* reg is freed in there (cxla_cxl_forget) */
		devres_release_group(&pdev->dev, reg);
		r = kzalloc(sizeof(*r), GFP_KERNEL);
		if (!r) {
			pci_dev_put(pdev);
			continue;
		}
		INIT_WORK(&r->work, cxla_cxl_rebind_work);
		r->pdev = pdev;	/* our reference goes to the work */
		queue_work(cxla_wq, &r->work);
	}
}

#else /* no Type-2 API */

int cxla_cxl_probe(struct cxla_dev *cd)
{
	if (!(cd->features & CXLA_F_CXL))
		return 0;
	cd->cxl_status = -EOPNOTSUPP;
	dev_info(&cd->dev, "a CXL Type-2 endpoint, but this kernel has no CXL Type-2 accelerator API (Linux 7.3 has it): working without a CXL region\n");
	return 0;
}

#endif

/* CXL r3.1 8.1.3.1, 8.1.3.4-5: CXL Reset in the CXL Device DVSEC */
#define CXLA_DVSEC_CAP_RESET		BIT(7)
#define CXLA_DVSEC_CAP_RESET_TIMEOUT	GENMASK(10, 8)
#define CXLA_DVSEC_CAP_MEM_CLR		BIT(11)
#define CXLA_DVSEC_CTRL2		0x10
#define CXLA_DVSEC_CTRL2_RESET		BIT(2)
#define CXLA_DVSEC_CTRL2_MEM_CLR	BIT(3)
#define CXLA_DVSEC_STATUS2		0x12
#define CXLA_DVSEC_STATUS2_DONE		BIT(1)
#define CXLA_DVSEC_STATUS2_ERROR	BIT(2)

#ifdef CXLA_HAVE_VIRTIO_RESET
/*
 * CXL Reset (CXL r3.1 9.7), for which the PCI core has no reset method:
 * the driver quiesces as for an FLR (virtio's reset_prepare, main.c), saves
 * config space, starts the reset through the CXL Device DVSEC (with Mem Clr
 * when asked), waits for Reset Complete within the timeout the device
 * advertises, restores config space and sets the device up again
 * (reset_done). What firmware locked (the decoders, CONFIG_LOCK) survives
 * it, so the region stays; with clear, device memory reads zeros after.
 */
int cxla_cxl_reset(struct cxla_dev *cd, bool clear)
{
	struct pci_dev *pdev = to_pci_dev(cd->vdev->dev.parent);
	u16 dvsec, cap, st = 0;
	unsigned long deadline;
	unsigned int ms, code;
	int ret, done;

	dvsec = pci_find_dvsec_capability(pdev, PCI_VENDOR_ID_CXL,
					  PCI_DVSEC_CXL_DEVICE);
	if (!dvsec)
		return -ENODEV;
	pci_read_config_word(pdev, dvsec + PCI_DVSEC_CXL_CAP, &cap);
	if (!(cap & CXLA_DVSEC_CAP_RESET) ||
	    (clear && !(cap & CXLA_DVSEC_CAP_MEM_CLR)))
		return -EOPNOTSUPP;
	/* 000b 10 ms, 001b 100 ms, 010b 1 s, 011b 10 s, 100b 100 s */
	code = min_t(unsigned int, FIELD_GET(CXLA_DVSEC_CAP_RESET_TIMEOUT, cap), 4);
	for (ms = 10; code; code--)
		ms *= 10;
	/* not during a PCI reset of the function, nor its removal */
	if (!device_trylock(&pdev->dev))
		return -EBUSY;
	ret = virtio_device_reset_prepare(cd->vdev);
	if (ret)
		goto out;
	pci_save_state(pdev);
	pci_write_config_word(pdev, dvsec + CXLA_DVSEC_CTRL2,
			      CXLA_DVSEC_CTRL2_RESET |
			      (clear ? CXLA_DVSEC_CTRL2_MEM_CLR : 0));
	deadline = jiffies + msecs_to_jiffies(ms);
	for (;;) {
		pci_read_config_word(pdev, dvsec + CXLA_DVSEC_STATUS2, &st);
		if (st & (CXLA_DVSEC_STATUS2_DONE | CXLA_DVSEC_STATUS2_ERROR) ||
		    time_after(jiffies, deadline))
			break;
		usleep_range(10000, 20000);
	}
	pci_restore_state(pdev);
	done = virtio_device_reset_done(cd->vdev);
	if (!(st & CXLA_DVSEC_STATUS2_DONE) || (st & CXLA_DVSEC_STATUS2_ERROR)) {
		dev_err(&cd->dev, "CXL reset: no Reset Complete within %u ms (Status2 %#x)\n",
			ms, st);
		ret = -EIO;
	} else {
		ret = done;
		dev_info(&cd->dev, "CXL reset%s complete (Status2 %#x)\n",
			 clear ? " with memory clear" : "", st);
	}
out:
	device_unlock(&pdev->dev);
	return ret;
}
#else
int cxla_cxl_reset(struct cxla_dev *cd, bool clear)
{
	return -EOPNOTSUPP;	/* the driver needs virtio's reset_prepare */
}
#endif

/*
 * After any reset of the function (main.c's reset_done): a conventional one
 * (a secondary bus reset: the kernel's cxl_bus method) returned the
 * endpoint's decoder and DVSEC to their defaults, under a region the CXL
 * core still holds; firmware would set them up again, so its stand-in
 * does (cxlfw.c). FLR and CXL Reset leave them, and this finds them there.
 */
void cxla_cxl_after_reset(struct cxla_dev *cd)
{
	int ret;

	if (!(cd->features & CXLA_F_CXL) || cd->cxl_status ||
	    !dev_is_pci(cd->vdev->dev.parent))
		return;
	ret = cxla_cxl_firmware_endpoint(to_pci_dev(cd->vdev->dev.parent),
					 cd->cxl_range.start);
	if (ret < 0)
		dev_err(&cd->dev, "after a reset: the region's decoder not set up again (%d): loads and stores through it fail\n",
			ret);
}

/* "keep" or "clear" (device memory): a CXL Reset of the device */
static ssize_t cxl_reset_store(struct device *dev,
			       struct device_attribute *attr,
			       const char *buf, size_t count)
{
	struct cxla_dev *cd = to_cxla_dev(dev);
	bool clear;
	int ret;

	if (sysfs_streq(buf, "clear"))
		clear = true;
	else if (sysfs_streq(buf, "keep"))
		clear = false;
	else
		return -EINVAL;
	if (!(cd->features & CXLA_F_CXL) || !cd->vdev ||
	    !dev_is_pci(cd->vdev->dev.parent))
		return -ENODEV;
	ret = cxla_cxl_reset(cd, clear);
	return ret ?: count;
}
static DEVICE_ATTR_WO(cxl_reset);

static ssize_t cxl_show(struct device *dev, struct device_attribute *attr,
			char *buf)
{
	struct cxla_dev *cd = to_cxla_dev(dev);

	if (!(cd->features & CXLA_F_CXL))
		return sysfs_emit(buf, "none: not a CXL device\n");
	if (cd->cxl_status)
		return sysfs_emit(buf, "none: %d\n", cd->cxl_status);
	return sysfs_emit(buf, "region %#llx-%#llx %s\n", cd->cxl_range.start,
			  cd->cxl_range.end,
			  cd->cxl_backed ? "backed" : "not-backed");
}
static DEVICE_ATTR_RO(cxl);

static struct attribute *cxla_cxl_attrs[] = {
	&dev_attr_cxl.attr,
	&dev_attr_cxl_reset.attr,
	NULL,
};

const struct attribute_group cxla_cxl_group = {
	.attrs = cxla_cxl_attrs,
};
