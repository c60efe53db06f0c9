/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: eviction of migrated pages back to RAM (evict.c): EVICT,
 * memory pressure, removal and unload; the address spaces that have pages
 * on a device.
 */
#ifndef CXL_ACCEL_EVICT_H
#define CXL_ACCEL_EVICT_H

#include <linux/compiler.h>

struct cxla_dev;
struct cxla_file;
struct cxla_mig;
struct mm_struct;

void cxla_mig_track_mm(struct cxla_mig *mig, struct mm_struct *mm);
void cxla_mig_forget_mms(struct cxla_mig *mig);
long cxla_ioc_evict(struct cxla_file *cf, void __user *arg);
int cxla_evict_device(struct cxla_dev *cd);
void cxla_mig_evict_all(struct cxla_dev *cd);
void cxla_mig_teardown(struct cxla_dev *cd);
void cxla_mig_final_shrink(struct cxla_dev *cd);

#endif /* CXL_ACCEL_EVICT_H */
