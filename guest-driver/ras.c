// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: CXL RAS errors of the device as a CXL endpoint (feature
 * CXLA_F_CXL). The RAS capability of its component registers (BAR2, the
 * CXL.cache/mem capability array at 4 KiB) holds uncorrectable and
 * correctable error status, masks, the first error pointer and a header
 * log, as CXL r3.1 8.2.4.17 says.
 *
 * On hardware an unmasked error is signalled with PCIe AER at the root
 * port, and the kernel's CXL code reads and clears the RAS registers from
 * its AER handler. QEMU's vfio-user client forwards no AER to the guest
 * (a vfio device's error interrupt stops the VM instead), so the device
 * signals an unmasked error with an event (CXLA_EVENT_CXL_RAS) and this
 * handler does what the kernel's does: correctable status logged and
 * cleared (write 1 to clear); uncorrectable status logged with the first
 * error (the first error pointer when several bits are set) and the header
 * log, then cleared. Like the kernel's cxl_pci for its devices, the driver
 * unmasks every error at probe; sysfs cxl_ras_mask sets the masks (a masked
 * error stays in the status register, unsignalled, until the next handled
 * one clears it with the rest).
 *
 * Recovery. An uncorrectable error that the severity register calls fatal
 * leaves the device's state in doubt; on hardware AER would then reset the
 * link below the root port and call the PCI driver's error handlers (here
 * virtio-pci's, which have none for errors). The driver recovers itself
 * instead: a CXL Reset without Mem Clr (cxl.c), the driver quiesced around
 * it as for any reset, so device memory, the region and every user's data
 * stay and the device serves again.
 */
#include <linux/bitfield.h>
#include <linux/io.h>
#include <linux/pci.h>
#include <linux/slab.h>
#include <linux/sizes.h>
#include <linux/virtio.h>

#include "cxl_accel.h"
#include "core.h"
#include "cxl.h"
#include "devmem.h"
#include "ras.h"
#include "vq.h"

#define CXLA_COMPONENT_BAR	2
#define CXLA_CM_OFFSET		SZ_4K	/* CXL.cache/mem registers in the block */
#define CXLA_CM_LEN		SZ_4K
#define CXLA_CAP_ID_RAS		2
#define CXLA_CAP_HDR_COUNT	GENMASK(31, 24)
#define CXLA_CAP_ID		GENMASK(15, 0)
#define CXLA_CAP_PTR		GENMASK(31, 20)
#define CXLA_RAS_LEN		0x58

/* RAS capability registers */
#define CXLA_RAS_UE_STATUS	0x00
#define CXLA_RAS_UE_MASK	0x04
#define CXLA_RAS_UE_SEVERITY	0x08
#define CXLA_RAS_CE_STATUS	0x0C
#define CXLA_RAS_CE_MASK	0x10
#define CXLA_RAS_CAP_CONTROL	0x14
#define CXLA_RAS_FE		GENMASK(5, 0)
#define CXLA_RAS_HEADER_LOG	0x18
#define CXLA_RAS_HEADER_WORDS	16
#define CXLA_RAS_UE_BITS	0x1CFFF
#define CXLA_RAS_CE_BITS	0x7F

struct cxla_ras {
	struct cxla_dev *cd;
	struct pci_dev *pdev;
	void __iomem *block;		/* the CXL.cache/mem registers */
	void __iomem *regs;		/* the RAS capability in there */
	struct work_struct work;
	struct mutex lock;		/* the registers and what follows */
	u64 ce_events;			/* correctable errors handled */
	u64 ue_events;			/* uncorrectable errors handled */
	u32 last_ce;			/* their last status */
	u32 last_ue;
	u32 last_fe;			/* the last uncorrectable's first error */
	u32 last_header[CXLA_RAS_HEADER_WORDS];
	u64 recoveries;			/* CXL Resets after fatal errors */
	int last_recovery;		/* how the last one ended */
};

/* The RAS capability in the CXL capability array, or NULL */
static void __iomem *cxla_ras_find(struct cxla_dev *cd, void __iomem *cm)
{
	u32 hdr = readl(cm);
	unsigned int i, n = FIELD_GET(CXLA_CAP_HDR_COUNT, hdr);

	for (i = 1; i <= n && 4 * i < CXLA_CM_LEN; i++) {
		u32 cap = readl(cm + 4 * i);
		u32 ptr = FIELD_GET(CXLA_CAP_PTR, cap);

		if (FIELD_GET(CXLA_CAP_ID, cap) != CXLA_CAP_ID_RAS)
			continue;
		if (ptr + CXLA_RAS_LEN > CXLA_CM_LEN) {
			dev_warn(&cd->dev, "CXL RAS capability at %#x lies outside the registers\n",
				 ptr);
			return NULL;
		}
		return cm + ptr;
	}
	return NULL;
}

/* Correctable errors: logged, counted, cleared */
static void cxla_ras_correctable(struct cxla_ras *ras)
{
	u32 status = readl(ras->regs + CXLA_RAS_CE_STATUS) & CXLA_RAS_CE_BITS;

	if (!status)
		return;
	writel(status, ras->regs + CXLA_RAS_CE_STATUS);
	ras->ce_events++;
	ras->last_ce = status;
	dev_warn_ratelimited(&ras->cd->dev, "CXL RAS: correctable error, status %#x\n",
			     status);
}

/* Uncorrectable errors: the first one's header log too; whether one is fatal */
static bool cxla_ras_uncorrectable(struct cxla_ras *ras)
{
	u32 status = readl(ras->regs + CXLA_RAS_UE_STATUS) & CXLA_RAS_UE_BITS;
	u32 fe;
	int i;

	if (!status)
		return false;
	fe = status;
	if (hweight32(status) > 1)
		fe = BIT(FIELD_GET(CXLA_RAS_FE,
				   readl(ras->regs + CXLA_RAS_CAP_CONTROL)));
	for (i = 0; i < CXLA_RAS_HEADER_WORDS; i++)
		ras->last_header[i] = readl(ras->regs + CXLA_RAS_HEADER_LOG + 4 * i);
	writel(status, ras->regs + CXLA_RAS_UE_STATUS);
	ras->ue_events++;
	ras->last_ue = status;
	ras->last_fe = fe;
	dev_err_ratelimited(&ras->cd->dev,
			    "CXL RAS: uncorrectable error, status %#x, first error %#x, header log %08x %08x %08x %08x\n",
			    status, fe, ras->last_header[0], ras->last_header[1],
			    ras->last_header[2], ras->last_header[3]);
	return status & readl(ras->regs + CXLA_RAS_UE_SEVERITY);
}

/* After a fatal error: a CXL Reset that keeps device memory (above) */
static void cxla_ras_recover(struct cxla_ras *ras)
{
	struct cxla_dev *cd = ras->cd;
	int ret;

	dev_warn(&cd->dev, "CXL RAS: a fatal error: recovering with a CXL Reset\n");
	ret = cxla_cxl_reset(cd, false);
	mutex_lock(&ras->lock);
	ras->recoveries++;
	ras->last_recovery = ret;
	mutex_unlock(&ras->lock);
	if (ret)
		dev_err(&cd->dev, "CXL RAS: recovery failed (%d): unbind and bind the driver\n",
			ret);
	else
		dev_info(&cd->dev, "CXL RAS: recovered, the device serves again\n");
}

static void cxla_ras_work(struct work_struct *work)
{
	struct cxla_ras *ras = container_of(work, struct cxla_ras, work);
	bool fatal;

	mutex_lock(&ras->lock);
	cxla_ras_correctable(ras);
	fatal = cxla_ras_uncorrectable(ras);
	mutex_unlock(&ras->lock);
	if (fatal && !READ_ONCE(ras->cd->dead))
		cxla_ras_recover(ras);
	cxla_deferred_done(ras->cd);
}

/* The event handler (interrupt context): the registers are read later */
static void cxla_ras_kick(struct cxla_dev *cd)
{
	if (cd->ras)
		cxla_defer(cd, &cd->ras->work);
	else
		dev_warn_ratelimited(&cd->dev, "CXL RAS event, but no RAS registers known\n");
}

int cxla_ras_init(struct cxla_dev *cd)
{
	struct device *parent = cd->vdev->dev.parent;
	struct pci_dev *pdev;
	void __iomem *block, *regs;
	struct cxla_ras *ras;

	/* an event without registers known is reported */
	cxla_evt_set_handler(cd, CXLA_EVENT_CXL_RAS, cxla_ras_kick);
	if (!(cd->features & CXLA_F_CXL) || !parent || !dev_is_pci(parent))
		return 0;
	pdev = to_pci_dev(parent);
	if (pci_resource_len(pdev, CXLA_COMPONENT_BAR) < CXLA_CM_OFFSET + CXLA_CM_LEN) {
		dev_warn(&cd->dev, "no CXL component registers in BAR%d: RAS errors not handled\n",
			 CXLA_COMPONENT_BAR);
		return 0;
	}
	block = pci_iomap_range(pdev, CXLA_COMPONENT_BAR, CXLA_CM_OFFSET,
				CXLA_CM_LEN);
	if (!block)
		return -ENOMEM;
	regs = cxla_ras_find(cd, block);
	if (!regs) {
		dev_warn(&cd->dev, "no CXL RAS capability: RAS errors not handled\n");
		pci_iounmap(pdev, block);
		return 0;
	}
	ras = kzalloc(sizeof(*ras), GFP_KERNEL);
	if (!ras) {
		pci_iounmap(pdev, block);
		return -ENOMEM;
	}
	ras->cd = cd;
	ras->pdev = pdev;
	ras->block = block;
	ras->regs = regs;
	mutex_init(&ras->lock);
	INIT_WORK(&ras->work, cxla_ras_work);
	cd->ras = ras;
	/* errors raised before we were here, then every error signalled */
	cxla_ras_correctable(ras);
	cxla_ras_uncorrectable(ras);
	writel(0, regs + CXLA_RAS_UE_MASK);
	writel(0, regs + CXLA_RAS_CE_MASK);
	return 0;
}

/*
 * Removal, after the device reset (no event comes any more) and after its
 * sysfs files went: the handler and the mapping go.
 */
void cxla_ras_stop(struct cxla_dev *cd)
{
	struct cxla_ras *ras = cd->ras;

	if (!ras)
		return;
	if (cancel_work_sync(&ras->work))
		cxla_deferred_done(cd);
	cd->ras = NULL;
	pci_iounmap(ras->pdev, ras->block);
	kfree(ras);
}

/* sysfs: what the driver handled, and the registers now */
static ssize_t cxl_ras_show(struct device *dev, struct device_attribute *attr,
			    char *buf)
{
	struct cxla_ras *ras = to_cxla_dev(dev)->ras;
	ssize_t n;

	if (!ras)
		return sysfs_emit(buf, "none\n");
	mutex_lock(&ras->lock);
	n = sysfs_emit(buf,
		       "correctable_events %llu\nuncorrectable_events %llu\nlast_correctable_status %#x\nlast_uncorrectable_status %#x\nlast_first_error %#x\nlast_header_log %08x %08x %08x %08x\nuncorrectable_status %#x\ncorrectable_status %#x\nuncorrectable_mask %#x\ncorrectable_mask %#x\nuncorrectable_severity %#x\nrecoveries %llu\nlast_recovery %d\n",
		       ras->ce_events, ras->ue_events, ras->last_ce,
		       ras->last_ue, ras->last_fe, ras->last_header[0],
		       ras->last_header[1], ras->last_header[2],
		       ras->last_header[3],
		       readl(ras->regs + CXLA_RAS_UE_STATUS),
		       readl(ras->regs + CXLA_RAS_CE_STATUS),
		       readl(ras->regs + CXLA_RAS_UE_MASK),
		       readl(ras->regs + CXLA_RAS_CE_MASK),
		       readl(ras->regs + CXLA_RAS_UE_SEVERITY),
		       ras->recoveries, ras->last_recovery);
	mutex_unlock(&ras->lock);
	return n;
}
static DEVICE_ATTR_RO(cxl_ras);

/* sysfs: "UE_MASK CE_MASK" (hex or decimal): which errors are not signalled */
static ssize_t cxl_ras_mask_store(struct device *dev,
				  struct device_attribute *attr,
				  const char *buf, size_t count)
{
	struct cxla_ras *ras = to_cxla_dev(dev)->ras;
	u32 ue, ce;

	if (!ras)
		return -ENODEV;
	if (sscanf(buf, "%i %i", &ue, &ce) != 2 || ue & ~CXLA_RAS_UE_BITS ||
	    ce & ~CXLA_RAS_CE_BITS)
		return -EINVAL;
	mutex_lock(&ras->lock);
	writel(ue, ras->regs + CXLA_RAS_UE_MASK);
	writel(ce, ras->regs + CXLA_RAS_CE_MASK);
	mutex_unlock(&ras->lock);
	return count;
}

static ssize_t cxl_ras_mask_show(struct device *dev,
				 struct device_attribute *attr, char *buf)
{
	struct cxla_ras *ras = to_cxla_dev(dev)->ras;

	if (!ras)
		return sysfs_emit(buf, "none\n");
	return sysfs_emit(buf, "%#x %#x\n", readl(ras->regs + CXLA_RAS_UE_MASK),
			  readl(ras->regs + CXLA_RAS_CE_MASK));
}
static DEVICE_ATTR_RW(cxl_ras_mask);

static struct attribute *cxla_ras_attrs[] = {
	&dev_attr_cxl_ras.attr,
	&dev_attr_cxl_ras_mask.attr,
	NULL,
};

const struct attribute_group cxla_ras_group = {
	.attrs = cxla_ras_attrs,
};
