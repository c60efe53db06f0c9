/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: CXL RAS errors of a CXL endpoint (ras.c).
 */
#ifndef CXL_ACCEL_RAS_H
#define CXL_ACCEL_RAS_H

struct cxla_dev;

int cxla_ras_init(struct cxla_dev *cd);
void cxla_ras_stop(struct cxla_dev *cd);

extern const struct attribute_group cxla_ras_group;	/* sysfs */

#endif /* CXL_ACCEL_RAS_H */
