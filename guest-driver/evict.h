/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: eviction of migrated pages back to RAM (evict.c): EVICT,
 * memory pressure, removal and unload.
 */
#ifndef CXL_ACCEL_EVICT_H
#define CXL_ACCEL_EVICT_H

#include <linux/compiler.h>

struct cxla_dev;
struct cxla_file;
struct cxla_mig;
struct mm_struct;

long cxla_ioc_evict(struct cxla_file *cf, void __user *arg);
int cxla_evict_device(struct cxla_dev *cd);
void cxla_mig_evict_all(struct cxla_dev *cd);
void cxla_mig_pause(struct cxla_dev *cd);
void cxla_mig_teardown(struct cxla_dev *cd);

#endif /* CXL_ACCEL_EVICT_H */
