/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: the platform-firmware stand-in for CXL functions (cxlfw.c):
 * host-bridge and endpoint decoders committed before the kernel's CXL core
 * enumerates, where the kernel has the Type-2 API (cxl.h).
 */
#ifndef CXL_ACCEL_CXLFW_H
#define CXL_ACCEL_CXLFW_H

#include "cxl.h"	/* CXLA_CXL_TYPE2 */

struct pci_dev;

#ifdef CXLA_CXL_TYPE2
void cxla_cxl_firmware(void);
int cxla_cxl_firmware_endpoint(struct pci_dev *pdev, u64 base);
#else
static inline void cxla_cxl_firmware(void) { }
static inline int cxla_cxl_firmware_endpoint(struct pci_dev *pdev, u64 base)
{
	return -EOPNOTSUPP;
}
#endif

#endif /* CXL_ACCEL_CXLFW_H */
