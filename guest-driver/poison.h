/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: poisoned device memory (poison.c).
 */
#ifndef CXL_ACCEL_POISON_H
#define CXL_ACCEL_POISON_H

#include <linux/types.h>

struct cxla_dev;

int cxla_poison_init(struct cxla_dev *cd);
void cxla_poison_stop(struct cxla_dev *cd);
void cxla_poison_free(struct cxla_dev *cd);

extern const struct attribute_group cxla_poison_group;	/* sysfs */

#endif /* CXL_ACCEL_POISON_H */
