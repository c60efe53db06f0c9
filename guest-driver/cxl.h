/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: the device as a CXL Type-2 endpoint (cxl.c), where the kernel
 * has the Type-2 accelerator API (7.3: devm_cxl_probe_mem).
 */
#ifndef CXL_ACCEL_CXL_H
#define CXL_ACCEL_CXL_H

#include <linux/range.h>
#include <linux/sysfs.h>

struct cxla_dev;

/* the API in the headers (Kbuild) and a CXL core to link against */
#if defined(CXLA_HAVE_CXL_TYPE2) && IS_REACHABLE(CONFIG_CXL_BUS)
#define CXLA_CXL_TYPE2 1
#endif

#ifdef CXLA_CXL_TYPE2
int cxla_cxl_probe(struct cxla_dev *cd);
void cxla_cxl_exit(void);
#else
int cxla_cxl_probe(struct cxla_dev *cd);	/* says why not, once */
static inline void cxla_cxl_exit(void) { }
#endif

extern const struct attribute_group cxla_cxl_group;	/* sysfs */

/* A CXL Reset (clear: with Mem Clr), the driver quiesced around it */
int cxla_cxl_reset(struct cxla_dev *cd, bool clear);
void cxla_cxl_after_reset(struct cxla_dev *cd);

#endif /* CXL_ACCEL_CXL_H */
