/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: the character device, its files and mappings (cdev.c).
 */
#ifndef CXL_ACCEL_CDEV_H
#define CXL_ACCEL_CDEV_H

#include <linux/types.h>

#include "uapi/cxl_accel.h"

struct cxla_dev;
struct cxla_file;

int cxla_chrdev_init(void);
void cxla_chrdev_exit(void);
void cxla_cdev_init_dev(struct cxla_dev *cd);
int cxla_cdev_add(struct cxla_dev *cd);
void cxla_cdev_del(struct cxla_dev *cd);
struct cxla_dev *cxla_dev_get_by_index(unsigned int minor);
int cxla_identify(struct cxla_dev *cd, struct cxl_accel_identify *id,
		  bool intr);

#endif /* CXL_ACCEL_CDEV_H */
