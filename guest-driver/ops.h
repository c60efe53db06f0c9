/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: the data commands of the device (ops.c: COPY, FILL, CHECKSUM,
 * ATOMIC) and the pinning of user pages for them.
 */
#ifndef CXL_ACCEL_OPS_H
#define CXL_ACCEL_OPS_H

#include <linux/compiler.h>

struct cxla_file;
struct cxla_pin;
struct cxla_req;
struct page;

long cxla_ioc_copy(struct cxla_file *cf, void __user *arg);
long cxla_ioc_fill(struct cxla_file *cf, void __user *arg);
long cxla_ioc_checksum(struct cxla_file *cf, void __user *arg);
long cxla_ioc_atomic(struct cxla_file *cf, void __user *arg);
void cxla_pin_release(struct cxla_pin *pin);
void cxla_req_release_operands(struct cxla_req *req);
int cxla_pin_user(unsigned long first, unsigned long npages,
		  unsigned int gup_flags, struct page **pages);

#endif /* CXL_ACCEL_OPS_H */
