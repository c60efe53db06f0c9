/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: the NUMA attach mode (numa.c): device memory is a CPU-less
 * NUMA node the kernel owns.
 */
#ifndef CXL_ACCEL_NUMA_H
#define CXL_ACCEL_NUMA_H

struct cxla_dev;

int cxla_numa_init(struct cxla_dev *cd);

#endif /* CXL_ACCEL_NUMA_H */
