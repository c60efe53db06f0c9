// SPDX-License-Identifier: GPL-2.0
/*
 * A minimal CXL Type-2 driver for the cxl-accel device (--attach cxl), to
 * copy. Per device it
 *   1. binds the virtio function (device ID 21), checks magic and version in
 *      config space, sets up command queue 0 and resets the device;
 *   2. registers the PCI function with the kernel's CXL core as a Type-2
 *      (CXL_DEVTYPE_DEVMEM) device, the sequence of the sfc driver
 *      (drivers/net/ethernet/sfc/efx_cxl.c): a CXL device state, the
 *      component registers, the capacity, devm_cxl_probe_mem(), which gives
 *      the region the platform committed;
 *   3. maps the region (and the memory BAR, VIRTIO shared memory region 0),
 *      finds out whether the region reaches device memory (QEMU does that
 *      with qemu/patches; stock QEMU drops loads and stores to it);
 *   4. runs one device command: ALLOC 4 KiB, FILL it with a pattern, reads
 *      the pattern back through the region where it is backed, else through
 *      the BAR, FREE;
 *   5. on removal undoes all of it; the CXL core then lets go of the whole
 *      PCI function, and virtio-pci is bound to it again.
 * Commands are polled (no interrupts) and bounded: a sample, not a driver.
 * The wire format is guest-driver/cxl_accel_proto.h, the device
 * docs/device-spec.md (section 8 for this attach mode).
 */
#include <linux/delay.h>
#include <linux/io.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/scatterlist.h>
#include <linux/sizes.h>
#include <linux/slab.h>
#include <linux/virtio.h>
#include <linux/virtio_config.h>
#include <linux/workqueue.h>
#include <cxl/cxl.h>
#include <cxl/pci.h>

#include "cxl_accel_proto.h"

MODULE_IMPORT_NS("CXL");
MODULE_SOFTDEP("pre: cxl_acpi");

#define SAMPLE_PATTERN	0x5a17c3e1a5e83c1eULL
#define SAMPLE_WAIT_MS	5000

static struct workqueue_struct *sample_wq;	/* the rebinds after a removal */

struct sample_cxl {
	struct cxl_dev_state cxlds;	/* first: the CXL core allocates it */
};

struct sample {
	struct virtio_device *vdev;
	struct virtqueue *vq;
	struct pci_dev *pdev;
	struct range region;
	void *group;			/* devres group of the CXL state on pdev */
	u64 tag;
};

/* One command: request and response in one allocation, polled to the end. */
static int sample_cmd(struct sample *s, u16 opcode, const void *payload,
		      size_t len, struct cxla_resp *resp)
{
	struct {
		struct cxla_resp resp;
		struct cxla_cmd_hdr hdr;
		u8 payload[64];
	} *m;
	struct scatterlist out, in, *sgs[] = { &out, &in };
	unsigned int got_len, i;
	void *got = NULL;
	int ret;

	if (len > sizeof(m->payload))
		return -EINVAL;
	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m)
		return -ENOMEM;
	m->hdr.opcode = cpu_to_le16(opcode);
	m->hdr.tag = cpu_to_le64(++s->tag);
	memcpy(m->payload, payload, len);
	sg_init_one(&out, &m->hdr, sizeof(m->hdr) + len);
	sg_init_one(&in, &m->resp, sizeof(m->resp));
	ret = virtqueue_add_sgs(s->vq, sgs, 1, 1, m, GFP_KERNEL);
	if (ret)
		goto out;
	virtqueue_kick(s->vq);
	for (i = 0; i < SAMPLE_WAIT_MS && !got; i++) {
		got = virtqueue_get_buf(s->vq, &got_len);
		if (!got)
			usleep_range(1000, 1100);
	}
	if (!got) {
		/* the device still owns m: take the queue away before it goes */
		virtio_reset_device(s->vdev);
		dev_err(&s->vdev->dev, "opcode %#x: no answer in %d ms\n",
			opcode, SAMPLE_WAIT_MS);
		ret = -ETIMEDOUT;
		goto out;
	}
	*resp = m->resp;
	if (got_len < sizeof(m->resp) || le64_to_cpu(resp->tag) != s->tag)
		ret = -EIO;
	else if (le32_to_cpu(resp->status) != CXLA_S_OK)
		ret = -EREMOTEIO;
out:
	kfree(m);
	return ret;
}

