/* SPDX-License-Identifier: GPL-2.0 */
/*
 * cxl-accel: the kernel's test_hmm interface, /dev/hmm_dmirror*, on
 * cxl-accel devices (test_hmm.c).
 */
#ifndef CXL_ACCEL_TEST_HMM_H
#define CXL_ACCEL_TEST_HMM_H

int cxla_test_hmm_init(void);
void cxla_test_hmm_exit(void);

#endif /* CXL_ACCEL_TEST_HMM_H */
