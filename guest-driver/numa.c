// SPDX-License-Identifier: GPL-2.0
/*
 * cxl-accel: NUMA attach mode. Device memory is a CPU-less NUMA node of
 * guest RAM, there is no ivshmem function and no ZONE_DEVICE memory. The
 * kernel owns the pages (move_pages(), mbind()); the device is told about
 * them as plain guest-physical addresses. IDENTIFY says where the node's
 * memory is.
 */
#include <linux/delay.h>
#include <linux/mm.h>
#include <linux/nodemask.h>
#include <linux/virtio.h>

#include "cxl_accel.h"
#include "devmem.h"
#include "numa.h"
#include "pool.h"
#include "vq.h"

#define CXLA_NUMA_TRIES		100	/* x 20 ms until the device knows its memory */

/* Probe: find the node of device memory and register it. */
int cxla_numa_init(struct cxla_dev *cd)
{
	struct device *vdev = &cd->vdev->dev;
	struct cxla_identify id;
	unsigned long first, last;
	int tries, ret, nid;
	u64 gpa = 0;

	for (tries = 0; tries < CXLA_NUMA_TRIES; tries++) {
		ret = cxla_simple_cmd(cd, CXLA_OP_IDENTIFY, NULL, 0, &id,
				      sizeof(id), NULL, 0, false);
		if (ret)
			return ret;
		gpa = le64_to_cpu(id.devmem_gpa);
		if (gpa)
			break;
		msleep(20);
	}
	if (!gpa) {
		dev_err(vdev, "NUMA mode: the device does not know where its memory is\n");
		return -ENODEV;
	}
	first = PHYS_PFN(gpa);
	last = PHYS_PFN(gpa + cd->devmem_size - 1);
	if (!IS_ALIGNED(gpa, CXLA_DEVMEM_ALIGN) || !pfn_valid(first) ||
	    !pfn_valid(last)) {
		dev_err(vdev,
			"NUMA mode: device memory %#llx + %#llx is not guest RAM with struct pages (not onlined?)\n",
			gpa, cd->devmem_size);
		return -ENODEV;
	}
	nid = page_to_nid(pfn_to_page(first));
	if (page_to_nid(pfn_to_page(last)) != nid) {
		dev_err(vdev, "NUMA mode: device memory spans nodes %d and %d\n",
			nid, page_to_nid(pfn_to_page(last)));
		return -ENODEV;
	}
	if (node_state(nid, N_CPU))
		dev_warn(vdev, "NUMA mode: node %d of device memory has CPUs\n",
			 nid);
	cd->devmem_gpa = gpa;
	cxla_mig_register(cd, gpa, cd->devmem_size, false, nid);
	return 0;
}