/* The sfc sequence: the PCI function becomes a CXL Type-2 memdev with a region */
static int sample_cxl_register(struct sample *s, u64 capacity)
{
	struct pci_dev *pdev = s->pdev;
	struct cxl_memdev *cxlmd;
	struct sample_cxl *cxl;
	u16 dvsec;
	int ret;

	dvsec = pci_find_dvsec_capability(pdev, PCI_VENDOR_ID_CXL,
					  PCI_DVSEC_CXL_DEVICE);
	if (!dvsec)
		return -ENODEV;
	/* the state belongs to the PCI function: a group we release at remove */
	s->group = devres_open_group(&pdev->dev, NULL, GFP_KERNEL);
	if (!s->group)
		return -ENOMEM;
	cxl = devm_cxl_dev_state_create(&pdev->dev, CXL_DEVTYPE_DEVMEM,
					pci_get_dsn(pdev), dvsec,
					struct sample_cxl, cxlds, false);
	ret = -ENOMEM;
	if (!cxl)
		goto err;
	ret = cxl_pci_setup_regs(pdev, CXL_REGLOC_RBI_COMPONENT,
				 &cxl->cxlds.reg_map);
	if (ret)
		goto err;
	cxl->cxlds.media_ready = true;	/* no mailbox: memory is there */
	ret = cxl_set_capacity(&cxl->cxlds, capacity);
	if (ret)
		goto err;
	cxlmd = devm_cxl_probe_mem(&cxl->cxlds, &s->region);
	if (IS_ERR(cxlmd)) {
		ret = PTR_ERR(cxlmd);
		goto err;
	}
	devres_close_group(&pdev->dev, s->group);
	return 0;
err:
	devres_release_group(&pdev->dev, s->group);
	s->group = NULL;
	return ret;
}

/* ALLOC, FILL, read back, FREE: one device command checked end to end */
static int sample_fill_check(struct sample *s, void __iomem *bar)
{
	struct cxla_alloc a = { .size = cpu_to_le64(SZ_4K) };
	struct cxla_sge sge = { .len = cpu_to_le32(SZ_4K),
				.space = cpu_to_le16(CXLA_SPACE_DEVMEM) };
	struct { struct cxla_fill f; struct cxla_sge sge; } fill = {
		.f = { .pattern = cpu_to_le64(SAMPLE_PATTERN),
		       .nr_dst = cpu_to_le32(1) },
	};
	void __iomem *region, *where;
	struct cxla_free fr;
	struct cxla_resp r;
	u64 off, marker = 0x0123456789abcdefULL, id;
	bool backed;
	int ret, i, bad = 0;

	ret = sample_cmd(s, CXLA_OP_ALLOC, &a, sizeof(a), &r);
	if (ret)
		return ret;
	id = le64_to_cpu(r.result0);
	off = le64_to_cpu(r.result1);
	region = ioremap(s->region.start + off, SZ_4K);
	if (!region) {
		ret = -ENOMEM;
		goto free;
	}
	/* does the region reach device memory? a word through the BAR tells */
	writeq(marker, bar + off);
	backed = readq(region) == marker;
	sge.addr = cpu_to_le64(off);
	fill.sge = sge;
	ret = sample_cmd(s, CXLA_OP_FILL, &fill, sizeof(fill), &r);
	if (!ret && le64_to_cpu(r.result0) != SZ_4K)
		ret = -EIO;
	where = backed ? region : bar + off;
	for (i = 0; !ret && i < SZ_4K; i += 8)
		bad += readq(where + i) != SAMPLE_PATTERN;
	if (!ret && bad)
		ret = -EIO;
	if (!ret)
		dev_info(&s->vdev->dev,
			 "%s: region %#llx-%#llx %s; FILL of 4 KiB at device offset %#llx read back through the %s: right\n",
			 pci_name(s->pdev), s->region.start, s->region.end,
			 backed ? "backed" : "not backed by this QEMU", off,
			 backed ? "region" : "BAR");
	iounmap(region);
free:
	fr.id = cpu_to_le64(id);
	i = sample_cmd(s, CXLA_OP_FREE, &fr, sizeof(fr), &r);
	return ret ?: i;
}

