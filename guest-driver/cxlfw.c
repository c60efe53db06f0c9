// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: a stand-in for the platform firmware that QEMU does not have.
 *
 * On a real machine the BIOS programs the HDM decoders of every CXL host
 * bridge and Type-2 endpoint at boot, commits and locks them, and the
 * kernel's CXL core (7.3) only discovers the regions they describe: it does
 * not create a Type-2 region itself. QEMU's pxb-cxl host bridges and our
 * endpoints come out of reset with nothing committed, so before the first
 * device registers with the CXL core this does what firmware would, once
 * per boot and idempotently (a reload finds its own work committed and
 * locked): for each host bridge with cxl-accel functions below it, in bus
 * order, each function gets the next range of the host bridge's CXL window
 * (its ACPI CEDT CFMWS), as large as the function's CXL memory (its DVSEC
 * range size); the host bridge's decoder k (registers found through the
 * CEDT CHBS) and the function's decoder 0 (its component registers in
 * BAR2) are committed and locked on that range, the function's DVSEC range
 * base set and its memory enabled.
 */
#include <linux/acpi.h>
#include <linux/bitfield.h>
#include <linux/delay.h>
#include <linux/io.h>
#include <linux/pci.h>
#include <linux/slab.h>
#include <linux/sort.h>

#include "cxl_accel.h"
#include "cxlfw.h"

#ifdef CXLA_CXL_TYPE2

#define CXLA_PCI_DEVICE		(0x1040 + CXLA_VIRTIO_ID)
#define CXLA_CXL_VENDOR		0x1E98
#define CXLA_DVSEC_DEVICE	0
#define CXLA_COMPONENT_SIZE	SZ_64K

/* Component registers: the CXL.cache/mem capability array and HDM decoders */
#define CXLA_CM			0x1000
#define CXLA_CAP_HDM		5
#define CXLA_HDM_GLOBAL		0x04
#define CXLA_HDM_ENABLE		BIT(1)
#define CXLA_DEC(n, reg)	(0x10 + 0x20 * (n) + (reg))
#define CXLA_DEC_BASE_LO	0x00
#define CXLA_DEC_BASE_HI	0x04
#define CXLA_DEC_SIZE_LO	0x08
#define CXLA_DEC_SIZE_HI	0x0C
#define CXLA_DEC_CTRL		0x10
#define CXLA_DEC_TL_LO		0x14	/* target list (ports) or DPA skip (devices) */
#define CXLA_DEC_TL_HI		0x18
#define CXLA_DEC_LOCK		BIT(8)
#define CXLA_DEC_COMMIT		BIT(9)
#define CXLA_DEC_COMMITTED	BIT(10)
#define CXLA_DEC_ERR		BIT(11)

/* CXL Device DVSEC registers */
#define CXLA_DVSEC_CTRL		0x0C
#define CXLA_DVSEC_MEM_ENABLE	BIT(2)
#define CXLA_DVSEC_SIZE_HI	0x18
#define CXLA_DVSEC_SIZE_LO	0x1C
#define CXLA_DVSEC_BASE_HI	0x20
#define CXLA_DVSEC_BASE_LO	0x24

#define CXLA_GRANULE		SZ_256M

struct cxla_fw_fn {
	struct pci_dev *pdev;
	u32 uid;		/* its host bridge's ACPI _UID */
	u8 port;		/* its root port's number */
	u16 dvsec;
	u64 size;
};

/* The HDM decoder capability of a component register block */
static void __iomem *cxla_fw_hdm(void __iomem *block)
{
	u32 hdr = readl(block + CXLA_CM), e;
	unsigned int i, n = hdr >> 24;

	if ((hdr & 0xFFFF) != 1)
		return NULL;
	for (i = 1; i <= n && i < 64; i++) {
		e = readl(block + CXLA_CM + 4 * i);
		if ((e & 0xFFFF) == CXLA_CAP_HDM && (e >> 20))
			return block + CXLA_CM + (e >> 20);
	}
	return NULL;
}

/*
 * Commit decoder n on [base, base + size) with its target list (or DPA
 * skip) word tl, locked: 1 when it did, 0 when it was (an earlier load),
 * else an error.
 */
