/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: the sysfs attributes of a device: cxla_groups (sysfs.c) and
 * the groups of the parts it gathers.
 */
#ifndef CXL_ACCEL_SYSFS_H
#define CXL_ACCEL_SYSFS_H

#include <linux/sysfs.h>

extern const struct attribute_group *cxla_groups[];

extern const struct attribute_group cxla_dmabuf_group;	/* dmabuf.c */
extern const struct attribute_group cxla_poison_group;	/* poison.c */
extern const struct attribute_group cxla_mig_group;	/* migrate.c */
extern const struct attribute_group cxla_cxl_group;	/* cxl.c */
extern const struct attribute_group cxla_ras_group;	/* ras.c */

#endif /* CXL_ACCEL_SYSFS_H */
