/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: buffers exported as DMA-BUFs and DMA-BUFs imported as command
 * operands (dmabuf.c).
 */
#ifndef CXL_ACCEL_DMABUF_H
#define CXL_ACCEL_DMABUF_H

#include <linux/compiler.h>
#include <linux/types.h>

struct cxla_dev;
struct cxla_file;
struct cxla_import;
struct cxla_pin;
struct cxla_sge;

void cxla_dmabuf_init_dev(struct cxla_dev *cd);
void cxla_dmabuf_p2p_init(struct cxla_dev *cd);
void cxla_dmabuf_revoke_exports(struct cxla_dev *cd);
void cxla_dmabuf_detach_imports(struct cxla_dev *cd);
void cxla_dmabuf_file_init(struct cxla_file *cf);
void cxla_dmabuf_file_release(struct cxla_file *cf);
long cxla_ioc_export_dmabuf(struct cxla_file *cf, void __user *arg);
long cxla_ioc_import_dmabuf(struct cxla_file *cf, void __user *arg);
int cxla_import_free(struct cxla_file *cf, u32 handle);
int cxla_import_operand_get(struct cxla_file *cf, u32 handle, u64 addr,
			    u64 len, struct cxla_import **out);
void cxla_import_put(struct cxla_import *imp);
int cxla_import_sges(struct cxla_dev *cd, struct cxla_import *imp, u64 off,
		     u64 len, struct cxla_pin *pin, struct cxla_sge *sge,
		     unsigned int max);
void cxla_import_unpin(struct cxla_pin *pin);
void cxla_dmabuf_zap(struct cxla_dev *cd, u64 start, u64 end);

extern const struct attribute_group cxla_dmabuf_group;	/* sysfs */

#endif /* CXL_ACCEL_DMABUF_H */