static int cxla_fw_commit(void __iomem *hdm, int n, u64 base, u64 size, u32 tl,
			  const char *what)
{
	u32 ctrl = readl(hdm + CXLA_DEC(n, CXLA_DEC_CTRL));
	u64 have_base, have_size;
	int i;

	if (ctrl & CXLA_DEC_COMMITTED) {
		have_base = (u64)readl(hdm + CXLA_DEC(n, CXLA_DEC_BASE_HI)) << 32 |
			    (readl(hdm + CXLA_DEC(n, CXLA_DEC_BASE_LO)) & 0xF0000000);
		have_size = (u64)readl(hdm + CXLA_DEC(n, CXLA_DEC_SIZE_HI)) << 32 |
			    (readl(hdm + CXLA_DEC(n, CXLA_DEC_SIZE_LO)) & 0xF0000000);
		if (have_base == base && have_size == size)
			return 0;	/* committed already */
		pr_warn("cxl_accel: %s decoder %d already maps %#llx+%#llx, not %#llx+%#llx\n",
			what, n, have_base, have_size, base, size);
		return -EBUSY;
	}
	/* 32-bit accesses only: QEMU's host bridge ignores wider ones */
	writel(lower_32_bits(base), hdm + CXLA_DEC(n, CXLA_DEC_BASE_LO));
	writel(upper_32_bits(base), hdm + CXLA_DEC(n, CXLA_DEC_BASE_HI));
	writel(lower_32_bits(size), hdm + CXLA_DEC(n, CXLA_DEC_SIZE_LO));
	writel(upper_32_bits(size), hdm + CXLA_DEC(n, CXLA_DEC_SIZE_HI));
	writel(tl, hdm + CXLA_DEC(n, CXLA_DEC_TL_LO));
	writel(0, hdm + CXLA_DEC(n, CXLA_DEC_TL_HI));
	writel(CXLA_DEC_LOCK | CXLA_DEC_COMMIT, hdm + CXLA_DEC(n, CXLA_DEC_CTRL));
	for (i = 0; i < 20; i++) {
		ctrl = readl(hdm + CXLA_DEC(n, CXLA_DEC_CTRL));
		if (ctrl & (CXLA_DEC_COMMITTED | CXLA_DEC_ERR))
			break;
		usleep_range(1000, 2000);
	}
	if (!(ctrl & CXLA_DEC_COMMITTED)) {
		pr_warn("cxl_accel: %s decoder %d did not commit %#llx+%#llx (control %#x)\n",
			what, n, base, size, ctrl);
		return -EIO;
	}
	writel(readl(hdm + CXLA_HDM_GLOBAL) | CXLA_HDM_ENABLE, hdm + CXLA_HDM_GLOBAL);
	return 1;
}

/* The CEDT, in which firmware describes host bridges and windows */
static struct acpi_table_header *cxla_fw_cedt(void)
{
	struct acpi_table_header *t;

	if (ACPI_FAILURE(acpi_get_table(ACPI_SIG_CEDT, 0, &t)))
		return NULL;
	return t;
}

/* The CEDT's next structure after h (NULL: the first), NULL at the end */
static struct acpi_cedt_header *cxla_fw_next(struct acpi_table_header *t,
					     struct acpi_cedt_header *h)
{
	u8 *end = (u8 *)t + t->length, *p;

	p = h ? (u8 *)h + h->length : (u8 *)t + sizeof(struct acpi_table_cedt);
	h = (void *)p;
	if (p + sizeof(*h) > end || h->length < sizeof(*h) || p + h->length > end)
		return NULL;
	return h;
}

/* The component registers of host bridge uid (CHBS) */
static u64 cxla_fw_chbs(struct acpi_table_header *t, u32 uid)
{
	struct acpi_cedt_header *h = NULL;
	struct acpi_cedt_chbs *c;

	while ((h = cxla_fw_next(t, h))) {
		c = (void *)h;
		if (h->type == ACPI_CEDT_TYPE_CHBS && h->length >= sizeof(*c) &&
		    c->uid == uid)
			return c->base;
	}
	return 0;
}

