/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: the sysfs attributes of a device (sysfs.c): its own and the
 * groups of the parts below, gathered.
 */
#ifndef CXL_ACCEL_SYSFS_H
#define CXL_ACCEL_SYSFS_H

#include <linux/sysfs.h>

extern const struct attribute_group *cxla_groups[];


#endif /* CXL_ACCEL_SYSFS_H */
