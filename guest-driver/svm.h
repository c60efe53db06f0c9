/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: shared virtual memory (svm.c): the device works on a
 * process's own pages through HMM mirrors (SVM, SNAPSHOT, PIN_CHECKSUM).
 */
#ifndef CXL_ACCEL_SVM_H
#define CXL_ACCEL_SVM_H

#include <linux/compiler.h>

struct cxla_file;
struct hmm_range;
struct mm_struct;
struct mmu_interval_notifier;
struct mmu_interval_notifier_ops;
struct mutex;

int cxla_notifier_insert(struct mmu_interval_notifier *sub,
			 struct mm_struct *mm, unsigned long start,
			 unsigned long length,
			 const struct mmu_interval_notifier_ops *ops);
int cxla_hmm_fault_locked(struct hmm_range *range, struct mm_struct *mm,
			  struct mutex *lock, unsigned int timeout_ms);
long cxla_ioc_svm(struct cxla_file *cf, void __user *arg);
long cxla_ioc_snapshot(struct cxla_file *cf, void __user *arg);
long cxla_ioc_pin_checksum(struct cxla_file *cf, void __user *arg);
void cxla_svm_release(struct cxla_file *cf);

#endif /* CXL_ACCEL_SVM_H */