/* The one-way window whose target is host bridge uid (CFMWS) */
static u64 cxla_fw_window(struct acpi_table_header *t, u32 uid, u64 *size)
{
	struct acpi_cedt_header *h = NULL;
	struct acpi_cedt_cfmws *w;

	while ((h = cxla_fw_next(t, h))) {
		w = (void *)h;
		/* interleave_ways is encoded: 0 is one way */
		if (h->type != ACPI_CEDT_TYPE_CFMWS ||
		    h->length < sizeof(*w) + sizeof(u32) || w->interleave_ways)
			continue;
		if (w->interleave_targets[0] == uid) {
			*size = w->window_size;
			return w->base_hpa;
		}
	}
	return 0;
}

static int cxla_fw_cmp(const void *a, const void *b)
{
	const struct cxla_fw_fn *x = a, *y = b;

	if (x->uid != y->uid)
		return x->uid < y->uid ? -1 : 1;
	if (x->pdev->bus->number != y->pdev->bus->number)
		return x->pdev->bus->number < y->pdev->bus->number ? -1 : 1;
	return x->pdev->devfn - y->pdev->devfn;
}

/* A cxl-accel function that is a CXL endpoint: where it is, how large */
static bool cxla_fw_describe(struct pci_dev *pdev, struct cxla_fw_fn *f)
{
	struct pci_host_bridge *bridge = pci_find_host_bridge(pdev->bus);
	struct acpi_device *adev = bridge ? ACPI_COMPANION(&bridge->dev) : NULL;
	struct pci_dev *rp = pcie_find_root_port(pdev);
	const char *uid = adev ? acpi_device_uid(adev) : NULL;
	u32 lo, hi, lnkcap;

	if (!pcie_is_cxl(pdev) || !rp || !uid || kstrtou32(uid, 0, &f->uid))
		return false;
	f->dvsec = pci_find_dvsec_capability(pdev, CXLA_CXL_VENDOR,
					     CXLA_DVSEC_DEVICE);
	if (!f->dvsec)
		return false;
	pci_read_config_dword(pdev, f->dvsec + CXLA_DVSEC_SIZE_HI, &hi);
	pci_read_config_dword(pdev, f->dvsec + CXLA_DVSEC_SIZE_LO, &lo);
	f->size = (u64)hi << 32 | (lo & 0xF0000000);
	pcie_capability_read_dword(rp, PCI_EXP_LNKCAP, &lnkcap);
	f->port = FIELD_GET(PCI_EXP_LNKCAP_PN, lnkcap);
	f->pdev = pdev;
	return f->size && pci_resource_len(pdev, 2) >= CXLA_COMPONENT_SIZE;
}

/*
 * The function's own part: decoder 0, DVSEC range and memory enable; as
 * cxla_fw_commit() returns
 */
static int cxla_fw_endpoint(struct cxla_fw_fn *f, u64 base)
{
	void __iomem *block, *hdm;
	u16 ctrl;
	int ret;

	block = ioremap(pci_resource_start(f->pdev, 2), CXLA_COMPONENT_SIZE);
	if (!block)
		return -ENOMEM;
	hdm = cxla_fw_hdm(block);
	ret = hdm ? cxla_fw_commit(hdm, 0, base, f->size, 0, pci_name(f->pdev)) :
		    -ENODEV;
	iounmap(block);
	if (ret < 0)
		return ret;
	pci_write_config_dword(f->pdev, f->dvsec + CXLA_DVSEC_BASE_HI,
			       upper_32_bits(base));
	pci_write_config_dword(f->pdev, f->dvsec + CXLA_DVSEC_BASE_LO,
			       lower_32_bits(base) & 0xF0000000);
	pci_read_config_word(f->pdev, f->dvsec + CXLA_DVSEC_CTRL, &ctrl);
	pci_write_config_word(f->pdev, f->dvsec + CXLA_DVSEC_CTRL,
			      ctrl | CXLA_DVSEC_MEM_ENABLE);
	return ret;
}

/*
 * After a reset that took the endpoint's CXL.mem state, what firmware would
 * do on such a reset: decoder 0 (a conventional reset uncommits it), the
 * DVSEC range and Mem_Enable (any reset but FLR clears them unless locked)
 * at base again. 1 when the decoder had to be committed again, 0 when it
 * was there, else an error.
 */
