/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: what every part of the driver stands on (core.c): the module's
 * workqueue and command timeout, deferred work counted per device.
 */
#ifndef CXL_ACCEL_CORE_H
#define CXL_ACCEL_CORE_H

#include <linux/types.h>

struct cxla_dev;
struct delayed_work;
struct work_struct;
struct workqueue_struct;

extern unsigned int cxla_cmd_timeout_ms;	/* module parameter cmd_timeout_ms */
extern struct workqueue_struct *cxla_wq;	/* deferred work */

int cxla_core_init(void);
void cxla_core_exit(void);
unsigned long cxla_timeout_jiffies(unsigned int timeout_ms);
void cxla_defer(struct cxla_dev *cd, struct work_struct *work);
void cxla_defer_delayed(struct cxla_dev *cd, struct delayed_work *dwork,
			unsigned long delay);
void cxla_deferred_done(struct cxla_dev *cd);
int cxla_deferred_wait(struct cxla_dev *cd, bool intr);
int cxla_reset_wait(struct cxla_dev *cd, const bool *held);

#endif /* CXL_ACCEL_CORE_H */