static int sample_probe(struct virtio_device *vdev)
{
	struct virtqueue_info info = { .name = "cxl-type2-sample" };
	struct cxla_set_devmem_base base;
	struct virtio_shm_region shm;
	struct cxla_resp r;
	void __iomem *bar;
	struct sample *s;
	u64 features, size;
	u32 magic;
	u16 major;
	int ret, i;

	virtio_cread_le(vdev, struct cxla_config, magic, &magic);
	virtio_cread_le(vdev, struct cxla_config, version_major, &major);
	virtio_cread_le(vdev, struct cxla_config, features, &features);
	virtio_cread_le(vdev, struct cxla_config, devmem_size, &size);
	if (magic != CXLA_MAGIC || major != CXLA_VERSION_MAJOR ||
	    !(features & CXLA_F_CXL) || !dev_is_pci(vdev->dev.parent))
		return -ENODEV;		/* not a cxl-accel CXL endpoint */
	if (!virtio_get_shm_region(vdev, &shm, CXLA_SHM_ID_DEVMEM))
		return -ENODEV;
	s = devm_kzalloc(&vdev->dev, sizeof(*s), GFP_KERNEL);
	if (!s)
		return -ENOMEM;
	s->vdev = vdev;
	s->pdev = to_pci_dev(vdev->dev.parent);
	vdev->priv = s;
	ret = virtio_find_vqs(vdev, 1, &s->vq, &info, NULL);	/* no callback: polled */
	if (ret)
		return ret;
	virtio_device_ready(vdev);
	/* what an earlier driver left is released; the device learns its BAR */
	ret = sample_cmd(s, CXLA_OP_RESET, NULL, 0, &r);
	base.gpa = cpu_to_le64(shm.addr);
	for (i = 0; !ret && i < 100; i++) {
		ret = sample_cmd(s, CXLA_OP_SET_DEVMEM_BASE, &base, sizeof(base), &r);
		if (ret != -EREMOTEIO || le32_to_cpu(r.status) != CXLA_S_NOT_READY)
			break;
		msleep(20);
	}
	if (ret)
		goto err_vqs;
	ret = sample_cxl_register(s, ALIGN_DOWN(size, SZ_256M));
	if (ret) {
		dev_err(&vdev->dev, "%s: CXL Type-2 registration: %d (are the decoders committed?)\n",
			pci_name(s->pdev), ret);
		goto err_vqs;
	}
	bar = ioremap_wc(shm.addr, shm.len);
	ret = bar ? sample_fill_check(s, bar) : -ENOMEM;
	if (bar)
		iounmap(bar);
	if (ret) {
		dev_err(&vdev->dev, "the device command failed: %d\n", ret);
		goto err_cxl;
	}
	return 0;

err_cxl:
	devres_release_group(&s->pdev->dev, s->group);
err_vqs:
	virtio_reset_device(vdev);
	vdev->config->del_vqs(vdev);
	return ret;
}

/* The CXL core detaches the PCI function once its memdev is gone */
struct sample_rebind {
	struct work_struct work;
	struct pci_dev *pdev;
};

static void sample_rebind_work(struct work_struct *work)
{
	struct sample_rebind *rb = container_of(work, struct sample_rebind, work);
	int i;

	for (i = 0; i < 500 && READ_ONCE(rb->pdev->dev.driver); i++)
		usleep_range(10000, 11000);
	if (device_attach(&rb->pdev->dev) < 0)
		pci_warn(rb->pdev, "virtio-pci not bound again\n");
	pci_dev_put(rb->pdev);
	kfree(rb);
}

static void sample_remove(struct virtio_device *vdev)
{
	struct sample *s = vdev->priv;
	struct sample_rebind *rb;

	virtio_reset_device(vdev);
	vdev->config->del_vqs(vdev);
	rb = kzalloc(sizeof(*rb), GFP_KERNEL);
	if (rb) {
		INIT_WORK(&rb->work, sample_rebind_work);
		rb->pdev = pci_dev_get(s->pdev);
	}
	devres_release_group(&s->pdev->dev, s->group);
	if (rb)
		queue_work(sample_wq, &rb->work);
}

static const struct virtio_device_id sample_ids[] = {
	{ CXLA_VIRTIO_ID, VIRTIO_DEV_ANY_ID },
	{ 0 },
};

static struct virtio_driver sample_driver = {
	.driver.name = "cxl_type2_sample",
	.id_table = sample_ids,
	.probe = sample_probe,
	.remove = sample_remove,
};

static int __init sample_init(void)
{
	int ret;

	sample_wq = alloc_workqueue("cxl_type2_sample", WQ_UNBOUND, 0);
	if (!sample_wq)
		return -ENOMEM;
	ret = register_virtio_driver(&sample_driver);
	if (ret)
		destroy_workqueue(sample_wq);
	return ret;
}

static void __exit sample_exit(void)
{
	unregister_virtio_driver(&sample_driver);
	destroy_workqueue(sample_wq);	/* the rebinds run first */
}

module_init(sample_init);
module_exit(sample_exit);
MODULE_DEVICE_TABLE(virtio, sample_ids);
MODULE_DESCRIPTION("Sample CXL Type-2 driver for the cxl-accel device");
MODULE_LICENSE("GPL");