int cxla_cxl_firmware_endpoint(struct pci_dev *pdev, u64 base)
{
	struct cxla_fw_fn f = { };
	u16 ctrl;
	int ret;

	if (!cxla_fw_describe(pdev, &f))
		return -ENODEV;
	pci_read_config_word(pdev, f.dvsec + CXLA_DVSEC_CTRL, &ctrl);
	if (ctrl & CXLA_DVSEC_MEM_ENABLE)
		return 0;
	ret = cxla_fw_endpoint(&f, base);
	if (ret > 0)
		pr_info("cxl_accel: %s: HDM decoder 0 committed again for %#llx after a reset\n",
			pci_name(pdev), base);
	return ret;
}

/* One host bridge's functions fn[0..n): its decoders 0..n-1, in bus order */
static void cxla_fw_host_bridge(struct acpi_table_header *cedt,
				struct cxla_fw_fn *fn, unsigned int n)
{
	u64 chbs = cxla_fw_chbs(cedt, fn[0].uid), wsize = 0, base;
	u64 window = cxla_fw_window(cedt, fn[0].uid, &wsize);
	void __iomem *block, *hdm;
	unsigned int i;
	char what[32];

	if (!chbs || !window) {
		pr_warn("cxl_accel: host bridge %u has no CXL window or registers in the CEDT\n",
			fn[0].uid);
		return;
	}
	block = ioremap(chbs, CXLA_COMPONENT_SIZE);
	if (!block)
		return;
	hdm = cxla_fw_hdm(block);
	if (!hdm) {
		pr_warn("cxl_accel: host bridge %u has no HDM decoders (QEMU: pxb-cxl needs hdm_for_passthrough=on)\n",
			fn[0].uid);
		goto out;
	}
	snprintf(what, sizeof(what), "host bridge %u", fn[0].uid);
	base = window;
	for (i = 0; i < n && i < 4; i++) {
		if (base + fn[i].size > window + wsize) {
			pr_warn("cxl_accel: the CXL window of host bridge %u is full\n",
				fn[i].uid);
			break;
		}
		if (cxla_fw_commit(hdm, i, base, fn[i].size, fn[i].port, what) < 0 ||
		    cxla_fw_endpoint(&fn[i], base) < 0)
			break;
		pr_info("cxl_accel: %s: HDM decoders committed for %#llx-%#llx (host bridge %u, root port %u)\n",
			pci_name(fn[i].pdev), base, base + fn[i].size - 1,
			fn[i].uid, fn[i].port);
		base += fn[i].size;
	}
out:
	iounmap(block);
}

void cxla_cxl_firmware(void)
{
	struct acpi_table_header *cedt;
	struct pci_dev *pdev = NULL;
	struct cxla_fw_fn *fn;
	unsigned int n = 0, i, first;

	fn = kcalloc(CXLA_MAX_DEVICES, sizeof(*fn), GFP_KERNEL);
	if (!fn)
		return;
	while ((pdev = pci_get_device(PCI_VENDOR_ID_REDHAT_QUMRANET,
				      CXLA_PCI_DEVICE, pdev))) {
		if (n < CXLA_MAX_DEVICES && cxla_fw_describe(pdev, &fn[n]))
			fn[n++].pdev = pci_dev_get(pdev);
	}
	if (!n)
		goto out;
	cedt = cxla_fw_cedt();
	if (!cedt) {
		pr_warn("cxl_accel: CXL functions but no ACPI CEDT: no CXL regions\n");
		goto out;
	}
	sort(fn, n, sizeof(*fn), cxla_fw_cmp, NULL);
	for (first = 0, i = 1; i <= n; i++) {
		if (i < n && fn[i].uid == fn[first].uid)
			continue;
		cxla_fw_host_bridge(cedt, fn + first, i - first);
		first = i;
	}
	acpi_put_table(cedt);
out:
	for (i = 0; i < n; i++)
		pci_dev_put(fn[i].pdev);
	kfree(fn);
}

#endif /* CXLA_CXL_TYPE2 */
